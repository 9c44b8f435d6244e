"""Deliberately wrong adapters: the reference with one realistic bug each.

The conformance suite's power is measured by catching every one of them
(tests/test_conformance_power.py). ``CAUGHT_BY`` names the check expected to catch
each mutant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from kvspec.conformance.reference import ReferenceAdapter
from kvspec.error_cases import OPERATIONS
from kvspec.kv import RequestKV
from kvspec.model import ModelShape
from kvspec.ownership import head_replicas, rank_ownership
from kvspec.plan import edge_between
from kvspec.reshard import HEAD_AXIS, Shipment, receive
from kvspec.slicing import slice_heads
from kvspec.stage import StageLayout
from kvspec.strategies import TransferCase


def _naive_combine(
    case: TransferCase, dst: int, shipments: Sequence[Shipment], *, honour_marker: bool = True
) -> RequestKV:
    """Concatenate (sliced) pieces on the head axis in arrival order, per layer range."""
    owner = rank_ownership(case.target, case.model, dst)
    pieces = []
    for s in shipments:
        data = s.kv.data
        if not s.marker.applied or not honour_marker:
            data = slice_heads(data, s.marker.offset_in_shard, s.marker.num_slices, head_axis=3)
        pieces.append((s.edge, data))
    out = None
    for layers in {(e.layers.start, e.layers.stop) for e, _ in pieces}:
        group = [d for e, d in pieces if (e.layers.start, e.layers.stop) == layers]
        block = torch.cat(group, dim=HEAD_AXIS)
        if out is None:
            shape = list(block.shape)
            shape[0] = len(owner.layers)
            out = block.new_zeros(shape)
        out[layers[0] - owner.layers.start : layers[1] - owner.layers.start] = block
    return RequestKV(out, shipments[0].kv.scales if shipments else None)


class ReplicasMergedTwice(ReferenceAdapter):
    """Takes a replicated head from every replica (the classic GQA bug)."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        receiver = rank_ownership(case.target, case.model, dst)
        found = []
        for src in case.source.ranks():
            sender = rank_ownership(case.source, case.model, src)
            try:
                edge_between(sender, receiver, case.model)
            except ValueError:
                continue
            found.append(src)
        return found


class WrongReplicaGroup(ReferenceAdapter):
    """Picks the replica of the next head: ``tp_rank + tp/H`` instead of ``tp_rank``."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        heads, tp = case.model.num_kv_heads, case.source.tp
        if heads >= tp:
            return super().sources(case, dst)
        shifted = []
        for src in super().sources(case, dst):
            pp_rank, tp_rank = case.source.coords(src)
            shifted.append(case.source.rank(pp_rank, (tp_rank + tp // heads) % tp))
        return sorted(shifted)


class OffByOneHeadOffset(ReferenceAdapter):
    """Sender-side slicing starts one slice too far."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, "receiver")
        if slicing == "receiver":
            return out
        for dst in out:
            edge = case.plan().edge(src, dst)
            wrong = (edge.offset_in_shard + 1) % edge.num_slices
            out[dst] = RequestKV(
                slice_heads(out[dst].data, wrong, edge.num_slices, head_axis=3), out[dst].scales
            )
        return out


class MergeInArrivalOrder(ReferenceAdapter):
    """Concatenates received heads in arrival order instead of by head offset."""

    def receiver_combine(self, case, dst, shipments):
        if len({s.edge.src for s in shipments}) != len(case.plan().sources_of(dst)):
            raise ValueError("missing shipment")
        return _naive_combine(case, dst, shipments)


class PipelineRemainderToLast(ReferenceAdapter):
    """Gives the PP remainder to the last partitions (-1, -2, ...) instead of -2, -3, ..."""

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        heads, _ = super().owned(layout, model, rank)
        if layout.layer_partition is not None:
            return super().owned(layout, model, rank)
        counts = [model.num_layers // layout.pp] * layout.pp
        for i in range(model.num_layers % layout.pp):
            counts[-1 - i] += 1
        pp_rank = layout.coords(rank)[0]
        start = sum(counts[:pp_rank])
        return heads, range(start, start + counts[pp_rank])


class IgnoresExplicitPartition(ReferenceAdapter):
    """Always uses the default partition."""

    def owned(self, layout, model, rank):
        return super().owned(StageLayout(layout.tp, layout.pp), model, rank)


class MlaSplitLikeHeads(ReferenceAdapter):
    """Treats the MLA latent as if only TP rank 0 held it."""

    def owned(self, layout, model, rank):
        heads, layers = super().owned(layout, model, rank)
        if model.attention == "mla" and layout.coords(rank)[1] > 0:
            return range(0), layers
        return heads, layers


class DoubleSlicing(ReferenceAdapter):
    """Cuts the slice again even when the sender already applied it."""

    def receiver_combine(self, case, dst, shipments):
        recut = []
        for s in shipments:
            if s.marker.applied and s.marker.num_slices > 1:
                data = slice_heads(
                    s.kv.data,
                    0,
                    min(s.marker.num_slices, s.kv.data.shape[3]),
                    head_axis=3,
                )
                s = replace(s, kv=RequestKV(data, s.kv.scales))
            recut.append(s)
        return super().receiver_combine(case, dst, recut)


class IgnoresTargetRank(ReferenceAdapter):
    """Accepts a payload whose tp_head_slice is marked for another rank."""

    def receiver_combine(self, case, dst, shipments):
        fixed = [replace(s, marker=replace(s.marker, target_rank=dst)) for s in shipments]
        return super().receiver_combine(case, dst, fixed)


class PadsMissingShipment(ReferenceAdapter):
    """Fills the heads of a missing sender with zeros instead of refusing."""

    def receiver_combine(self, case, dst, shipments):
        plan = case.plan()
        have = {s.edge.src for s in shipments}
        padded = list(shipments)
        template = shipments[0] if shipments else None
        for src in plan.sources_of(dst):
            if src not in have and template is not None:
                edge = plan.edge(src, dst)
                shape = list(template.kv.data.shape)
                shape[0], shape[3] = len(edge.layers), len(edge.heads)
                marker = replace(
                    template.marker,
                    offset_in_shard=edge.offset_in_shard,
                    num_slices=edge.num_slices,
                    applied=True,
                    side="sender",
                )
                zeros = template.kv.data.new_zeros(shape)
                scales = (
                    None
                    if template.kv.scales is None
                    else template.kv.scales[:1].expand(len(edge.layers), -1)
                )
                padded.append(Shipment(edge, marker, RequestKV(zeros, scales)))
        return receive(plan, dst, padded)


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


class NormalisesNegativeZero(ReferenceAdapter):
    """The receiver's copy goes through arithmetic (``x + 0``), turning -0.0 into 0.0."""

    def receiver_combine(self, case, dst, shipments):
        out = super().receiver_combine(case, dst, shipments)
        if out.data.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return RequestKV(out.data + 0.0, out.scales)
        return out


class BalancedWithoutModulo(ReferenceAdapter):
    """'balanced' clamps the consumer index instead of wrapping it."""

    def sources(self, case, dst):
        if case.policy != "balanced" or case.model.num_kv_heads >= case.source.tp:
            return super().sources(case, dst)
        lowest = TransferCase(case.source, case.target, case.model, "lowest")
        chosen = []
        for src in super().sources(lowest, dst):
            pp_rank = case.source.coords(src)[0]
            head = rank_ownership(case.source, case.model, src).heads[0]
            replicas = head_replicas(case.model.num_kv_heads, case.source.tp, head)
            consumers = [t for t in case.target.ranks() if src in super().sources(lowest, t)]
            k = consumers.index(dst)
            chosen.append(case.source.rank(pp_rank, replicas[min(k, len(replicas) - 1)]))
        return sorted(chosen)


class TargetsOmitLast(ReferenceAdapter):
    """A sender with several targets forgets the last one."""

    def targets(self, case, src):
        found = list(super().targets(case, src))
        return found[:-1] if len(found) > 1 else found


class AcceptsNonDividingTp(ReferenceAdapter):
    """Plans TP3 -> TP2 anyway."""

    def validate(self, config: dict[str, Any]) -> None:
        source, target = config["source"]["tp"], config["target"]["tp"]
        if source > 0 and target > 0 and source % target and target % source:
            return
        super().validate(config)


class AcceptsMismatchedModels(ReferenceAdapter):
    """Never compares the receiver's model facts."""

    def validate(self, config):
        super().validate({k: v for k, v in config.items() if k != "target_model"})


class AcceptsAnyRank(ReferenceAdapter):
    """Checks only that a rank is non-negative."""

    def validate(self, config):
        rank = config.get("rank", {}).get("rank", 0)
        if rank < 0:
            raise ValueError("negative rank")
        OPERATIONS["transfer"]({k: v for k, v in config.items() if k != "rank"})


MUTANTS: dict[type[ReferenceAdapter], str] = {
    ReplicasMergedTwice: "PLAN-2/exact-cover",
    WrongReplicaGroup: "PLAN-2/exact-cover",
    OffByOneHeadOffset: "SLICE-1/sender-content",
    MergeInArrivalOrder: "RESHARD-3/order-and-missing",
    PipelineRemainderToLast: "LAYER-1/default-partition",
    IgnoresExplicitPartition: "LAYER-2/explicit-partition",
    MlaSplitLikeHeads: "HEAD-3/mla-latent",
    DoubleSlicing: "SLICE-3/applied-once",
    IgnoresTargetRank: "SLICE-3/applied-once",
    PadsMissingShipment: "RESHARD-3/order-and-missing",
    DropsFp8Scales: "DTYPE-3/fp8-scales",
    NormalisesNegativeZero: "DTYPE-2/special-values",
    BalancedWithoutModulo: "PLAN-4/named-policy",
    TargetsOmitLast: "PLAN-3/inverse",
    AcceptsNonDividingTp: "PLAN-1/refuses-non-dividing-tp",
    AcceptsMismatchedModels: "MODEL-3/refuses-mismatched-models",
    AcceptsAnyRank: "STAGE-1/refuses-rank-out-of-range",
}
"""Each mutant and the check that must catch it."""


class GuessesLayoutFromShape(ReferenceAdapter):
    """Detects a stacked cache by which axis has size 2, as shape-guessing readers do."""

    def detect_layout(self, cache, **known):
        if isinstance(cache, tuple):
            return super().detect_layout(cache, **known)
        if cache.dim() == 5 and cache.shape[0] == 2:
            return "flash_attn"
        if cache.dim() == 5 and cache.shape[1] == 2:
            return "flashinfer"
        return super().detect_layout(cache, **known)


class ReadsHndAsNhd(ReferenceAdapter):
    """Ignores the HND variants: reads heads where block slots are."""

    def read_layer(self, cache, layout):
        if layout.endswith("_hnd"):
            return tuple(v.transpose(1, 2) for v in super().read_layer(cache, layout))
        return super().read_layer(cache, layout)


class ReadsByCopy(ReferenceAdapter):
    """Returns contiguous copies instead of views."""

    def read_layer(self, cache, layout):
        return tuple(v.clone() for v in super().read_layer(cache, layout))


class DropsOutOfRangeBlocks(ReferenceAdapter):
    """Skips block ids outside the cache and pads with zeros (a silent drop)."""

    def gather(self, cache, block_ids, seq_len):
        valid = [b if 0 <= b < cache.shape.num_blocks else None for b in block_ids]
        if None not in valid:
            return super().gather(cache, block_ids, seq_len)
        spare = next(b for b in range(cache.shape.num_blocks) if b not in block_ids)
        patched = [spare if b is None else b for b in valid]
        kv = super().gather(cache, patched, seq_len)
        kv.data.zero_()
        return kv

    def scatter(self, kv, cache, block_ids):
        keep = [b for b in block_ids if 0 <= b < cache.shape.num_blocks]
        if len(keep) == len(block_ids):
            return super().scatter(kv, cache, block_ids)
        return None


class OracleIgnoresRequestId(ReferenceAdapter):
    """Fills every request alike."""

    def oracle_fill(self, model, request_id, **region):
        return super().oracle_fill(model, "same-for-all", **region)


MUTANTS.update(
    {
        GuessesLayoutFromShape: "LAYOUT-4/detect-unambiguous",
        ReadsHndAsNhd: "LAYOUT-1/read-named",
        ReadsByCopy: "LAYOUT-2/views-alias",
        DropsOutOfRangeBlocks: "PAGED-2/refuses-out-of-range",
        OracleIgnoresRequestId: "ORACLE-1/fill",
    }
)


class PortsWithoutDomain(ReferenceAdapter):
    """Applies the port formula to any stage and rank: stage 16 lands on the next rank's port."""

    def kv_port(self, base, stage, rank, replica):
        return base + 100 + replica * 1024 + rank * 16 + stage


class KeysJoinStrings(ReferenceAdapter):
    """Accepts a stage given as a string, so '_' inside it collides with the request id."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        if isinstance(from_stage, str):
            return f"{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
        return super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)


class LegacyKeyWhenSenderIsTp1(ReferenceAdapter):
    """The sender uses the legacy key whenever its own TP is 1; the receiver does not."""

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):
        keys = super().send_keys(case, request_id, src, from_stage=from_stage, to_stage=to_stage)
        if case.source.tp == 1:
            legacy = super().legacy_key(request_id, from_stage, to_stage)
            return [(legacy, dst) for _, dst in keys]
        return keys


class MergesWithoutAgreement(ReferenceAdapter):
    """Merges shards of different requests, trusting the first one's metadata."""

    def merge(self, case, dst, received):
        first = min(received, key=lambda pair: pair[0])[1]
        same = [(src, replace(p, request_id=first.request_id)) for src, p in received]
        return super().merge(case, dst, same)


class ReassemblesInArrivalOrder(ReferenceAdapter):
    """Concatenates chunks as they arrived."""

    def reassemble(self, chunks):
        from kvspec.chunks import reassemble

        relabelled = []
        start = 0
        for i, chunk in enumerate(chunks):
            relabelled.append(
                replace(
                    chunk,
                    chunk=replace(
                        chunk.chunk, chunk_id=i, token_start=start, final=i == len(chunks) - 1
                    ),
                )
            )
            start += chunk.seq_len
        return reassemble(relabelled)


class DecoderTrustsLengths(ReferenceAdapter):
    """Reads each tensor from its frame without checking the frame's length."""

    def decode(self, frames):
        import json

        from kvspec.wire import decode as spec_decode

        header = json.loads(frames[0])
        fixed = [frames[0]]
        for entry, frame in zip(header["tensors"], frames[1:], strict=False):
            want = 1
            for n in entry["shape"]:
                want *= max(n, 0)
            itemsize = 4 if entry["dtype"] == "float32" else 2 if "16" in entry["dtype"] else 1
            want *= itemsize
            size = len(frame)
            fixed.append(bytes(frame[:want]) + b"\0" * max(0, want - size))
        return spec_decode(fixed)


MUTANTS.update(
    {
        PortsWithoutDomain: "PORT-2/refuses-outside-domain",
        KeysJoinStrings: "KEY-3/injective",
        LegacyKeyWhenSenderIsTp1: "KEY-4/send-equals-recv",
        MergesWithoutAgreement: "PAYLOAD-3/merge",
        ReassemblesInArrivalOrder: "CHUNK-2/reassemble",
        DecoderTrustsLengths: "WIRE-4/refuses-malformed",
    }
)
