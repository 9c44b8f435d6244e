"""Mutants of the receiver's slice step and its tp_head_slice marker [SLICE-3]."""

from __future__ import annotations

from dataclasses import replace

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import HEAD_AXIS, Shipment
from kvspec.tensors.slicing import slice_heads


def _cut(shipment: Shipment) -> Shipment:
    """The shipment's slice, cut by the receiver, data only (the marker untouched)."""
    m = shipment.marker
    data = slice_heads(shipment.kv.data, m.offset_in_shard, m.num_slices, head_axis=HEAD_AXIS)  # type: ignore[arg-type]  # equal slices only, as the field's code
    return replace(shipment, kv=RequestKV(data, shipment.kv.scales))


@mutant("SLICE-3.1")
class MarkedAppliedBySender(ReferenceAdapter):
    """Cuts the slice but copies the sender's marker wording: applied, side 'sender'."""

    def apply_marker(self, case, dst, shipment):
        out = super().apply_marker(case, dst, shipment)
        if not shipment.marker.applied:
            return replace(out, marker=replace(out.marker, side="sender"))
        return out


@mutant("SLICE-3.1")
class MarkerLeftUnapplied(ReferenceAdapter):
    """Cuts the slice and forwards the marker as it came (still unapplied)."""

    def apply_marker(self, case, dst, shipment):
        out = super().apply_marker(case, dst, shipment)
        return replace(out, marker=shipment.marker)


@mutant("SLICE-3.2")
class ReceiverAppliedCutAgain(ReferenceAdapter):
    """Trusts only side 'sender' as applied: a slice the receiver applied is cut again."""

    def apply_marker(self, case, dst, shipment):
        m = shipment.marker
        if m.applied and m.side == "receiver" and m.target_rank == dst and m.num_slices > 1:
            heads = shipment.kv.data.shape[HEAD_AXIS]
            if heads % m.num_slices == 0:
                return _cut(shipment)
        return super().apply_marker(case, dst, shipment)


@mutant("SLICE-3.2")
class DoubleSlicing(ReferenceAdapter):
    """Cuts the slice again even when the sender already applied it."""

    def apply_marker(self, case, dst, shipment):
        m = shipment.marker
        if m.applied and m.target_rank == dst and m.num_slices > 1:
            heads = shipment.kv.data.shape[HEAD_AXIS]
            if heads % m.num_slices == 0:
                return _cut(shipment)
        return super().apply_marker(case, dst, shipment)


@mutant("SLICE-3.3")
class IgnoresTargetRank(ReferenceAdapter):
    """Accepts a payload whose tp_head_slice is marked for another rank."""

    def apply_marker(self, case, dst, shipment):
        fixed = replace(shipment, marker=replace(shipment.marker, target_rank=dst))
        return super().apply_marker(case, dst, fixed)


@mutant("SLICE-3.3")
class ChecksTargetOnlyWhenCutting(ReferenceAdapter):
    """Checks target_rank only when it has a slice to cut: an applied payload for another
    rank passes (the field only warns)."""

    def apply_marker(self, case, dst, shipment):
        if shipment.marker.applied:
            return shipment
        return super().apply_marker(case, dst, shipment)
