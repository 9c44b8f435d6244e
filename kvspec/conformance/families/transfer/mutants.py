"""Mutants of what travels on an edge and how a receiver assembles it [SLICE-1, SLICE-2,
SLICE-4, RESHARD-1, RESHARD-2, DTYPE-2, DTYPE-3]."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import HEAD_AXIS, Shipment
from kvspec.tensors.slicing import HeadSlice, slice_heads
from kvspec.topology.case import TransferCase
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.tokens import Tokens


def _assemble(
    case: TransferCase,
    dst: int,
    shipments: Sequence[Shipment],
    *,
    head_offset=lambda edge, owner: edge.heads.start - owner.heads.start,
    layer_offset=lambda edge, owner: edge.layers.start - owner.layers.start,
) -> RequestKV:
    """A receiver written out by hand: each (applied) shipment written at the offsets the
    two functions give, into a shard of the receiver's layers and heads."""
    owner = rank_ownership(case.target, case.model, dst)
    first = shipments[0].kv
    shape = list(first.data.shape)
    shape[0], shape[HEAD_AXIS] = len(owner.layers), len(owner.heads)
    data = first.data.new_zeros(shape)
    scales = None if first.scales is None else first.scales.new_zeros(len(owner.layers), shape[1])
    for s in shipments:
        kv = s.kv.data
        if not s.marker.applied:
            kv = slice_heads(kv, s.marker.offset_in_shard, s.marker.num_slices, head_axis=3)  # type: ignore[arg-type]  # equal slices only, as the field's code
        h, lay = head_offset(s.edge, owner), layer_offset(s.edge, owner)
        data[lay : lay + kv.shape[0], :, :, h : h + kv.shape[HEAD_AXIS]] = kv
        if scales is not None and s.kv.scales is not None:
            scales[lay : lay + kv.shape[0]] = s.kv.scales
    return RequestKV(data, scales)


@mutant("SLICE-1.1")
class OffByOneHeadOffset(ReferenceAdapter):
    """Sender-side slicing starts one slice too far."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, "receiver")
        if slicing == "receiver":
            return out
        for dst in out:
            edge = self.plan(case).edge(src, dst)
            wrong = (edge.offset_in_shard + 1) % edge.num_slices  # type: ignore[operator]  # equal slices only
            out[dst] = RequestKV(
                slice_heads(out[dst].data, wrong, edge.num_slices, head_axis=3),  # type: ignore[arg-type]  # equal slices only, as the field's code
                out[dst].scales,
            )
        return out


@mutant("SLICE-1.1")
class SliceOffsetFromReceiverRank(ReferenceAdapter):
    """Cuts slice ``dst_tp_rank % num_slices`` of the sender's heads (the field's rule),
    not the edge's offset: wrong when heads are replicated."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, "receiver")
        if slicing == "receiver":
            return out
        for dst in out:
            edge = self.plan(case).edge(src, dst)
            offset = case.target.coords(dst)[1] % edge.num_slices
            out[dst] = RequestKV(
                slice_heads(out[dst].data, offset, edge.num_slices, head_axis=3),  # type: ignore[arg-type]  # equal slices only, as the field's code
                out[dst].scales,
            )
        return out


@mutant("SLICE-1.2")
class SendsWholeLayerRange(ReferenceAdapter):
    """Sends every layer it holds on each edge, not only the layers its receiver owns."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, slicing)
        if slicing != "sender":
            return out
        owner = rank_ownership(case.source, case.model, src)
        whole = {}
        for dst in out:
            edge = self.plan(case).edge(src, dst)
            first = edge.heads.start - owner.heads.start
            whole[dst] = shard.head_slice(first, first + len(edge.heads))
        return whole


@mutant("SLICE-2.1")
class ReceiverModeSendsAllLayers(ReferenceAdapter):
    """Under receiver-side slicing sends its whole shard, every layer it holds included."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, slicing)
        return out if slicing == "sender" else {dst: shard for dst in out}


@mutant("SLICE-2.2")
class ReceiverCutsByTpRatio(ReferenceAdapter):
    """The receiver cuts ``to_tp // from_tp`` slices at ``tp_rank % ratio`` (the field's
    rule) instead of the marker's: wrong when heads are replicated."""

    def apply_marker(self, case, dst, shipment):
        marker = shipment.marker
        if marker.applied or marker.target_rank != dst:
            return super().apply_marker(case, dst, shipment)
        ratio = max(1, marker.to_tp // marker.from_tp)
        heads = shipment.kv.data.shape[HEAD_AXIS]
        slices = ratio if heads % ratio == 0 else 1
        offset = case.target.coords(dst)[1] % slices
        data = slice_heads(shipment.kv.data, offset, slices, head_axis=HEAD_AXIS)
        marker = replace(marker, applied=True, side="receiver")
        return Shipment(shipment.edge, marker, RequestKV(data, shipment.kv.scales))


@mutant("RESHARD-1.1")
class FullModelLayerBuffer(ReferenceAdapter):
    """Assembles into a buffer of all the model's layers (zeros where it owns none)."""

    def receiver_combine(self, case, dst, shipments):
        out = super().receiver_combine(case, dst, shipments)
        owner = rank_ownership(case.target, case.model, dst)
        if len(owner.layers) == case.model.num_layers:
            return out
        shape = list(out.data.shape)
        shape[0] = case.model.num_layers
        data = out.data.new_zeros(shape)
        data[owner.layers.start : owner.layers.stop] = out.data
        return RequestKV(data, out.scales)


@mutant("RESHARD-1.2")
class ScalesOfFirstShipment(ReferenceAdapter):
    """Gives the assembled fp8 shard the scales of the first shipment to arrive."""

    def receiver_combine(self, case, dst, shipments):
        out = super().receiver_combine(case, dst, shipments)
        if out.scales is None:
            return out
        return RequestKV(out.data, shipments[0].kv.scales)


@mutant("RESHARD-2.1")
class HeadsPlacedAtGlobalIndex(ReferenceAdapter):
    """Writes a shipment's heads at their global index in the local shard (clamped)."""

    def receiver_combine(self, case, dst, shipments):
        super().receiver_combine(case, dst, shipments)  # the same refusals
        owner = rank_ownership(case.target, case.model, dst)
        return _assemble(
            case,
            dst,
            shipments,
            head_offset=lambda edge, o: min(edge.heads.start, len(owner.heads) - len(edge.heads)),
        )


@mutant("RESHARD-2.1")
class LayersPlacedAtGlobalIndex(ReferenceAdapter):
    """Writes a shipment's layers at their global index in the local shard (clamped)."""

    def receiver_combine(self, case, dst, shipments):
        super().receiver_combine(case, dst, shipments)  # the same refusals
        owner = rank_ownership(case.target, case.model, dst)
        return _assemble(
            case,
            dst,
            shipments,
            layer_offset=lambda edge, o: min(
                edge.layers.start, len(owner.layers) - len(edge.layers)
            ),
        )


@mutant("RESHARD-2.2")
class MergeInArrivalOrder(ReferenceAdapter):
    """Concatenates received heads in arrival order instead of by head offset."""

    def receiver_combine(self, case, dst, shipments):
        super().receiver_combine(case, dst, shipments)  # the same refusals
        owner = rank_ownership(case.target, case.model, dst)
        placed: dict[tuple[int, int], int] = {}

        def arrival(edge, o) -> int:
            key = (edge.layers.start, edge.layers.stop)
            start = placed.get(key, 0)
            placed[key] = start + len(edge.heads)
            return start

        return _assemble(
            case,
            dst,
            shipments,
            head_offset=arrival,
            layer_offset=lambda edge, o: edge.layers.start - owner.layers.start,
        )


@mutant("DTYPE-2.1")
class NormalisesNegativeZero(ReferenceAdapter):
    """The receiver's copy goes through arithmetic (``x + 0``), turning -0.0 into 0.0."""

    def receiver_combine(self, case, dst, shipments):
        out = super().receiver_combine(case, dst, shipments)
        if out.data.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return RequestKV(out.data + 0.0, out.scales)
        return out


@mutant("DTYPE-3.1")
class DropsFp8Scales(ReferenceAdapter):
    """The sender forgets the fp8 scales; the receiver makes up ones."""

    def sender_transform(self, case, src, shard, slicing):
        return {
            d: RequestKV(kv.data)
            for d, kv in super().sender_transform(case, src, shard, slicing).items()
        }

    def receiver_combine(self, case, dst, shipments):
        fixed = []
        for s in shipments:
            scales = s.kv.scales
            if case.model.scale_format and scales is None:
                scales = torch.ones(
                    len(s.edge.layers), case.model.kv_tensors, device=s.kv.data.device
                )
            fixed.append(replace(s, kv=RequestKV(s.kv.data, scales)))
        return super().receiver_combine(case, dst, fixed)


@mutant("SLICE-1.3")
class HeadRangeReadAsSlice(ReferenceAdapter):
    """Reads a marker's heads [a, b) as slice a // (b - a) of equal slices of b - a heads."""

    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        marker = shipment.marker
        if marker.heads is None or marker.applied:
            return super().apply_marker(case, dst, shipment)
        start, stop = marker.heads
        width = stop - start
        offset = min(start // width, shipment.kv.data.shape[3] // width - 1)
        kv = shipment.kv.head_slice(offset * width, (offset + 1) * width)
        return replace(shipment, kv=kv, marker=replace(marker, applied=True, side="receiver"))


@mutant("SLICE-4.1")
class TokensPackedBySource(ReferenceAdapter):
    """Places each source's tokens one after another in source order (SGLang's DCP1 -> DCP-N
    destination-contiguous packing taken as the layout), not at their positions."""

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        kv = super().receiver_combine(case, dst, shipments)
        owner = case.owner("target", dst)
        mine = owner.tokens if owner.tokens is not None else Tokens.span(0, kv.seq_len)
        order: list[int] = []  # receiver positions, in the order the sources send them
        for shipment in sorted(shipments, key=lambda s: s.edge.src):
            if shipment.edge.tokens is not None:
                for position in shipment.edge.tokens.positions_in(mine).tokens():
                    if position not in order:
                        order.append(position)
        if len(order) != kv.seq_len:
            return kv
        return RequestKV(kv.data[:, :, order], kv.scales)


@mutant("SLICE-4.2")
class MarkerTokensIgnored(ReferenceAdapter):
    """Places tokens by the plan alone and never reads the token ranges a payload's marker
    names, so a payload marked with other tokens is placed as if it had its edge's."""

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        trusted = [
            replace(s, marker=replace(s.marker, tokens=s.edge.tokens))
            if isinstance(s.marker, HeadSlice)
            else s
            for s in shipments
        ]
        return super().receiver_combine(case, dst, trusted)
