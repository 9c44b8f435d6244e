"""Domain-steered generation, effective example counts and inconclusive verdicts; open
replica policies; capabilities as connectors have them."""

import copy
import json
from pathlib import Path
from types import MappingProxyType

import pytest

from kvspec.cli import main
from kvspec.conformance import Adapter, AdapterError, Domain
from kvspec.conformance.adapter import check_adapter, provided_capabilities
from kvspec.conformance.adapter.protocols import (
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    TopologyProtocol,
)
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import (
    FAILED,
    INCONCLUSIVE,
    MIN_EFFECTIVE_EXAMPLES,
    NOT_PROVIDED,
    PASSED,
    get_check,
    run_check,
    run_suite,
)
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import ReplicaChoice
from kvspec.topology.stage import StageLayout

NARROW = Domain(pp_sizes=(1,), dtypes=("float32", "float16", "bfloat16"))
"""A connector without pipeline parallelism or fp8 scales (like examples/field_adapter.py)."""


pytestmark = pytest.mark.usefixtures("ci_profile")  # the checks run under ci


class Recording(ReferenceAdapter):
    """The reference, recording every transfer case its routing and receiver see."""

    def __init__(self) -> None:
        self.seen: list = []

    def sources(self, case, dst):
        self.seen.append(case)
        return super().sources(case, dst)

    def receiver_combine(self, case, dst, shipments):
        self.seen.append(case)
        return super().receiver_combine(case, dst, shipments)


class NarrowDomain(Recording):
    """Declares its domain as data: no PP, no fp8."""

    domain = NARROW


class NarrowSupports(Recording):
    """The same implementation, its domain told only through supports()."""

    def supports(self, case) -> bool:
        return NARROW.holds(case)


CHECKS = ("PLAN-2/exact-cover", "RESHARD-2/round-trip", "RESHARD-3/refuses-wrong-shipments")


@pytest.mark.parametrize("check_id", CHECKS)
def test_a_narrow_domain_gets_its_examples_from_inside_it(check_id: str) -> None:
    adapter = NarrowDomain()
    result = run_check(get_check(check_id), adapter)
    assert result.verdict == PASSED
    inside = [c for c in adapter.seen if NARROW.holds(c)]
    assert adapter.seen and len(inside) == len(adapter.seen)
    assert result.outside_domain <= len(get_check(check_id).examples)  # pins only
    generated = result.tried - len(get_check(check_id).examples)
    assert result.effective >= generated >= MIN_EFFECTIVE_EXAMPLES


@pytest.mark.parametrize("check_id", CHECKS)
def test_a_domain_told_only_by_supports_is_under_sampled(check_id: str) -> None:
    domain_steered = run_check(get_check(check_id), NarrowDomain())
    filtered = run_check(get_check(check_id), NarrowSupports())
    assert filtered.effective < MIN_EFFECTIVE_EXAMPLES <= domain_steered.effective
    assert filtered.verdict == INCONCLUSIVE
    assert f"only {filtered.effective} effective example(s)" in filtered.reason


def test_inconclusive_is_reported_and_exits_3(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    code = main(
        [
            "conform",
            "tests.suite.test_domain:NarrowSupports",
            "--clause",
            "PLAN-2",
            "--profile",
            "ci",
            "--quiet",
            "--json",
            str(out),
        ]
    )
    assert code == 3
    text = capsys.readouterr().out
    assert "PLAN-2/exact-cover" in text and "inconclusive" in text
    report = json.loads(out.read_text())
    [result] = report["results"]
    assert result["verdict"] == INCONCLUSIVE and report["summary"][INCONCLUSIVE] == 1
    assert result["effective_examples"] < MIN_EFFECTIVE_EXAMPLES
    # The same implementation with its domain declared as data is conclusive.
    assert (
        main(["conform", "tests.suite.test_domain:NarrowDomain", "--clause", "PLAN-2", "--quiet"])
        == 0
    )


def test_a_small_domain_covered_whole_is_conclusive() -> None:
    class OneDtype(ReferenceAdapter):
        domain = Domain(dtypes=("float16",), attention=("mha",))

    result = run_check(get_check("DTYPE-1/accepts-allowed"), OneDtype())
    assert result.verdict == PASSED and result.effective == 1  # the whole domain, once


def test_checks_outside_the_domain_are_not_provided() -> None:
    class NoMla(ReferenceAdapter):
        domain = Domain(attention=("mha",), pp_sizes=(1,), dtypes=("bfloat16",))

    patterns = ["DTYPE-3", "MODEL-2/mla-latent", "LAYER-1/default-partition"]
    verdicts = {r.check.id: r for r in run_suite(NoMla(), patterns=patterns).results}
    assert {c: r.verdict for c, r in verdicts.items()} == {c: NOT_PROVIDED for c in verdicts}
    assert "no fp8" in verdicts["DTYPE-3/scales-travel"].reason
    assert "no MLA" in verdicts["MODEL-2/mla-latent"].reason
    assert "no pipeline" in verdicts["LAYER-1/default-partition"].reason


# -- open replica policies [PLAN-4] ------------------------------------------------------


def by_receiver(choice: ReplicaChoice) -> int:
    """vLLM-style: spread replicas by the receiver's TP rank."""
    return choice.replicas[choice.receiver_tp_rank % len(choice.replicas)]


class FieldPolicy(ReferenceAdapter):
    """The reference routing under a policy of its own, declared as a rule."""

    policies = ("by_receiver",)
    policy_rules = MappingProxyType({"by_receiver": by_receiver})


class FieldPolicyOffTheRule(FieldPolicy):
    """Declares the rule but routes every replicated head from the last replica."""

    def sources(self, case, dst):
        plan = case.plan(lambda c: c.replicas[-1])
        return plan.sources_of(dst)


def test_a_declared_policy_is_checked_against_plan_2_3_and_determinism() -> None:
    report = run_suite(FieldPolicy(), patterns=["PLAN-2", "PLAN-3", "PLAN-4"])
    verdicts = {r.check.id: r.verdict for r in report.results}
    assert verdicts == {
        "PLAN-2/exact-cover": PASSED,
        "PLAN-3/inverse": PASSED,
        "PLAN-4/deterministic": PASSED,
        "PLAN-4/named-policy": PASSED,
        "PLAN-4/refuses-unknown-policy": PASSED,
    }
    off = run_check(get_check("PLAN-4/named-policy"), FieldPolicyOffTheRule())
    assert off.verdict == FAILED and "[PLAN-4.5]" in off.reason
    assert run_check(get_check("RESHARD-2/round-trip"), FieldPolicy()).verdict == PASSED


def test_a_rule_that_picks_no_replica_fails_plan_4() -> None:
    class Nowhere(FieldPolicy):
        policy_rules = MappingProxyType({"by_receiver": lambda c: c.replicas.stop})

    result = run_check(get_check("PLAN-4/named-policy"), Nowhere())
    assert (
        result.verdict == FAILED
        and "only TP ranks" in result.reason
        and "[PLAN-4.5]" in result.reason
    )


def test_undeclared_policies_and_shadowing_rules_are_refused() -> None:
    class Undeclared(ReferenceAdapter):
        policies = ("by_receiver",)

    class Shadowing(ReferenceAdapter):
        policy_rules = MappingProxyType({"lowest": by_receiver})

    with pytest.raises(AdapterError, match="neither spec policies"):
        check_adapter(Undeclared(), where="Undeclared")
    with pytest.raises(AdapterError, match="policy_rules must map new names"):
        check_adapter(Shadowing(), where="Shadowing")


# -- capabilities ----------------------------------------------------------------------


REFUSALS = {"sizes", "partitions", "topology", "models", "agreement"}


def test_refusal_is_five_capabilities_and_the_old_validate_provides_all() -> None:
    """An engine refuses sizes, partitions, the stage pair, model facts and the stages'
    agreement in different places; an adapter provides only those its code makes."""

    class TopologyOnly(Adapter, TopologyProtocol):
        def validate_topology(self, config):
            pass

    with pytest.deprecated_call(match="by its methods alone"):

        class OldStyle(Adapter):  # before the protocols: one validate for all five
            def validate(self, config):
                pass

    assert provided_capabilities(TopologyOnly()) & REFUSALS == {"topology"}
    assert provided_capabilities(OldStyle()) & REFUSALS == REFUSALS
    verdicts = {
        r.check.id: r.verdict
        for r in run_suite(
            TopologyOnly(), patterns=["MODEL-3", "STAGE-1/refuses-*", "HEAD", "LAYER"]
        ).results
    }
    assert verdicts and set(verdicts.values()) == {NOT_PROVIDED}, verdicts


def test_a_validator_that_refuses_everything_fails_its_accept_check() -> None:
    """Each refusal capability has its own accept check: refusing every configuration
    would otherwise pass every refusal check of the capability [PLAN-1.2]."""

    class RefusesEverything(ReferenceAdapter):
        """Refuses every configuration, naming all of its values (so a refusal check,
        which asks that the message name what is wrong, is satisfied by the refusal)."""

        def validate_sizes(self, config):
            raise ValueError(f"refused: {json.dumps(config)}")

        def validate_agreement(self, config):
            raise ValueError(f"refused: {json.dumps(config)}")

    verdicts = {
        r.check.id: r.verdict
        for r in run_suite(
            RefusesEverything(), patterns=["STAGE-1/refuses-*", "MODEL-3", "PLAN-1"]
        ).results
    }
    assert verdicts["STAGE-1/refuses-rank-out-of-range"] == PASSED
    assert verdicts["MODEL-3/refuses-mismatched-models"] == PASSED
    assert verdicts["PLAN-1/sizes-accept-valid"] == FAILED
    assert verdicts["PLAN-1/agreement-accepts-equal-models"] == FAILED
    assert verdicts["PLAN-1/accepts-valid"] == PASSED


def test_a_negative_example_never_changes_a_fact_the_domain_pins() -> None:
    """Without PP in its domain an implementation has no way to be handed a PP of 0, so
    STAGE-1 asks it about TP alone; with PP in the domain it is asked about both."""

    class IgnoresPipeline(ReferenceAdapter):
        """Its API has no PP: whatever PP the configuration says is never read."""

        def validate_sizes(self, config):
            config = copy.deepcopy(config)
            for side in ("source", "target"):
                config[side] = {**config[side], "pp": 1, "layer_partition": None}
            super().validate_sizes(config)

    class NoPipeline(IgnoresPipeline):
        domain = Domain(pp_sizes=(1,), explicit_partitions=False)

    pattern = ["STAGE-1/refuses-empty-stage"]
    assert run_suite(NoPipeline(), patterns=pattern).results[0].verdict == PASSED
    assert run_suite(IgnoresPipeline(), patterns=pattern).results[0].verdict == FAILED


def test_repeated_deliveries_are_asked_only_where_they_can_happen() -> None:
    """A receiver that keeps one copy of each shipment (as a store keyed by name does)
    fails RESHARD-3 where repeats can arrive, and passes where its domain says none can."""

    class KeepsOneCopy(ReferenceAdapter):
        def receiver_combine(self, case, dst, shipments):
            unique = {s.edge.src: s for s in shipments}
            return super().receiver_combine(case, dst, list(unique.values()))

    class KeyedStore(KeepsOneCopy):
        domain = Domain(repeated_deliveries=False)

    pattern = ["RESHARD-3/refuses-wrong-shipments"]
    assert run_suite(KeepsOneCopy(), patterns=pattern).results[0].verdict == FAILED
    assert run_suite(KeyedStore(), patterns=pattern).results[0].verdict == PASSED


def test_the_marker_and_fp8_scales_are_capabilities_of_their_own() -> None:
    class PullConnector(Adapter, RoutingProtocol, SenderProtocol, ReceiverProtocol):
        """A receiver without a slice marker (it names no MarkerProtocol), for bfloat16
        caches only; the reference's methods do the work."""

        domain = Domain(dtypes=("bfloat16",))
        slicing_modes = ("sender",)
        plan = ReferenceAdapter.plan
        sources = ReferenceAdapter.sources
        targets = ReferenceAdapter.targets
        sender_transform = ReferenceAdapter.sender_transform
        receiver_combine = ReferenceAdapter.receiver_combine

    capabilities = provided_capabilities(PullConnector())
    assert "receiver" in capabilities and not {"marker", "fp8-scales"} & capabilities
    verdicts = {
        r.check.id: r.verdict
        for r in run_suite(
            PullConnector(), patterns=["SLICE-3", "DTYPE-3", "RESHARD-2/round-trip"]
        ).results
    }
    assert verdicts["RESHARD-2/round-trip"] == PASSED
    assert {v for c, v in verdicts.items() if c != "RESHARD-2/round-trip"} == {NOT_PROVIDED}
    assert "fp8-scales" in provided_capabilities(ReferenceAdapter())


def test_a_domain_refuses_what_the_spec_has_not() -> None:
    with pytest.raises(ValueError, match="do not divide"):
        Domain(tp_pairs=((3, 2),))
    with pytest.raises(ValueError, match="dtype"):
        Domain(dtypes=("int8",))
    with pytest.raises(ValueError, match="no dtype"):
        Domain(dtypes=("float8_e4m3fn",), scale_formats=())
    assert Domain(tp_pairs=((2, 1),)).pairs() == ((2, 1),)
    assert all(s == t for s, t in Domain(tp_ratios=(1,)).pairs())
    described = NARROW.describe()
    assert "pp_sizes=(1,)" in described and "float8" not in described and "tp_" not in described


def _case(source: StageLayout, target: StageLayout, heads: int = 2, **model) -> TransferCase:
    return TransferCase(source, target, ModelShape(2, heads, 2, **model))


@pytest.mark.parametrize(
    ("domain", "case", "why"),
    [
        (
            Domain(tp_pairs=((2, 1),)),
            _case(StageLayout(4), StageLayout(1), heads=4),
            "TP4 -> TP1 is not one of its TP pairs",
        ),
        (
            Domain(pp_sizes=(1,)),
            _case(StageLayout(2), StageLayout(1, pp=2)),
            "the target stage: PP2 is not among pp_sizes (1,)",
        ),
        (
            Domain(replicated_heads=False),
            _case(StageLayout(4), StageLayout(2)),
            "the source stage: 2 KV heads over TP4 are replicated, and replicated_heads is False",
        ),
        (
            Domain(attention=("mha",)),
            _case(StageLayout(2), StageLayout(1), heads=1, attention="mla"),
            "the source stage: mla attention is not among ('mha',)",
        ),
        (
            Domain(dtypes=("float16",)),
            _case(StageLayout(2), StageLayout(1)),
            "the source stage: bfloat16 is not among its dtypes ('float16',)",
        ),
        (
            Domain(),
            _case(StageLayout(2, dp=2), StageLayout(1)),
            "the source stage: DP2, CP1, DCP1 (contiguous) is not among dp_sizes (1,)",
        ),
    ],
    ids=["tp-pair", "pp", "replicated-heads", "attention", "dtype", "dp"],
)
def test_a_domain_says_what_puts_a_case_outside_it(domain, case, why) -> None:
    """Domain.outside names the first thing that puts a case outside (a replay reports it);
    holds is exactly its absence."""
    assert (domain.outside(case) or "").startswith(why)
    assert not domain.holds(case)
    inside = TransferCase(StageLayout(2), StageLayout(1), ModelShape(2, 2, 2))
    assert Domain().outside(inside) is None and Domain().holds(inside)
