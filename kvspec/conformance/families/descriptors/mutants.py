"""Mutants of the byte-range descriptors a pull connector posts [DESC-1..3].

Each builds its list the way a connector does — head offsets, block addresses, the
token range — with one of the mistakes the field shipped in 2026.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.descriptors import Descriptor, RegisteredCache, _coalesce, share_positions
from kvspec.memory.descriptors.planning import field_atoms
from kvspec.memory.layout_model import SPLIT_AXES, CacheLayout, Plane, SideField
from kvspec.topology.ownership import rank_ownership


def _build(
    adapter: ReferenceAdapter,
    case,
    src: int,
    dst: int,
    source: RegisteredCache,
    source_ids: list[int],
    target: RegisteredCache,
    target_ids: list[int],
    tokens: range,
    *,
    source_head=None,
    target_block_size: int | None = None,
    target_id_shift: int = 0,
    stop: int | None = None,
    request_positions: bool = False,
    skip_scales: bool = False,
) -> tuple[Descriptor, ...]:
    """A connector's list for the edge :meth:`~kvspec.conformance.adapter.Adapter.descriptors`
    is asked for: every (layer, token, head, field) paired and merged, with the hooks a
    mutant bends. Tokens sit at their positions among each rank's own tokens
    [CP-1], unless ``request_positions`` addresses both caches by the request's."""
    plan = adapter.plan(case)
    edge = plan.edge(src, dst)
    so = rank_ownership(plan.source, plan.model, src)
    do = rank_ownership(plan.target, plan.model, dst)
    heads = torch.arange(edge.heads.start, edge.heads.stop).view(1, 1, -1)
    src_head = source_head(edge, so, do, heads) if source_head else heads - so.heads.start
    share = share_positions(plan, edge, range(tokens.start, stop or tokens.stop))
    held = (share.tokens, share.tokens) if request_positions else (share.source, share.target)
    ts, td = (torch.tensor(h.tokens(), dtype=torch.int64).view(1, -1, 1) for h in held)
    sids = torch.tensor(source_ids)
    dids = torch.tensor(target_ids) + target_id_shift
    dst_bs = target_block_size or target.block_size
    parts = []
    for name, (_, _, size) in source.fields().items():
        if skip_scales and name.endswith("_scale"):
            continue
        src_at = (
            torch.arange(edge.layers.start, edge.layers.stop).view(-1, 1, 1) - so.layers.start,
            sids[torch.clamp(ts // source.block_size, max=len(sids) - 1)],
            ts % source.block_size,
            src_head,
        )
        dst_at = (
            torch.arange(edge.layers.start, edge.layers.stop).view(-1, 1, 1) - do.layers.start,
            dids[torch.clamp(td // dst_bs, max=len(dids) - 1)],
            td % dst_bs,
            heads - do.heads.start,
        )
        parts.append(field_atoms(source, target, name, size, src_at, dst_at))
    src_regions, src_offsets, dst_regions, dst_offsets = (
        torch.cat([p[0] for p in parts]),
        torch.cat([p[1] for p in parts]),
        torch.cat([p[2] for p in parts]),
        torch.cat([p[3] for p in parts]),
    )
    lengths = torch.cat([torch.full_like(p[0], p[4]) for p in parts])
    return _coalesce(
        src_regions,
        src_offsets,
        dst_regions,
        dst_offsets,
        lengths,
        list(source.regions()),
        list(target.regions()),
    )


@mutant("DESC-1.1")
class SliceIndexTimesReceiverHeads(ReferenceAdapter):
    """Finds the sender's heads at slice index x the receiver's head count: right when the
    sender holds whole slices, wrong when heads are replicated (vllm#45330's remote block
    length)."""

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        def head(edge, so, do, heads):
            return heads - do.heads.start + edge.offset_in_shard * len(do.heads)

        if case.model.num_kv_heads < max(case.source.tp, case.target.tp):
            return _build(
                self,
                case,
                src,
                dst,
                source,
                source_ids,
                target,
                target_ids,
                tokens,
                source_head=head,
            )
        return super().descriptors(case, src, dst, source, source_ids, target, target_ids, tokens)


@mutant("DESC-1.4")
class SenderBlockSizeForBoth(ReferenceAdapter):
    """Addresses the receiver's blocks with the sender's block size (the two sides are
    assumed to page alike)."""

    def descriptors(self, case, src, dst, source, *sides):
        return _build(self, case, src, dst, source, *sides, target_block_size=source.block_size)


@mutant("DESC-1.2")
class RepostsTheFirstRange(ReferenceAdapter):
    """Posts the first range again after splitting the list into batches (a retry that
    overlaps what was already written)."""

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        made = list(
            super().descriptors(case, src, dst, source, source_ids, target, target_ids, tokens)
        )
        return made + made[:1]


@mutant("DESC-1.3")
class WholeLastBlock(ReferenceAdapter):
    """Moves whole sender blocks: the tail of the last block, past the token range, is
    written into the receiver too."""

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        bs = source.block_size
        stop = min(-(-tokens.stop // bs) * bs, len(target_ids) * target.block_size)
        return _build(
            self, case, src, dst, source, source_ids, target, target_ids, tokens, stop=stop
        )


@mutant("DESC-2.1")
class SkipsThePaddingPageTwice(ReferenceAdapter):
    """Adds one to every receiver block id, as if the pool's padding page were not yet
    counted: the last block's ranges run past the region."""

    def descriptors(self, case, *edge):
        return _build(self, case, *edge, target_id_shift=1)


@mutant("DESC-2.2")
class ClipsToTheRegion(ReferenceAdapter):
    """Drops the ranges that would leave a registered region instead of refusing the
    request."""

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        whole = replace(target, region_bytes={})
        made = super().descriptors(case, src, dst, source, source_ids, whole, target_ids, tokens)
        sizes = target.regions()
        return [d for d in made if d.dst_offset + d.length <= sizes[d.dst_region]]


@mutant("DESC-3.1")
class OnePerTokenAndHead(ReferenceAdapter):
    """Declares its lists coalesced but posts one range per (layer, token, head, field),
    as per-token RDMA does."""

    coalesces = True

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        made = super().descriptors(case, src, dst, source, source_ids, target, target_ids, tokens)
        piece = min(size for _, _, size in source.fields().values())
        out = []
        for d in made:
            for at in range(0, d.length, piece):
                n = min(piece, d.length - at)
                out.append(
                    Descriptor(d.src_region, d.src_offset + at, d.dst_region, d.dst_offset + at, n)
                )
        return out


@mutant("DESC-1.1")
class RequestPositionsUnderTokenShards(ReferenceAdapter):
    """Addresses both caches by a token's position in the request, not its position among
    the rank's own tokens: right without token shards, another token's slot (or another
    shard's block) with them, as vLLM's prefill context parallelism read another shard's
    blocks (vllm#38433, FIELD.md)."""

    def descriptors(self, case, *edge):
        return _build(self, case, *edge, request_positions=True)


@mutant("DESC-2.2")
class SenderRegionUnchecked(ReferenceAdapter):
    """Checks the request's block ids against the receiver's registered regions only, the
    ones it registered itself; the sender's are taken at the size their layout gives, so
    a request whose bytes run past a sender region's registered end is posted (the
    clause: inside the region on both sides)."""

    def descriptors(self, case, src, dst, source, *rest):
        whole = replace(source, region_bytes={})
        return super().descriptors(case, src, dst, whole, *rest)


def _slots_in_order(plane: Plane) -> Plane:
    """``plane`` with a split slot axis read as one: slot t at t, where slots_hi stood."""
    if not plane.split:
        return plane
    axes = tuple("slots" if a == SPLIT_AXES[0] else a for a in plane.axes if a != SPLIT_AXES[1])
    return replace(plane, axes=axes, unit=None)


def _unsplit(cache: RegisteredCache) -> RegisteredCache:
    spec: CacheLayout = cache.layout
    planes = tuple(_slots_in_order(p) for p in spec.planes)
    side = tuple(SideField(s.field, s.of, _slots_in_order(s.plane)) for s in spec.side)
    return replace(cache, layout=replace(spec, planes=planes, side=side))


@mutant("DESC-1.1")
class SplitSlotsReadInOrder(ReferenceAdapter):
    """Addresses a plane or side tensor whose slot axis is split (vLLM's SM100 V scales
    in 4-token groups, SGLang's MXFP8 scales at slot t % 32, t // 32) as if its slots ran
    in order, slot t at t: the split is for that field alone, and the connector reads it
    like the page's other planes (LAYOUT-8: slots_hi = t // unit, slots_lo = t % unit)."""

    def descriptors(self, case, src, dst, source, source_ids, target, target_ids, tokens):
        return super().descriptors(
            case, src, dst, _unsplit(source), source_ids, _unsplit(target), target_ids, tokens
        )


@mutant("DESC-1.1")
class ScalesLeftBehind(ReferenceAdapter):
    """Posts each cell's values and not its scales (vLLM's fp8 per-token-head inline
    scales, FlashMLA's nope scales, NVFP4's block scales), as a connector that takes
    scales for per-layer facts shipped apart: the receiver's scale bytes are never
    written (the clause: each field of each (layer, token, head))."""

    def descriptors(self, case, *edge):
        super().descriptors(case, *edge)  # the regions checked, as the reference does
        return _build(self, case, *edge, skip_scales=True)
