"""Moving a hybrid model's layer groups: what a rank holds of each group, the pieces an
edge carries, and landing them on the receiver [GROUP-3, STATE-2, WINDOW-1].

A per-token group (full, sliding, draft) is KV ``[layers, kv, tokens, heads, head_dim]``
of the group's own heads [GROUP-2]; a rank holds its heads [HEAD-1..3] of the group's
layers in its PP stage [LAYER-1], and a sliding-window receiver holds only the
block-aligned window [WINDOW-1], a chunked local-attention receiver only its current
chunk [LOCAL-1]. A state group is, per part, ``[layers, units,
width * rows]`` of the units the rank holds [STATE-1]. An edge of the group plan
(:func:`kvspec.topology.group_plan.plan_groups`) is cut from the sender's region into
pieces — one per per-token edge, one per state read [STATE-2] — and each piece lands at
the coordinates it names; a piece that names coordinates the receiver does not hold is
refused. Filling regions from the oracles [ORACLE-1, :mod:`kvspec.tensors.state_oracle`]
makes every element checkable where it lands. The simulated cluster and the
reconstruction property use these same functions, so they restate no rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from kvspec.tensors.dtypes import raw_bits, torch_dtype
from kvspec.tensors.index_oracle import oracle_index
from kvspec.tensors.oracle import oracle_kv
from kvspec.tensors.state_oracle import oracle_state, part_dtype, state_group
from kvspec.tensors.token_rows import put_tokens, take_tokens
from kvspec.topology.group_plan import GroupEdge, GroupPlan, group_view
from kvspec.topology.groups import FullAttention
from kvspec.topology.indexer import INDEX_PARTS, index_widths
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import layer_ranges, rank_ownership
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import part_offsets, part_units
from kvspec.topology.tokens import Tokens
from kvspec.topology.windows import needed_tokens


@dataclass(frozen=True)
class Region:
    """What one rank holds of one layer group of one request [GROUP-1].

    Per-token groups: ``heads`` and ``tokens``; state groups: ``units`` (part name ->
    the units held) and ``offsets`` (part name -> where the part starts in the rank's
    state layer, in elements [STATE-2]).
    """

    group: int
    layers: tuple[int, ...]
    heads: range | None = None
    tokens: Tokens | None = None
    units: tuple[tuple[str, range], ...] = ()
    offsets: tuple[tuple[str, int], ...] = ()

    @property
    def per_token(self) -> bool:
        return self.heads is not None

    def empty(self) -> bool:
        """Whether the rank holds nothing of the group."""
        if not self.layers:
            return True
        if self.per_token:
            return not self.heads or not self.tokens
        return all(len(u) == 0 for _, u in self.units)


GroupData = dict[str, torch.Tensor]
"""A region's values: ``{"kv": [layers, kv, tokens, heads, dim]}`` for a per-token group
(and ``index``, ``index_scale`` ``[layers, tokens, width]`` for an indexer [INDEX-1]),
one ``[layers, units, width * rows]`` tensor per part name for a state group."""


def held_region(
    layout: StageLayout,
    model: ModelShape,
    group: int,
    rank: int,
    *,
    seq_len: int,
    block_size: int,
    receiving: bool,
) -> Region:
    """What stage-local ``rank`` holds of ``group`` for a ``seq_len``-token request; a
    receiver of a sliding-window group holds only its block-aligned window [WINDOW-1], of a
    chunked local-attention group only its current chunk [LOCAL-1]. ``block_size`` is this
    side's own: a sender holds its window aligned to its blocks, every older token of the
    group evicted [WINDOW-2], so both sides keep only their own window and ``receiving``
    names the side for the caller without changing the region."""
    kind = model.layer_groups[group]
    mine = set(model.group_layers(group))
    if isinstance(kind, FullAttention):
        own = rank_ownership(layout, group_view(model, kind), rank, seq_len=seq_len)
        tokens = own.tokens if own.tokens is not None else Tokens.span(0, seq_len)
        # Either side keeps only its own block-aligned window [WINDOW-1, LOCAL-1, WINDOW-2].
        needed = needed_tokens(kind, seq_len, block_size)
        if needed is not None:
            tokens = tokens.intersect(needed)
        layers = tuple(layer for layer in own.layers if layer in mine)
        return Region(group, layers, heads=own.heads, tokens=tokens)
    where = layout.locate(rank)
    stage = layer_ranges(layout, model.num_layers)[where.pp_rank]
    state = state_group(model, group)
    units = part_units(state, layout.attn_tp, where.attn_tp_rank)
    return Region(
        group,
        tuple(layer for layer in stage if layer in mine),
        units=tuple(units.items()),
        offsets=tuple(part_offsets(state, layout.attn_tp).items()),
    )


def fill(
    model: ModelShape,
    region: Region,
    request_id: str,
    *,
    layout: StageLayout,
    rank: int,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> GroupData:
    """The oracle's values of ``region`` [ORACLE-1, ORACLE-4]."""
    if region.per_token:  # so its group is attention
        group = cast(FullAttention, model.layer_groups[region.group])
        view = group_view(model, group)
        assert region.tokens is not None
        index = _index_fill(group, region, request_id, seed=seed, device=device)
        if not region.layers:
            shape = (0, group.kv_tensors, len(region.tokens), len(region.heads or ()))
            kv = torch.empty(*shape, group.head_dim, dtype=torch_dtype(model.dtype))
            return {"kv": kv, **index}
        per_layer = [
            oracle_kv(
                view,
                request_id,
                tokens=region.tokens,
                layers=range(layer, layer + 1),
                heads=region.heads,
                seed=seed,
                device=device,
            ).data
            for layer in region.layers
        ]
        return {"kv": torch.cat(per_layer), **index}
    where = layout.locate(rank)
    return oracle_state(
        model,
        region.group,
        request_id,
        layers=region.layers,
        attn_tp=layout.attn_tp,
        attn_tp_rank=where.attn_tp_rank,
        seed=seed,
        device=device,
    )


def _index_fill(
    group: FullAttention,
    region: Region,
    request_id: str,
    *,
    seed: int,
    device: str | torch.device,
) -> GroupData:
    """The oracle's indexer entries of ``region`` when the group keeps an indexer [INDEX-1]."""
    if not group.index_head_dim:
        return {}
    assert region.tokens is not None
    return oracle_index(
        group.index_head_dim,
        request_id,
        layers=region.layers,
        tokens=region.tokens,
        seed=seed,
        device=device,
    )


@dataclass(frozen=True)
class Piece:
    """One piece an edge carries: KV of (layers, heads, tokens) — or, with ``part`` set
    to an indexer part, that part's entries of (layers, tokens) [INDEX-1] — or one state
    read of ``length`` elements of ``part`` in ``layers[0]`` landing at ``dst_offset``
    [STATE-2]."""

    group: int
    src: int
    dst: int
    layers: tuple[int, ...]
    data: torch.Tensor
    heads: range | None = None
    tokens: Tokens | None = None
    part: str | None = None
    dst_offset: int = 0


def cut(edge: GroupEdge, region: Region, data: GroupData, seq_len: int) -> list[Piece]:
    """The pieces ``edge`` carries, cut from the sender's ``region`` [GROUP-3, STATE-2]."""
    where = {layer: i for i, layer in enumerate(region.layers)}
    missing = [layer for layer in edge.layers if layer not in where]
    if missing:
        raise ValueError(
            f"edge {edge.src}->{edge.dst} of group {edge.group}: the sender "
            f"holds no layer(s) {missing}"
        )
    if region.per_token:
        assert edge.heads is not None and region.heads is not None and region.tokens is not None
        tokens = edge.tokens if edge.tokens is not None else Tokens.span(0, seq_len)
        kv = data["kv"][[where[layer] for layer in edge.layers]]
        first = edge.heads.start - region.heads.start
        kv = kv[:, :, :, first : first + len(edge.heads)]
        positions = tokens.positions_in(region.tokens)
        kv = take_tokens(kv, positions, axis=2)
        pieces = [
            Piece(edge.group, edge.src, edge.dst, edge.layers, kv.contiguous(), edge.heads, tokens)
        ]
        for name in (n for n, _ in INDEX_PARTS if n in data):
            entries = take_tokens(
                data[name][[where[layer] for layer in edge.layers]], positions, axis=1
            )
            pieces.append(
                Piece(
                    edge.group,
                    edge.src,
                    edge.dst,
                    edge.layers,
                    entries.contiguous(),
                    edge.heads,
                    tokens,
                    part=name,
                )
            )
        return pieces
    offsets = dict(region.offsets)
    pieces = []
    for read in edge.reads:
        flat = data[read.part][where[read.layer]].reshape(-1)
        at = read.src_offset - offsets[read.part]
        pieces.append(
            Piece(
                edge.group,
                edge.src,
                edge.dst,
                (read.layer,),
                flat[at : at + read.length].contiguous(),
                part=read.part,
                dst_offset=read.dst_offset,
            )
        )
    return pieces


def empty(model: ModelShape, region: Region, device: str | torch.device = "cpu") -> GroupData:
    """Zeroed buffers for ``region``; counts are kept beside them by :func:`place`."""
    if region.per_token:  # so its group is attention
        group = cast(FullAttention, model.layer_groups[region.group])
        assert region.heads is not None and region.tokens is not None
        shape = (len(region.layers), group.kv_tensors, len(region.tokens), len(region.heads))
        data = {
            "kv": torch.zeros(*shape, group.head_dim, dtype=torch_dtype(model.dtype), device=device)
        }
        if group.index_head_dim:
            widths = index_widths(group.index_head_dim)
            for name, dtype in INDEX_PARTS:
                data[name] = torch.zeros(
                    len(region.layers),
                    len(region.tokens),
                    widths[name],
                    dtype=torch_dtype(dtype),
                    device=device,
                )
        return data
    state = state_group(model, region.group)
    units = dict(region.units)
    return {
        p.name: torch.zeros(
            len(region.layers),
            len(units[p.name]),
            p.unit_elements,
            dtype=torch_dtype(part_dtype(model, state, p.name)),
            device=device,
        )
        for p in state.parts()
    }


def counters(data: GroupData) -> GroupData:
    """How often each element was written: zeros shaped like ``data``'s elements."""
    return {name: torch.zeros(t.shape, dtype=torch.int32) for name, t in data.items()}


def place(piece: Piece, region: Region, into: GroupData, counts: GroupData) -> None:
    """Land ``piece`` in the receiver's ``region``; a piece naming a layer, head, token or
    state element the receiver does not hold is refused [GROUP-3, STATE-2, WINDOW-1]."""
    where = {layer: i for i, layer in enumerate(region.layers)}
    foreign = [layer for layer in piece.layers if layer not in where]
    if foreign:
        raise ValueError(
            f"a piece of group {piece.group} names layer(s) {foreign}, which "
            f"this receiver does not hold (it holds {list(region.layers)[:8]})"
        )
    index = [where[layer] for layer in piece.layers]
    if region.per_token:
        assert piece.heads is not None and piece.tokens is not None
        assert region.heads is not None and region.tokens is not None
        if not (set(piece.heads) <= set(region.heads)):
            raise ValueError(
                f"a piece of group {piece.group} carries heads "
                f"{piece.heads.start}..{piece.heads.stop - 1}; this receiver holds "
                f"{region.heads.start}..{region.heads.stop - 1}"
            )
        if piece.tokens.intersect(region.tokens) != piece.tokens:
            raise ValueError(
                f"a piece of group {piece.group} carries tokens {piece.tokens.describe()}; this "
                f"receiver needs only {region.tokens.describe()} [WINDOW-1]"
            )
        positions = piece.tokens.positions_in(region.tokens)
        if piece.part is not None:  # an indexer part: [layers, tokens, width] [INDEX-1]
            if piece.part not in into or piece.part == "kv":
                raise ValueError(
                    f"a piece of group {piece.group} names part {piece.part!r}; this group "
                    f"keeps {', '.join(n for n in into if n != 'kv') or 'no indexer'} [INDEX-1]"
                )
            for i, layer in enumerate(index):
                put_tokens(into[piece.part][layer], positions, piece.data[i], axis=0)
                seen = counts[piece.part][layer]
                put_tokens(seen, positions, take_tokens(seen, positions, axis=0) + 1, axis=0)
            return
        first = piece.heads.start - region.heads.start
        heads = slice(first, first + len(piece.heads))
        for i, layer in enumerate(index):
            put_tokens(into["kv"][layer, :, :, heads], positions, piece.data[i], axis=1)
            seen = counts["kv"][layer, :, :, heads]
            put_tokens(seen, positions, take_tokens(seen, positions, axis=1) + 1, axis=1)
        return
    assert piece.part is not None
    offsets = dict(region.offsets)
    if piece.part not in offsets:
        raise ValueError(
            f"a piece names state part {piece.part!r}; the group's parts are {', '.join(offsets)}"
        )
    flat = into[piece.part][index[0]].view(-1)
    at = piece.dst_offset - offsets[piece.part]
    if at < 0 or at + piece.data.numel() > flat.numel():
        raise ValueError(
            f"a state read of part {piece.part} at offset {piece.dst_offset} for "
            f"{piece.data.numel()} elements reaches outside this receiver's part "
            f"({offsets[piece.part]}..{offsets[piece.part] + flat.numel() - 1}) [STATE-2]"
        )
    flat[at : at + piece.data.numel()] = piece.data
    counts[piece.part][index[0]].view(-1)[at : at + piece.data.numel()] += 1


def plan_regions(plan: GroupPlan, *, receiving: bool) -> dict[tuple[int, int], Region]:
    """(group, rank) -> what each rank of one side holds, for every group of ``plan``."""
    layout = plan.target if receiving else plan.source
    block_size = plan.receiver_block_size if receiving else plan.sender_block_size  # [WINDOW-2]
    return {
        (group, rank): held_region(
            layout,
            plan.model,
            group,
            rank,
            seq_len=plan.seq_len,
            block_size=block_size,
            receiving=receiving,
        )
        for group in range(len(plan.model.layer_groups))
        for rank in layout.ranks()
    }


def check_region(
    model: ModelShape,
    region: Region,
    got: GroupData,
    counts: GroupData,
    request_id: str,
    *,
    layout: StageLayout,
    rank: int,
    seed: int = 0,
) -> str | None:
    """None when every element of ``region`` arrived exactly once and equals the oracle's
    bit for bit; otherwise what went wrong, in global coordinates [ORACLE-5]."""
    what = f"group {region.group} ({model.layer_groups[region.group].kind})"
    for name, seen in counts.items():
        never, twice = int((seen == 0).sum()), int((seen > 1).sum())
        if never or twice:
            return (
                f"{what}, {name}: {never} of {seen.numel()} elements never arrived, "
                f"{twice} arrived more than once"
            )
    want = fill(model, region, request_id, layout=layout, rank=rank, seed=seed)
    for name, expected in want.items():
        differ = raw_bits(got[name].cpu()) != raw_bits(expected.cpu())
        count = int(differ.sum())
        if count:
            at = [int(i) for i in differ.nonzero()[0]]
            return (
                f"{what}, {name}: {count} of {expected.numel()} elements differ from the oracle; "
                f"first at layer {region.layers[at[0]]}, index {at[1:]} [ORACLE-5]"
            )
    return None
