"""The spec's descriptor list for one edge: its share's bytes, paired and coalesced [DESC-1..3].

For one edge of a transfer plan and a request's tokens, the share is the edge's token
set within them [PLAN-6], each token at its position among each rank's own tokens
(:func:`share_positions`, [CP-1]). Every byte of each field of each (layer, token, head)
of the share is paired with the sender's byte holding the same (the *atoms*, one per
field), the receiver's block ids and regions checked first [PAGED-3, DESC-2]; sorted by
source address and merged where they continue in both regions, they are the maximal
runs, whose count no list of the same effect can beat [DESC-3]. :func:`plan_runs` gives
them as tensors, for a data path that moves the bytes; :func:`plan_descriptors` as a
:class:`DescriptorPlan`, the list a connector's is judged against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kvspec.memory.descriptors.registered import Descriptor, RegisteredCache
from kvspec.memory.paged import check_block_ids
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import Edge, TransferPlan
from kvspec.topology.tokens import Tokens, as_tokens


@dataclass(frozen=True)
class DescriptorPlan:
    """The spec's list for one edge and its context [DESC-1..3]."""

    edge: Edge
    tokens: range | Tokens
    source: RegisteredCache
    target: RegisteredCache
    descriptors: tuple[Descriptor, ...]
    share_bytes: int
    count: int
    """How many descriptors the list has (also when only counted, ``descriptors`` empty)."""


def _local(held: range, wanted: range, what: str) -> torch.Tensor:
    if wanted.start < held.start or wanted.stop > held.stop:
        raise ValueError(f"the edge's {what} {wanted} are not all held ({held})")
    return torch.arange(wanted.start - held.start, wanted.stop - held.start)


def _check_same_information(source: RegisteredCache, target: RegisteredCache) -> None:
    if source.information() != target.information():
        raise ValueError(
            f"a {source.layout.name} sender's cells hold {source.information()} but the "
            f"{target.layout.name} receiver's hold {target.information()}: bytes cannot carry one "
            "into the other [LAYOUT-6, DESC-1]"
        )


def _block_ids(cache: RegisteredCache, ids: Sequence[int], slots: int) -> torch.Tensor:
    """A side's block table, checked against its cache and the slots it must hold [PAGED-2]."""
    checked = check_block_ids(
        ids, num_blocks=cache.num_blocks, block_size=cache.block_size, seq_len=slots
    )
    return torch.tensor(checked, dtype=torch.int64)


_Coords = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(layers, blocks, slots, heads) index tensors, broadcasting together."""


def _element_axis(at: _Coords) -> _Coords:
    """The coordinates with one more trailing axis, for a field's elements [LAYOUT-8]."""
    layers, blocks, slots, heads = (t.unsqueeze(-1) for t in at)
    return layers, blocks, slots, heads


def field_atoms(
    source: RegisteredCache,
    target: RegisteredCache,
    name: str,
    size: int,
    src_at: _Coords,
    dst_at: _Coords,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Field ``name``'s (src region, src offset, dst region, dst offset) tensors at the
    two sides' coordinates, flattened, and each atom's length: the whole field (``size``
    bytes) per (layer, token, head), or one element where the field's elements are not
    consecutive on a side [DESC-1, LAYOUT-8]."""
    index = None
    if not (source.contiguous(name) and target.contiguous(name)):
        # One atom per element, which coalescing joins again where both sides run on
        # [LAYOUT-8, DESC-3].
        count = source.element_count(name)
        index = torch.arange(count, dtype=torch.int64).view(1, 1, 1, -1)
        src_at = _element_axis(src_at)
        dst_at = _element_axis(dst_at)
        size //= count
    sr, so = source.addresses(name, *src_at, index=index)
    dr, do = target.addresses(name, *dst_at, index=index)
    return sr.flatten(), so.flatten(), dr.flatten(), do.flatten(), size


def _atoms(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
) -> tuple[torch.Tensor, ...]:
    """Every (src region, src offset, dst region, dst offset, length) of the share, one per
    field of each (layer, token, head), all as int64 tensors [DESC-1]."""
    share = share_positions(plan, edge, tokens)
    src_owner = rank_ownership(plan.source, plan.model, edge.src)
    dst_owner = rank_ownership(plan.target, plan.model, edge.dst)
    for side, cache, owner in (("sender", source, src_owner), ("receiver", target, dst_owner)):
        if cache.heads != len(owner.heads) or cache.num_layers != len(owner.layers):
            raise ValueError(
                f"the {side}'s registered cache holds {cache.heads} heads and "
                f"{cache.num_layers} layers, but rank {owner.rank} owns heads {owner.heads} and "
                f"layers {owner.layers} [DESC-1]"
            )
    _check_same_information(source, target)
    src_ids = _block_ids(source, source_ids, share.source_slots)
    dst_ids = _block_ids(target, target_ids, share.target_slots)
    layers_src = _local(src_owner.layers, edge.layers, "layers").view(-1, 1, 1)
    layers_dst = _local(dst_owner.layers, edge.layers, "layers").view(-1, 1, 1)
    heads_src = _local(src_owner.heads, edge.heads, "heads").view(1, 1, -1)
    heads_dst = _local(dst_owner.heads, edge.heads, "heads").view(1, 1, -1)
    ts = torch.tensor(share.source.tokens(), dtype=torch.int64).view(1, -1, 1)
    td = torch.tensor(share.target.tokens(), dtype=torch.int64).view(1, -1, 1)
    parts = []
    for name, (_, _, size) in source.fields().items():
        src_at: _Coords = (
            layers_src,
            src_ids[ts // source.block_size],
            ts % source.block_size,
            heads_src,
        )
        dst_at: _Coords = (
            layers_dst,
            dst_ids[td // target.block_size],
            td % target.block_size,
            heads_dst,
        )
        parts.append(field_atoms(source, target, name, size, src_at, dst_at))
    if not parts or not len(parts[0][0]):
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty, empty, empty, empty
    return (
        torch.cat([p[0] for p in parts]),
        torch.cat([p[1] for p in parts]),
        torch.cat([p[2] for p in parts]),
        torch.cat([p[3] for p in parts]),
        torch.cat([torch.full_like(p[0], p[4]) for p in parts]),
    )


class SharePositions(NamedTuple):
    """The tokens of one edge's share and where they sit on each side [DESC-1, CP-1].

    ``tokens`` are the request's token positions the share carries; ``source`` and
    ``target`` their positions in the sender's and the receiver's own tokens (the same as
    ``tokens`` on a side without token shards), in the same order.
    """

    tokens: Tokens
    source: Tokens
    target: Tokens

    @property
    def source_slots(self) -> int:
        """Cache slots the sender's block ids must cover: up to its last position."""
        return self.source.ranges[-1].stop if self.source else 0

    @property
    def target_slots(self) -> int:
        """Cache slots the receiver's block ids must cover: up to its last position."""
        return self.target.ranges[-1].stop if self.target else 0


def share_positions(plan: TransferPlan, edge: Edge, tokens: range | Tokens) -> SharePositions:
    """The share of ``edge`` in ``tokens`` (a range of the request, or a token set) and
    each token's position on both ranks [DESC-1, PLAN-6, CP-1].

    The share is the edge's token set within ``tokens``; each rank keeps its own tokens in
    ascending order, so a token's slot is its position among them (vLLM's prefill
    context parallelism read another shard's blocks where it used the request's
    position instead).
    """
    if isinstance(tokens, range) and (tokens.step != 1 or tokens.start < 0):
        raise ValueError(f"tokens must be a range of token positions, got {tokens!r}")
    wanted = as_tokens(tokens)
    share = wanted if edge.tokens is None else wanted.intersect(edge.tokens)
    sides = []
    for side, rank in (("source", edge.src), ("target", edge.dst)):
        held = plan.owner(side, rank).tokens
        sides.append(share if held is None else share.positions_in(held))
    return SharePositions(share, sides[0], sides[1])


def _check_bounds(
    cache: RegisteredCache,
    region: torch.Tensor,
    offset: torch.Tensor,
    length: torch.Tensor,
    ids: Sequence[int],
    side: str,
) -> None:
    """Refuse block ids whose bytes lie past a registered region's end [DESC-2.2]."""
    sizes = torch.tensor(list(cache.regions().values()), dtype=torch.int64)
    past = offset + length > sizes[region]
    if bool(past.any()):
        names = list(cache.regions())
        first = int(past.nonzero()[0, 0])
        r = int(region[first])
        need = int((offset + length)[region == r].max())
        where = cache.locate(names[r], int(offset[first]))
        raise ValueError(
            f"the {side}'s block ids {list(ids)} need bytes up to {need} of region "
            f"{names[r]!r}, which is registered with {int(sizes[r])} bytes ({where} lies past "
            "its end); a range is never posted past a region [DESC-2]"
        )


class Runs(NamedTuple):
    """The spec's maximal runs of one edge as five int64 tensors, in source address order
    [DESC-1..3]: region indices (into ``source.regions()`` and ``target.regions()``, in
    their order), offsets and lengths. The same list as :func:`plan_descriptors`', with no
    Python object per run: what a data path that moves the bytes needs."""

    src_region: torch.Tensor
    src_offset: torch.Tensor
    dst_region: torch.Tensor
    dst_offset: torch.Tensor
    length: torch.Tensor


def plan_runs(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
) -> Runs:
    """The minimal descriptor list realising ``edge`` for ``tokens`` [DESC-1..3], as
    tensors (:class:`Runs`); the arguments and refusals are :func:`plan_descriptors`'."""
    if not isinstance(tokens, range | Tokens):
        raise ValueError(
            f"tokens must be a range of token positions or a Tokens set, got {tokens!r}"
        )
    sr, so, dr, do, ln = _atoms(plan, edge, source, source_ids, target, target_ids, tokens)
    _check_bounds(source, sr, so, ln, source_ids, "sender")
    _check_bounds(target, dr, do, ln, target_ids, "receiver")
    return Runs(*_runs(sr, so, dr, do, ln))


def plan_descriptors(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
    *,
    count_only: bool = False,
) -> DescriptorPlan:
    """The minimal descriptor list realising ``edge`` for ``tokens`` [DESC-1..3].

    ``tokens`` is a range of the request's token positions or, where a stage has token
    shards, any token set; the edge carries those of them in its token set
    (:func:`share_positions`). ``source_ids`` / ``target_ids`` are the request's block
    ids on each side, exactly as many as the side's last position of the share needs
    (``tokens.stop`` without token shards) [PAGED-3]. Bytes of each (layer, token, head,
    field) of the share are paired, sorted by source address and merged where they
    continue in both regions: the maximal runs, whose count no list of the same effect
    can beat.
    ``count_only`` counts them without building the list.
    """
    runs = plan_runs(plan, edge, source, source_ids, target, target_ids, tokens)
    descriptors = (
        () if count_only else _descriptors(runs, list(source.regions()), list(target.regions()))
    )
    count = len(runs.length)
    share = int(runs.length.sum())
    return DescriptorPlan(edge, tokens, source, target, descriptors, share, count)


def _runs(
    sr: torch.Tensor,
    so: torch.Tensor,
    dr: torch.Tensor,
    do: torch.Tensor,
    ln: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Merge atoms into maximal runs, contiguous in both regions [DESC-3]: the runs as
    (src region, src offset, dst region, dst offset, length) tensors, in source order."""
    if not len(sr):
        return sr, so, dr, do, ln
    span = int(so.max()) + int(ln.max()) + 1
    order = torch.argsort(sr * span + so)
    sr, so, dr, do, ln = (x[order] for x in (sr, so, dr, do, ln))
    joins = (
        (sr[1:] == sr[:-1])
        & (dr[1:] == dr[:-1])
        & (so[1:] == so[:-1] + ln[:-1])
        & (do[1:] == do[:-1] + ln[:-1])
    )
    starts = torch.cat([torch.ones(1, dtype=torch.bool), ~joins])
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    lengths = torch.zeros(int(group[-1]) + 1, dtype=torch.int64).index_add_(0, group, ln)
    first = starts.nonzero().flatten()
    return sr[first], so[first], dr[first], do[first], lengths


def _descriptors(
    runs: tuple[torch.Tensor, ...], src_names: list[str], dst_names: list[str]
) -> tuple[Descriptor, ...]:
    sr, so, dr, do, ln = runs
    return tuple(
        map(
            Descriptor._make,
            zip(
                [src_names[i] for i in sr.tolist()],
                so.tolist(),
                [dst_names[i] for i in dr.tolist()],
                do.tolist(),
                ln.tolist(),
                strict=True,
            ),
        )
    )


def _coalesce(
    sr: torch.Tensor,
    so: torch.Tensor,
    dr: torch.Tensor,
    do: torch.Tensor,
    ln: torch.Tensor,
    src_names: list[str],
    dst_names: list[str],
) -> tuple[Descriptor, ...]:
    """Atoms merged into maximal runs, as descriptors [DESC-3]."""
    return _descriptors(_runs(sr, so, dr, do, ln), src_names, dst_names)
