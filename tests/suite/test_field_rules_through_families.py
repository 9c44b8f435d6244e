"""An engine's declared replica rule reaches every family, hybrids included (issue 44):
the reference declaring each field rule of kvspec/topology/field_policies.py passes the
routing and hybrid families with no failure (before, 7 hybrid checks reported ``breaks`` on
the suite's own refusal of the rule's name), the group planner chooses as the rule says on
hand-worked deployments, and a hybrid planner that keeps kvspec's ``lowest`` is caught
[PLAN-4, GROUP-3, STATE-2]."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from kvspec.conformance.families.groups.replica_rule_mutants import (
    HybridPlannerChoosesLowest,
    ReplicatedStateFromLowestHolder,
)
from kvspec.conformance.input_coverage import HYBRID, draw_coverage, features_of
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.result import FAILED, PASSED
from kvspec.conformance.runner import run_suite, select_checks
from kvspec.conformance.tiers import BREAKS
from kvspec.topology.field_policies import FIELD_RULES, SGLANG
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import plan_state_reads

FAMILIES = ("PLAN", "GROUP", "STATE", "WINDOW", "LOCAL", "INDEX")
"""Routing and every family whose checks plan a hybrid under the case's policy: layer
groups, states, windows, chunks, the indexer (the other HYBRID families draw no policy)."""


def declaring(name: str, base: type[ReferenceAdapter] = ReferenceAdapter) -> ReferenceAdapter:
    """``base`` declaring the field rule ``name`` as its one policy."""
    adapter = type(
        f"Declares_{name.replace('-', '_')}",
        (base,),
        {"policies": (name,), "policy_rules": MappingProxyType({name: FIELD_RULES[name]})},
    )
    return adapter()


@pytest.fixture(scope="module")
def hybrid_checks():  # type: ignore[no-untyped-def]
    return select_checks(FAMILIES)


@pytest.mark.parametrize("name", sorted(FIELD_RULES))
def test_the_reference_declaring_each_field_rule_passes_every_hybrid_family(
    name: str, hybrid_checks
) -> None:  # type: ignore[no-untyped-def]
    report = run_suite(declaring(name), profile="quick", checks=hybrid_checks)
    failed = [(r.check.id, r.tier, r.reason[:200]) for r in report.results if r.verdict == FAILED]
    assert failed == []
    verdicts = {r.check.id: r.verdict for r in report.results}
    hybrid = [c for c in verdicts if c.split("-")[0] in HYBRID]
    # nothing turned away as outside the domain for its policy: every check ran
    assert {c: v for c, v in verdicts.items() if v != PASSED} == {}
    assert {"GROUP-3/bytes-per-group", "STATE-2/reads", "WINDOW-2/block-sizes-differ"} <= set(
        hybrid
    )


# -- the group planner chooses as the rule says (worked by hand from the rule text) ------

MAMBA2 = {
    "kind": "mamba2",
    "num_heads": 4,
    "head_dim": 1,
    "n_groups": 1,
    "d_state": 1,
    "conv_kernel": 2,
}
"""One group: with attention TP above 1, every rank holds a replica of B and C."""


def _hybrid(num_kv_heads: int) -> ModelShape:
    return ModelShape(2, num_kv_heads, 2, groups=(group_from_dict(MAMBA2),), layers=(0, 1))


def _senders(name: str | None, source: int, target: int, heads: int) -> dict[int, list[int]]:
    """Receiver -> its senders of the model's own attention (group 0) in a group plan."""
    policy, rule = ("lowest", None) if name is None else (name, FIELD_RULES[name])
    plan = plan_groups(
        StageLayout(source),
        StageLayout(target),
        _hybrid(heads),
        seq_len=4,
        policy=policy,
        rule=rule,
    )
    found: dict[int, list[int]] = {}
    for edge in plan.edges:
        if edge.group == 0:
            found.setdefault(edge.dst, []).append(edge.src)
    return found


@pytest.mark.parametrize("name", sorted(FIELD_RULES))
def test_equal_tp_with_one_head_each_receiver_reads_its_own_rank(name: str) -> None:
    """TP2 -> TP2, 1 KV head: SGLang reads ``engine_rank % attn_tp_size``; vLLM and
    TensorRT-LLM the one rank ``d * P // D`` = d; kvspec's lowest reads rank 0 for both."""
    assert _senders(name, 2, 2, 1) == {0: [0], 1: [1]}
    assert _senders(None, 2, 2, 1) == {0: [0], 1: [0]}


@pytest.mark.parametrize("name", sorted(FIELD_RULES))
def test_a_fan_in_reads_replicated_state_from_the_first_rank_of_its_window(name: str) -> None:
    """TP4 -> TP2, Mamba-2 with one group: B and C live on all 4 source ranks; receiver d's
    window is ranks ``2d .. 2d + 1`` (``range(rank * (P // D), ...)``, the first sending), so
    receiver 1 reads them from rank 2, where lowest reads rank 0 [STATE-2, PLAN-4]."""
    model = _hybrid(4)
    reads = plan_state_reads(
        StageLayout(4), StageLayout(2), model, 1, policy=name, rule=FIELD_RULES[name]
    )
    lowest = plan_state_reads(StageLayout(4), StageLayout(2), model, 1)
    for part in ("B", "C"):
        assert {r.src for r in reads if r.dst == 1 and r.part == part} == {2}
        assert {r.src for r in lowest if r.dst == 1 and r.part == part} == {0}
    # x is split by heads (one per source rank): the rule has nothing to choose
    assert {r.src for r in reads if r.dst == 1 and r.part == "x"} == {2, 3}


def test_a_rule_naming_no_holder_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"policy 'nowhere' chose source TP rank 9"):
        plan_state_reads(
            StageLayout(4), StageLayout(2), _hybrid(4), 1, policy="nowhere", rule=lambda c: 9
        )


def test_a_rule_needs_a_name_and_an_unknown_name_without_one_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        plan_groups(StageLayout(2), StageLayout(2), _hybrid(1), seq_len=4, policy="", rule=min)
    with pytest.raises(ValueError, match="policy must be one of 'lowest', 'balanced'"):
        plan_groups(StageLayout(2), StageLayout(2), _hybrid(1), seq_len=4, policy=SGLANG)


# -- a hybrid planner that ignores the declared rule is caught -----------------------------


@pytest.mark.parametrize("name", sorted(FIELD_RULES))
def test_a_hybrid_planner_keeping_lowest_is_caught_under_each_rule(name: str) -> None:
    checks = select_checks(["GROUP-3/bytes-per-group", "WINDOW-2/block-sizes-differ"])
    mutant = declaring(name, HybridPlannerChoosesLowest)
    report = run_suite(mutant, profile="quick", checks=checks, shrink=False)
    failed = {r.check.id: r for r in report.results if r.verdict == FAILED}
    assert set(failed) == {c.id for c in checks}
    # judged against the engine's own rule, not a crash on the suite's refusal of its name
    assert all(
        r.tier != BREAKS and "policy must be one of" not in r.reason for r in failed.values()
    )


@pytest.mark.parametrize("name", sorted(FIELD_RULES))
def test_state_reads_from_the_lowest_holder_are_caught_under_each_rule(name: str) -> None:
    """The bytes follow the rule, the state reads do not: the values are the same (every
    holder keeps the same replica), so only the sender tells [STATE-2.3]."""
    mutant = declaring(name, ReplicatedStateFromLowestHolder)
    checks = select_checks(["GROUP-3/bytes-per-group", "STATE-2/reads"])
    report = run_suite(mutant, profile="quick", checks=checks, shrink=False)
    verdicts = {r.check.id: (r.verdict, r.reason) for r in report.results}
    assert verdicts["GROUP-3/bytes-per-group"][0] == PASSED
    verdict, reason = verdicts["STATE-2/reads"]
    assert verdict == FAILED and "[STATE-2.3, PLAN-4]" in reason and repr(name) in reason


# -- the table counts a declared rule's hybrid draws ---------------------------------------


def test_the_hybrid_draws_are_made_under_the_declared_rule() -> None:
    checks = select_checks(["GROUP-3"])
    coverage = draw_coverage(declaring(SGLANG), profile="quick", checks=checks)
    assert coverage.counts["GROUP"][f"policy x hybrid: {SGLANG}"] > 0
    assert coverage.counts["GROUP"]["policy x hybrid: lowest"] == 0


def test_a_policy_on_a_hybrid_is_read_only_where_a_replica_can_be_chosen() -> None:
    hybrid = _hybrid(1).to_dict()
    uniform = ModelShape(2, 1, 2).to_dict()

    def case(source_tp: int, model: dict[str, object]) -> dict[str, object]:
        return {"source": {"tp": source_tp}, "target": {"tp": 2}, "model": model, "policy": SGLANG}

    assert f"policy x hybrid: {SGLANG}" in features_of({"case": case(2, hybrid)})
    assert not {f for f in features_of({"case": case(1, hybrid)}) if "hybrid" in f}  # one sender
    assert not {f for f in features_of({"case": case(2, uniform)}) if "hybrid" in f}


def test_a_policy_no_longer_drawn_on_hybrids_is_a_gap() -> None:
    class LowestOnly(ReferenceAdapter):
        policies = ("lowest",)

    coverage = draw_coverage(LowestOnly(), profile="ci", checks=select_checks(["GROUP-3"]))
    gaps = [f.name for f in coverage.gaps()]
    assert "policy x hybrid: balanced" in gaps and "policy x hybrid: lowest" not in gaps
