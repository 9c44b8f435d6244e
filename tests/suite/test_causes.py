"""One bug, one headline: grouping failures by cause, and paste-ready reproductions
(:mod:`kvspec.conformance.causes`, issue 28 part 4)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import example as hypothesis_pin

from kvspec.conformance import causes, get_check, run_check, run_suite
from kvspec.conformance.checks import Context
from kvspec.conformance.families.routing.mutants import ReplicasMergedTwice
from kvspec.conformance.mutants import get_mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, CheckResult
from kvspec.conformance.tiers import TIERS
from kvspec.conformance.violation import Violation
from kvspec.core.clauses import all_clauses

MERGED_TWICE = get_mutant("ReplicasMergedTwice").spec

TP4_TP2 = {
    "source": {"tp": 4, "pp": 1, "layer_partition": None},
    "target": {"tp": 2, "pp": 1, "layer_partition": None},
    "model": {
        "num_layers": 2,
        "num_kv_heads": 2,
        "head_dim": 2,
        "attention": "mha",
        "dtype": "bfloat16",
        "scale_format": None,
    },
    "policy": "lowest",
}
MLA_CP = {
    "source": {"tp": 1, "pp": 1, "layer_partition": None},
    "target": {"tp": 2, "pp": 1, "layer_partition": None, "cp": 2, "cp_rule": "contiguous"},
    "model": {**TP4_TP2["model"], "attention": "mla", "num_kv_heads": 1},
    "policy": "lowest",
    "seq_len": 1,
}


def failed(check_id: str, example: object, reason: str, tier: str, obligation: str, **kw):
    """A FAILED result as the runner makes one (no adapter run)."""
    return CheckResult(
        get_check(check_id),
        FAILED,
        counterexample=example,
        reason=reason,
        tier=tier,
        obligation=obligation,
        **kw,
    )


def ids(cause: causes.Cause) -> list[str]:
    return [r.check.id for r in cause.results]


# -- the order of basicness -----------------------------------------------------------


def test_every_clause_has_exactly_one_stratum():
    entries = [e for _, members in causes.STRATA for e in members]
    assert len(entries) == len(set(entries)), "a family or clause named twice"
    clauses = all_clauses()
    families = {c.family for c in clauses.values()}
    assert [e for e in entries if e not in families and e not in clauses] == []
    unranked = [c for c in clauses if causes.stratum(c) == len(causes.STRATA)]
    assert unranked == []


def test_strata_put_routing_before_content_although_the_table_does_not():
    order = list(all_clauses())
    assert order.index("DTYPE-2") < order.index("PLAN-2")  # why the table is not enough
    assert causes.basicness("PLAN-2") < causes.basicness("DTYPE-2")
    assert causes.basicness("HEAD-2.1") < causes.basicness("PLAN-2.2")  # obligations too
    assert causes.basicness("PLAN-6") < causes.basicness("SLICE-1") < causes.basicness("PAGED-1")
    assert causes.basicness("PAGED-1") < causes.basicness("PAYLOAD-3") < causes.basicness("KEY-4")
    assert causes.stratum("DTYPE-1") < causes.stratum("DTYPE-3")  # a clause over its family


def test_tier_order_is_the_contracts():
    assert causes.TIER_ORDER == TIERS


def test_transfer_case_is_found_at_any_depth_and_compared_on_its_fields():
    example = {"case": TP4_TP2, "seq_len": 2, "seed": 7}
    assert causes.transfer_case(example) == {
        **TP4_TP2,
        "seq_len": None,
        "source_dp": 0,
        "target_dp": 0,
    }
    assert causes.transfer_case(TP4_TP2) == causes.transfer_case(example)
    assert causes.transfer_case([{"base": example}, 0]) == causes.transfer_case(example)
    assert causes.transfer_case({"tensors": example, "group": 1}) == causes.transfer_case(example)
    assert causes.transfer_case({"case": MLA_CP})["seq_len"] == 1  # the plan's length counts
    assert causes.transfer_case({"model": TP4_TP2["model"], "seed": 1}) is None
    assert causes.transfer_case(None) is None


# -- grouping -------------------------------------------------------------------------

ROUTING_MSG = (
    "TP4 -> TP2, ...: target rank 0 receives (head 0, layer 0) from source ranks [0, 1]; "
    "each (head, layer, token) must come from exactly one sender [PLAN-2.2]"
)
DERIVED_MSG = (
    "TP1 -> TP2 CP2 ...: routing lists source 0 for target 1: source rank 0 shares nothing "
    "with target rank 1 [PLAN-2] [PLAN-2.3]"
)


def test_same_counterexample_is_one_cause_under_the_most_basic_obligation():
    case = {"case": TP4_TP2, "seq_len": 2, "seed": 0}
    content = failed(
        "DTYPE-2/special-values", case, "NaN lost [DTYPE-2.1]", "corrupts", "DTYPE-2.1"
    )
    # a fact of the shipments stratum (RESHARD-1.1: a shard's layers and heads), not the
    # round trip RESHARD-2.1, an observation read after every fact (issue 43)
    routing = failed(
        "RESHARD-1/shard-shape", case, "wrong [RESHARD-1.1]", "corrupts", "RESHARD-1.1"
    )
    [cause] = causes.group([content, routing])
    assert cause.headline is routing  # shipments before payload content
    assert cause.consequences == (content,)
    assert cause.tier == "corrupts"
    assert cause.key.startswith("RESHARD-1.1 on ")


def test_same_transfer_case_with_other_request_data_is_one_cause():
    a = failed(
        "DTYPE-2/special-values",
        {"case": TP4_TP2, "seq_len": 2, "seed": 0},
        "x [DTYPE-2.1]",
        "corrupts",
        "DTYPE-2.1",
    )
    b = failed(
        "CHUNK-2/reassemble",
        {"case": TP4_TP2, "seq_len": 9, "seed": 3, "cuts": [4]},
        "y [CHUNK-2.1]",
        "corrupts",
        "CHUNK-2.1",
    )
    [cause] = causes.group([b, a])
    assert cause.headline is a  # DTYPE-2 and CHUNK-2: one stratum, one tier; table order
    assert cause.consequences == (b,)


def test_another_deployment_of_the_same_model_is_another_cause():
    other = {**TP4_TP2, "target": {"tp": 1, "pp": 1, "layer_partition": None}}
    a = failed("DTYPE-2/special-values", {"case": TP4_TP2, "seed": 0}, "x", "corrupts", "DTYPE-2.1")
    b = failed("DTYPE-2/special-values", {"case": other, "seed": 0}, "x", "corrupts", "DTYPE-2.1")
    policy = failed(
        "CHUNK-2/reassemble",
        {"case": {**TP4_TP2, "policy": "balanced"}, "seed": 0},
        "y",
        "corrupts",
        "CHUNK-2.1",
    )
    assert len(causes.group([a, b, policy])) == 3


def test_a_downstream_report_of_a_broken_rule_joins_that_rules_failures():
    routing = failed("PLAN-2/exact-cover", TP4_TP2, ROUTING_MSG, "corrupts", "PLAN-2.2")
    dtype = failed(
        "DTYPE-2/special-values", {"case": MLA_CP, "seed": 0}, DERIVED_MSG, "corrupts", "PLAN-2.3"
    )
    wire = failed(
        "WIRE-1/interoperate", {"case": MLA_CP, "seed": 1}, DERIVED_MSG, "corrupts", "PLAN-2.3"
    )
    [cause] = causes.group([dtype, wire, routing])
    assert cause.headline is routing  # the rule's own check, over those that only report it
    assert cause.consequences == (dtype, wire)  # in the order they came


def test_the_same_rule_failing_its_own_checks_on_two_deployments_is_two_causes():
    other = {**TP4_TP2, "source": {"tp": 8, "pp": 1, "layer_partition": None}}
    a = failed("PLAN-2/exact-cover", TP4_TP2, ROUTING_MSG, "corrupts", "PLAN-2.2")
    b = failed("PLAN-3/inverse", other, "pairs differ [PLAN-3.1]", "corrupts", "PLAN-3.1")
    assert [c.headline for c in causes.group([a, b])] == [a, b]


def test_a_message_that_cites_no_obligation_links_by_nothing_but_its_example():
    a = failed("PLAN-2/exact-cover", TP4_TP2, ROUTING_MSG, "corrupts", "PLAN-2.2")
    crash = failed(
        "DTYPE-2/special-values",
        {"case": MLA_CP, "seed": 0},
        "the implementation raised IndexError: list index out of range at x.py:3",
        "breaks",
        "PLAN-2.3",  # set from the check's covers, not cited
    )
    assert len(causes.group([a, crash])) == 2


def test_causes_come_most_severe_first_then_most_basic():
    refusal = failed(
        "PLAN-4/refuses-unknown-policy",
        {**TP4_TP2, "policy": "balance"},
        "accepted [PLAN-4.4]",
        "accepts-invalid",
        "PLAN-4.4",
    )
    content = failed(
        "DTYPE-2/special-values", {"case": MLA_CP}, "x [DTYPE-2.1]", "corrupts", "DTYPE-2.1"
    )
    differs = failed("PLAN-2/exact-cover", TP4_TP2, ROUTING_MSG, "differs", "PLAN-2.2")
    crash = failed(
        "KEY-4/send-equals-recv",
        {**TP4_TP2, "target": {"tp": 1, "pp": 1, "layer_partition": None}},
        "the implementation raised KeyError: 3",
        "breaks",
        "KEY-4.1",
    )
    got = causes.group([differs, refusal, crash, content])
    assert [c.headline for c in got] == [content, crash, refusal, differs]
    assert [c.tier for c in got] == ["corrupts", "breaks", "accepts-invalid", "differs"]


def test_a_cause_takes_its_most_severe_tier_and_its_most_reachable_failure():
    case = {"case": TP4_TP2, "seed": 0}
    head = failed(
        "PLAN-2/exact-cover",  # a routing fact (PLAN-5's edge bytes are an observation)
        case,
        "every replica sends [PLAN-2.2]",
        "differs",
        "PLAN-2.2",
        reachable_in_serving="no",
    )
    worse = failed(
        "DTYPE-2/special-values",
        case,
        "x [DTYPE-2.1]",
        "corrupts",
        "DTYPE-2.1",
        reachable_in_serving="unknown",
    )
    [cause] = causes.group([worse, head])
    assert cause.headline is head  # routing, although its tier is the mildest
    assert (cause.tier, cause.reachable_in_serving) == ("corrupts", "unknown")
    assert cause.to_dict()["consequences"] == ["DTYPE-2/special-values"]
    assert causes.group([head])[0].reachable_in_serving == "no"


def test_only_failures_are_grouped():
    passed = CheckResult(get_check("PLAN-2/exact-cover"), PASSED)
    assert causes.group([passed]) == []


def test_tier_and_obligation_are_derived_when_a_result_lacks_them():
    bare = CheckResult(
        get_check("PLAN-4/refuses-unknown-policy"), FAILED, reason="accepted [PLAN-4.4]"
    )
    assert (causes.violated(bare), causes.tier(bare)) == ("PLAN-4.4", "accepts-invalid")
    crash = CheckResult(
        get_check("PLAN-2/exact-cover"), FAILED, reason="the implementation raised KeyError: 1"
    )
    assert (causes.violated(crash), causes.tier(crash)) == ("PLAN-2.1", "breaks")


# -- reproductions --------------------------------------------------------------------


@pytest.fixture(scope="module")
def routing_failure() -> CheckResult:
    result = run_check(get_check("PLAN-2/exact-cover"), ReplicasMergedTwice(), profile="quick")
    assert result.verdict == FAILED, result.reason
    return result


def test_pytest_name_is_an_identifier():
    for check_id in ("PLAN-2/exact-cover", "WIRE-7/crc32c-checksums", "KEY-3/injective"):
        name = causes.pytest_name(CheckResult(get_check(check_id), FAILED))
        assert name.isidentifier() and name.startswith("test_") and name == name.lower()
    assert causes.pytest_name(CheckResult(get_check("PLAN-2/exact-cover"), FAILED)) == (
        "test_plan_2_exact_cover"
    )


def run_pytest(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_pytest_test_fails_against_the_bug_and_passes_once_fixed(routing_failure, tmp_path):
    against_bug = causes.pytest_test(MERGED_TWICE, routing_failure)
    ast.parse(against_bug)  # a module on its own
    (tmp_path / "bug").mkdir()
    bug = tmp_path / "bug" / "test_repro.py"
    bug.write_text(against_bug)
    run = run_pytest(bug)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout and "[PLAN-2.2]" in run.stdout, run.stdout

    (tmp_path / "fixed").mkdir()
    fixed = tmp_path / "fixed" / "test_repro.py"
    fixed.write_text(causes.pytest_test("reference", routing_failure))
    run = run_pytest(fixed)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout, run.stdout


def test_the_pytest_test_names_a_device_only_off_cpu(routing_failure):
    assert "device=" not in causes.pytest_test("reference", routing_failure)
    on_gpu = causes.pytest_test("reference", routing_failure, device="cuda:0")
    assert 'device="cuda:0"' in on_gpu
    ast.parse(on_gpu)


def test_the_pytest_test_is_already_formatted_as_ruff_would(routing_failure, tmp_path):
    """Pasted into a project that runs ``ruff format --check``, it needs no change."""
    pytest.importorskip("ruff", reason="ruff is a dev dependency (make test installs it)")
    for device in ("cpu", "cuda:0"):
        path = tmp_path / f"test_repro_{device.replace(':', '')}.py"
        path.write_text(causes.pytest_test(MERGED_TWICE, routing_failure, device=device))
        run = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--isolated", "--check", str(path)],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout + run.stderr + path.read_text()


def test_the_hypothesis_example_pins_the_counterexample(routing_failure):
    line = causes.hypothesis_example(routing_failure)
    assert line is not None and line.startswith("@example(")
    check = get_check(routing_failure.check.id)

    def pinned_test(adapter):
        pin = eval(line[1:], {"example": hypothesis_pin, "json": json})  # the decorator

        @settings(phases=[Phase.explicit], database=None)
        @pin
        @given(check.strategy(adapter))
        def replay(example):
            check.run(Context(adapter), example)

        return replay

    with pytest.raises(Violation, match=r"PLAN-2\.2"):
        pinned_test(ReplicasMergedTwice())()
    pinned_test(ReferenceAdapter())()
    assert causes.hypothesis_example(CheckResult(check, PASSED)) is None


def test_render_causes_shows_the_headline_its_reproductions_and_its_consequences():
    derived = failed(
        "DTYPE-2/special-values",
        {"case": MLA_CP, "seed": 0},
        DERIVED_MSG,
        "corrupts",
        "PLAN-2.3",
        reachable_in_serving="unknown",
        reachability_evidence="the adapter has no start-up validation",
    )
    routing = failed("PLAN-2/exact-cover", TP4_TP2, ROUTING_MSG, "corrupts", "PLAN-2.2")
    lines = causes.render_causes(MERGED_TWICE, causes.group([derived, routing]))
    text = "\n".join(lines)
    assert lines[1].startswith("cause 1 of 1: corrupts  PLAN-2/exact-cover  [PLAN-2.2]")
    assert "reachable in serving: unknown (the adapter has no start-up validation)" in lines[1]
    assert "  rule: PLAN-2 Exact cover: " in text
    assert (
        f"--check PLAN-2/exact-cover --replay '{json.dumps(TP4_TP2, separators=(',', ':'))}'"
        in text
    )
    assert "    def test_plan_2_exact_cover():" in text
    assert "  consequences (same cause): 1" in text
    assert lines[-1].startswith("    DTYPE-2/special-values  corrupts  [PLAN-2.3]: TP1 -> TP2")


def test_render_causes_shows_the_input_a_refusal_probe_wrongly_accepted():
    accepted = failed(
        "KEY-3/refuses-outside-domain",
        {"request_id": "req-1"},
        "the key of request id '' was accepted [KEY-3.1]",
        "accepts-invalid",
        "KEY-3.1",
        accepted_input={"request_id": ""},
    )
    text = "\n".join(causes.render_causes("reference", causes.group([accepted])))
    assert '  wrongly accepted: {"request_id": ""}' in text


# -- the motivating scenario ----------------------------------------------------------


@pytest.fixture(scope="module")
def merged_twice_report():
    return run_suite(ReplicasMergedTwice(), impl=MERGED_TWICE, profile="quick")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_planted_routing_bug_gets_one_headline(merged_twice_report):
    """A connector engineer plants "replicas merged twice": in clause order the report
    leads with model and dtype checks that only met the routing bug on their way; grouped,
    it leads with the routing rule, the rest as its consequences."""
    results = merged_twice_report.results
    failures = [r for r in results if r.verdict == FAILED]
    assert len(failures) > 8
    assert failures[0].check.clause != "PLAN-2"  # clause order buries the bug

    grouped = causes.group(results)
    first = grouped[0]
    assert first.headline.check.id == "PLAN-2/exact-cover"
    assert causes.violated(first.headline) == "PLAN-2.2"
    assert first.tier == "corrupts"
    consequences = {r.check.id for r in first.consequences}
    assert {"DTYPE-2/special-values", "PAYLOAD-3/merge", "RESHARD-2/round-trip"} <= consequences
    # one headline for the one bug among the tiers that fail an engine's build
    assert [c.headline.check.id for c in grouped if c.tier in ("corrupts", "breaks")] == [
        "PLAN-2/exact-cover"
    ]
    # every failure is shown exactly once
    shown = [r for c in grouped for r in c.results]
    assert sorted(id(r) for r in shown) == sorted(id(r) for r in failures)
    assert len(grouped) <= 2
