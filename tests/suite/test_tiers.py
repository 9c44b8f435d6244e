"""Consequence tiers (issue 28): derived from the violated obligation and what a check
observed, never typed by hand; serving reachability from the adapter's contract."""

from types import MappingProxyType

import pytest

from kvspec.conformance.adapter import Acceptance
from kvspec.conformance.families.routing.mutants import ReplicasMergedTwice
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import (
    FAILED,
    PASSED,
    deployment_of,
    get_check,
    run_check,
    serving_reachability,
)
from kvspec.conformance.tiers import (
    TIERS,
    default_fail_on,
    parse_tiers,
    tier_of,
    tier_of_obligation,
    violated_obligation,
)
from kvspec.conformance.violation import Violation
from kvspec.core.clauses import all_obligations
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from tests.suite.replicas import REPLICATED, EveryReplicaSends

OBLIGATIONS = all_obligations()


def test_tiers_most_severe_first() -> None:
    assert TIERS == ("corrupts", "breaks", "accepts-invalid", "differs")


@pytest.mark.parametrize(
    ("obligation", "tier"),
    [
        ("PLAN-2.2", "corrupts"),  # positive: a cell arriving twice
        ("KEY-3.1", "accepts-invalid"),  # negative: an empty request id must be refused
        ("PLAN-1.2", "breaks"),  # accepting a valid pair of layouts
        ("DTYPE-1.2", "breaks"),  # accepting each allowed dtype
        ("DTYPE-1.1", "accepts-invalid"),
    ],
)
def test_the_obligation_decides_the_tier(obligation: str, tier: str) -> None:
    assert tier_of_obligation(OBLIGATIONS[obligation]) == tier
    assert tier_of(Violation(f"it went wrong [{obligation}]"), OBLIGATIONS) == (tier, obligation)


def test_accepts_valid_obligations_are_declared_positive() -> None:
    marked = sorted(o.id for o in OBLIGATIONS.values() if o.accepts_valid)
    assert {"PLAN-1.2", "DTYPE-1.2"} <= set(marked)
    assert all(OBLIGATIONS[o].kind == "positive" for o in marked)


def test_an_explicit_tier_wins_and_a_crash_is_breaks() -> None:
    assert tier_of(Violation("two replicas [PLAN-2.2]", "differs"), OBLIGATIONS)[0] == "differs"
    assert tier_of(IndexError("list index out of range"), OBLIGATIONS, ("KEY-3.1",)) == (
        "breaks",
        "KEY-3.1",
    )
    with pytest.raises(ValueError, match="tier"):
        Violation("x", "bad-tier")


def test_the_first_cited_obligation_is_the_violated_one() -> None:
    message = "target 1 lists source 0 [PLAN-2.3]; see also [PLAN-2.2]"
    assert violated_obligation(message, OBLIGATIONS) == "PLAN-2.3"
    assert violated_obligation("no id here", OBLIGATIONS, ("KEY-3.2",)) == "KEY-3.2"
    assert violated_obligation("[NOPE-1.1]", OBLIGATIONS) is None


def test_parse_tiers() -> None:
    assert parse_tiers("all") == TIERS
    assert parse_tiers("breaks,corrupts") == ("corrupts", "breaks")  # in severity order
    with pytest.raises(ValueError, match=r"'fatal'.*corrupts, breaks, accepts-invalid, differs"):
        parse_tiers("corrupts,fatal")
    assert default_fail_on("reference") == TIERS
    assert default_fail_on("my_adapter:adapter") == ("corrupts", "breaks")


def test_every_replica_writing_is_differs_when_declared() -> None:
    result = run_check(get_check("PLAN-2/exact-cover"), EveryReplicaSends(), replay=REPLICATED)
    assert result.verdict == FAILED
    assert result.tier == "differs"
    assert result.obligation == "PLAN-2.2"
    assert "replicas_write='every'" in result.reason


def test_the_same_routing_undeclared_is_corrupts() -> None:
    """The planted bug of issue 28 (replicas merged twice) is this routing from an
    adapter that declares kvspec's exactly one sender: corrupts."""
    result = run_check(get_check("PLAN-2/exact-cover"), ReplicasMergedTwice(), replay=REPLICATED)
    assert ReplicasMergedTwice.replicas_write == "one"
    assert result.verdict == FAILED
    assert result.tier == "corrupts"


def test_an_extra_replica_shipment_accepted_is_differs_when_every_replica_writes() -> None:
    class CountsReplicas(ReferenceAdapter):
        """Routes as kvspec does, but its receiver takes a replica's identical shipment
        beyond its plan's and drops it, as a receiver counting every replica's writes
        does."""

        replicas_write = "every"

        def receiver_combine(self, case, dst, shipments):
            wanted = set(case.plan().sources_of(dst))
            return super().receiver_combine(
                case, dst, [s for s in shipments if s.edge.src in wanted]
            )

    # TP4 -> TP1: ranks 1 and 3 hold replicas of the heads ranks 0 and 2 send
    case = TransferCase(StageLayout(4), StageLayout(1), ModelShape(2, 2, 2)).to_dict()
    example = {"case": case, "seq_len": 3, "seed": 1}
    check = get_check("RESHARD-3/refuses-wrong-shipments")
    result = run_check(check, CountsReplicas(), replay=example)
    assert result.verdict == FAILED
    assert result.obligation == "RESHARD-3.2"
    assert result.tier == "differs"
    assert "a replica sending the identical bytes it holds" in result.reason


def test_deployment_of_any_example_shape() -> None:
    config = {
        "source": {"tp": 2},
        "target": {"tp": 1},
        "model": ModelShape(2, 2, 2).to_dict(),
    }
    assert deployment_of(config) == config
    assert deployment_of({"case": {**config, "policy": "lowest"}, "seed": 1}) == config
    assert deployment_of({"tensors": {"case": config}}) == config
    bad = {**config, "source": {"tp": 0}}
    assert deployment_of({"good": config, "bad": bad}) == bad  # the input refused, first
    assert deployment_of([{"case": config}, 3]) == config
    assert deployment_of({"request_id": "x", "from_stage": 0}) is None
    assert deployment_of(None) is None


class Serving(ReferenceAdapter):
    serving_never_produces = MappingProxyType(
        {"KEY-3.1": "request ids are engine-generated (uuid4)"}
    )

    def serving_accepts(self, config):
        tp = config["source"]["tp"]
        return Acceptance(tp <= 4, f"server args: tp {tp} {'ok' if tp <= 4 else '> GPUs'}")


def test_serving_reachability() -> None:
    adapter = Serving()
    assert serving_reachability(adapter, ["KEY-3.1"], {"request_id": ""}) == (
        "no",
        "KEY-3.1: request ids are engine-generated (uuid4)",
    )
    assert serving_reachability(adapter, ["KEY-3.2"], {"request_id": ""})[0] == "unknown"
    assert serving_reachability(adapter, ["PLAN-2.2"], {"case": REPLICATED})[0] == "yes"
    wide = {**REPLICATED, "source": {**REPLICATED["source"], "tp": 8}}
    assert serving_reachability(adapter, ["PLAN-2.2"], wide) == ("no", "server args: tp 8 > GPUs")
    assert serving_reachability(ReferenceAdapter(), ["PLAN-2.2"], wide)[0] == "unknown"


def test_a_failed_result_carries_its_reachability() -> None:
    class ServingMerged(ReplicasMergedTwice, Serving):
        pass

    result = run_check(get_check("PLAN-2/exact-cover"), ServingMerged(), replay=REPLICATED)
    assert (result.verdict, result.reachable_in_serving) == (FAILED, "yes")
    assert result.to_dict()["tier"] == "corrupts"
    assert result.to_dict()["reachability_evidence"] == "server args: tp 4 ok"


def test_a_passing_result_has_no_tier() -> None:
    result = run_check(get_check("PLAN-2/exact-cover"), ReferenceAdapter(), replay=REPLICATED)
    assert result.verdict == PASSED
    assert (result.tier, result.obligation, result.reachable_in_serving) == (None, None, None)


def test_an_adapter_with_an_unknown_replicas_write_is_refused_at_load() -> None:
    from kvspec.conformance.adapter import AdapterError, check_adapter

    class Some(ReferenceAdapter):
        replicas_write = "all"

    with pytest.raises(AdapterError, match=r"replicas_write must be one of \('one', 'every'\)"):
        check_adapter(Some(), where="test")
    check_adapter(EveryReplicaSends(), where="test")
