"""Checks that judge against the engine's contract (issue 28): a legitimate choice of the
engine's is tier ``differs``; a real misroute or wrong bytes stay ``corrupts``."""

from dataclasses import replace

from kvspec.conformance.families.transfer.marker_mutants import MarkerLeftUnapplied
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, get_check, run_check
from kvspec.tensors.reshard import RequestKV
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from tests.suite.replicas import REPLICATED, EveryReplicaSends, holders


class EveryReplicaSendsUndeclared(EveryReplicaSends):
    replicas_write = "one"


class WrongSenderDeclared(ReferenceAdapter):
    """Declares that every replica writes, but receiver 0 also lists source 2, which
    holds head 1 only: a misroute, not a replica."""

    replicas_write = "every"

    def sources(self, case, dst):
        got = list(super().sources(case, dst))
        return sorted({*got, 2}) if dst == 0 else got


def _named_policy(adapter):
    return run_check(get_check("PLAN-4/named-policy"), adapter, replay=REPLICATED)


def test_named_policy_every_replica_declared_is_differs() -> None:
    result = _named_policy(EveryReplicaSends())
    assert result.verdict == FAILED
    assert result.tier == "differs"
    assert result.obligation == "PLAN-4.1"
    assert "replicas_write='every'" in result.reason
    assert "replicas [1]" in result.reason


def test_named_policy_every_replica_undeclared_is_corrupts() -> None:
    result = _named_policy(EveryReplicaSendsUndeclared())
    assert (result.verdict, result.tier, result.obligation) == (FAILED, "corrupts", "PLAN-4.1")


def test_named_policy_wrong_sender_declared_is_corrupts() -> None:
    result = _named_policy(WrongSenderDeclared())
    assert (result.verdict, result.tier) == (FAILED, "corrupts")
    assert "uses [0, 2]" in result.reason


def test_named_policy_missing_rule_sender_declared_is_corrupts() -> None:
    class OtherReplicaOnly(EveryReplicaSends):
        """Sends from the second replica only: the rule's sender is missing."""

        def sources(self, case, dst):
            return holders(case, dst)[1:]

    result = _named_policy(OtherReplicaOnly())
    assert (result.verdict, result.tier) == (FAILED, "corrupts")


def test_named_policy_reference_passes() -> None:
    assert _named_policy(ReferenceAdapter()).verdict == PASSED


FAN_IN = {
    "case": TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 8, 2)).to_dict(),
    "seq_len": 2,
    "seed": 0,
}
"""TP4 -> TP2, 8 heads: each sender's whole shard is its edge's slice (num_slices 1)."""


class PassesWholeShardThrough(ReferenceAdapter):
    """vLLM-Omni's ``slice_received_rank_shard`` on a fan-in: a whole-shard payload is
    returned untouched, marker and all (still unapplied)."""

    def apply_marker(self, case, dst, shipment):
        m = shipment.marker
        if not m.applied and m.num_slices == 1:
            return shipment
        return super().apply_marker(case, dst, shipment)


def _applied_once(adapter, example):
    return run_check(get_check("SLICE-3/applied-once"), adapter, replay=example)


def test_marker_only_difference_with_identical_kv_is_differs() -> None:
    result = _applied_once(PassesWholeShardThrough(), FAN_IN)
    assert result.verdict == FAILED
    assert result.tier == "differs"
    assert result.obligation == "SLICE-3.1"
    assert "marker-only difference" in result.reason


def test_marker_only_difference_with_different_kv_is_corrupts() -> None:
    class FlipsAByte(PassesWholeShardThrough):
        def apply_marker(self, case, dst, shipment):
            out = super().apply_marker(case, dst, shipment)
            if out.marker.applied:
                return out
            data = out.kv.data.clone()
            data.view(-1)[0] += 1
            return replace(out, kv=RequestKV(data, out.kv.scales))

    result = _applied_once(FlipsAByte(), FAN_IN)
    assert (result.verdict, result.tier) == (FAILED, "corrupts")
    assert "wrongly" in result.reason


def test_unapplied_marker_on_a_real_slice_is_corrupts() -> None:
    """TP2 -> TP4: each edge is one of two slices; a marker left unapplied would have the
    next receiver cut the cut slice again."""
    fan_out = {
        "case": TransferCase(StageLayout(2), StageLayout(4), ModelShape(2, 4, 2)).to_dict(),
        "seq_len": 2,
        "seed": 0,
    }
    result = _applied_once(MarkerLeftUnapplied(), fan_out)
    assert (result.verdict, result.tier, result.obligation) == (FAILED, "corrupts", "SLICE-3.1")


def test_applied_once_reference_passes() -> None:
    assert _applied_once(ReferenceAdapter(), FAN_IN).verdict == PASSED
