"""Executing a plan on tensors: shard a request's KV, send along edges, receive, compare.

The whole model's KV for one request is a :class:`~kvspec.tensors.kv.RequestKV`; a rank's
shard is the same restricted to the layers, heads and tokens it owns, its tokens in
ascending order [RESHARD-1, CP-1]. Senders turn their shard into one :class:`Shipment`
per edge, receivers assemble their shard from the shipments they receive, placing
heads, layers and tokens by the plan; the result equals sharding the whole KV for the
target layout, bit for bit [RESHARD-2]. Ranks of an attention-DP group the request does
not live on hold an empty shard, send nothing and receive nothing [DP-1].

Everything here runs on whatever device the tensors are on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_choice
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import bit_equal, torch_dtype
from kvspec.tensors.kv import RequestKV, check_request_kv
from kvspec.tensors.slicing import HeadSlice, apply_head_slice, cut_heads
from kvspec.tensors.token_rows import put_tokens, take_tokens
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import RankOwnership, stage_ownership
from kvspec.topology.plan import Edge, TransferPlan
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "RESHARD-1",
        "A rank's shard",
        "The shard of a stage rank is the request's KV [num_layers, kv, seq_len, "
        "num_kv_heads, head_dim] restricted to the layers, heads and tokens the rank owns "
        "[HEAD-1..3, LAYER-1..2, CP-1], in global order, with the scales of those layers "
        "[DTYPE-3].",
        obligations=(
            must("a receiver's shard holds exactly the layers and heads it owns"),
            must("an fp8 shard carries the scales of exactly its layers"),
        ),
    ),
    Clause(
        "RESHARD-2",
        "Resharding reproduces the target's shards",
        "Executing a plan over the source shards of X, in either slicing mode, yields "
        "exactly the target shards of X, bit for bit [DTYPE-2].",
        obligations=(
            must("executing a plan in each slicing mode yields the target shards bit for bit"),
            must("the assembled shard does not depend on the order the shipments arrive in"),
        ),
    ),
    Clause(
        "RESHARD-3",
        "A receiver accepts exactly its plan's shipments",
        "A receiver refuses an assembly unless it has exactly one shipment from each of its "
        "plan sources and none from any other rank, each carrying the plan's edge to it, "
        "marked for it [SLICE-3], and of the shape the edge implies (its token count [SLICE-4]; "
        "seq_len equal across shipments when no stage has token shards). Nothing is dropped, "
        "padded or guessed.",
        obligations=(
            refuses("an assembly missing one of its plan's shipments"),
            refuses("an extra shipment from a rank that is not one of the receiver's plan sources"),
            refuses("a repeated shipment from one source"),
            refuses("a shipment carrying another edge than the plan's edge into the receiver"),
            refuses("shipments whose seq_len differ"),
            refuses(
                "a shipment of another shape than its edge implies (one head or one layer more or "
                "less)"
            ),
        ),
    ),
)

HEAD_AXIS = 3
"""The head axis of ``RequestKV.data``: ``[layers, kv, seq, heads, dim]``."""
TOKEN_AXIS = 2
"""The token axis of ``RequestKV.data``."""

SLICING_MODES: tuple[str, ...] = ("sender", "receiver")


@dataclass(frozen=True)
class Shipment:
    """What travels on one edge: the edge, its slice marker and the KV.

    ``kv`` covers the edge's layers, and its heads once ``marker.applied`` (the
    sender's whole head shard before).
    """

    edge: Edge
    marker: HeadSlice
    kv: RequestKV


def shard(
    full: RequestKV, layout: StageLayout, model: ModelShape, *, dp_rank: int = 0
) -> list[RequestKV]:
    """The shard of every rank of ``layout``, in rank order [RESHARD-1].

    ``dp_rank`` is the attention-DP group the request lives on; the ranks of the other
    groups get an empty shard [DP-1].
    """
    check_request_kv(
        full, model, layers=model.num_layers, heads=model.num_kv_heads, where="the request's KV"
    )
    owners = stage_ownership(layout, model, seq_len=full.seq_len, dp_rank=dp_rank)
    return [own_part(full, owner) for owner in owners]


def own_part(full: RequestKV, owner: RankOwnership) -> RequestKV:
    """The part of a request's whole KV that ``owner`` holds: its layers, heads and tokens
    [RESHARD-1]."""
    part = full.layer_slice(owner.layers.start, owner.layers.stop).head_slice(
        owner.heads.start, owner.heads.stop
    )
    if owner.tokens is None:
        return part
    return RequestKV(take_tokens(part.data, owner.tokens, axis=TOKEN_AXIS), part.scales)


def edge_marker(plan: TransferPlan, edge: Edge, *, applied: bool) -> HeadSlice:
    """The ``tp_head_slice`` marker of a shipment on ``edge`` [SLICE-1, SLICE-3, SLICE-4]:
    the first release's form when the heads are an equal slice, ``heads`` otherwise,
    ``tokens`` when a stage has token shards."""
    heads = None
    if edge.offset_in_shard is None:
        heads = (edge.head_offset, edge.head_offset + len(edge.heads))
    return HeadSlice(
        target_rank=edge.dst,
        from_tp=plan.source.tp,
        to_tp=plan.target.tp,
        offset_in_shard=edge.offset_in_shard,
        num_slices=edge.num_slices,
        applied=applied,
        side="sender" if applied else None,
        heads=heads,
        tokens=edge.tokens,
    )


def _check_tokens(kv: RequestKV, owner: RankOwnership, want: int | None, where: str) -> None:
    """Refuse KV whose token count is not the one its owner holds [RESHARD-3, SLICE-4]."""
    if want is not None and kv.data.dim() == 5 and kv.seq_len != want:
        raise ValueError(
            f"{where} holds {kv.seq_len} tokens, but rank {owner.rank} owns {want} of the "
            "request [RESHARD-3, SLICE-4]"
        )


def send(
    plan: TransferPlan, src: int, local: RequestKV, *, slicing: str = "sender"
) -> list[Shipment]:
    """The shipments sender ``src`` puts on each of its edges [SLICE-1, SLICE-2, SLICE-4].

    Sender-side slicing sends only the edge's heads, marked applied by the sender;
    receiver-side slicing sends the whole head shard, marked unapplied. Layers and
    tokens are always cut by the sender.
    """
    require_choice("slicing", slicing, SLICING_MODES)
    owner = plan.owner("source", src)
    if not owner.active:
        return []  # the request lives on another attention-DP group [DP-1]
    check_request_kv(
        local,
        plan.model,
        layers=len(owner.layers),
        heads=len(owner.heads),
        where=f"source rank {src}'s shard",
    )
    own = None if owner.tokens is None else len(owner.tokens)
    _check_tokens(local, owner, own, f"source rank {src}'s shard")
    shipments = []
    for edge in plan.edges_from(src):
        first = edge.layers.start - owner.layers.start
        kv = local.layer_slice(first, first + len(edge.layers))
        if edge.tokens is not None and owner.tokens is not None and edge.tokens != owner.tokens:
            positions = edge.tokens.positions_in(owner.tokens)
            kv = RequestKV(take_tokens(kv.data, positions, axis=TOKEN_AXIS), kv.scales)
        elif edge.tokens is not None and owner.tokens is None:
            kv = RequestKV(take_tokens(kv.data, edge.tokens, axis=TOKEN_AXIS), kv.scales)
        marker = edge_marker(plan, edge, applied=False)
        if slicing == "sender":
            kv = RequestKV(cut_heads(kv.data, marker, head_axis=HEAD_AXIS), kv.scales)
            marker = replace(marker, applied=True, side="sender")
        shipments.append(Shipment(edge, marker, kv))
    return shipments


def empty_shard(
    plan: TransferPlan, owner: RankOwnership, *, device: str | torch.device = "cpu"
) -> RequestKV:
    """The shard of a receiver that holds no token of the request (or lives on another
    attention-DP group): its layers and heads, no token, and no fp8 scales, since scales
    travel with data and none came [CP-1, DP-1, DTYPE-3]."""
    model = plan.model
    data = torch.empty(
        (len(owner.layers), model.kv_tensors, 0, len(owner.heads), model.head_dim),
        dtype=torch_dtype(model.dtype),
        device=device,
    )
    return RequestKV(data)


def receive(
    plan: TransferPlan,
    dst: int,
    shipments: Iterable[Shipment],
    *,
    out: torch.Tensor | None = None,
) -> RequestKV:
    """Assemble receiver ``dst``'s shard from its shipments [RESHARD-3, SLICE-3, SLICE-4,
    DTYPE-3].

    The order in which shipments arrive does not matter. When one shipment is the whole
    shard, the result is (a view of) its data, not a copy. A receiver with no edge (it
    holds no token of the request, or it lives on another DP group) gets an empty shard.
    ``out``, a preallocated ``[layers, kv, seq_len, heads, head_dim]`` tensor of the
    shipments' dtype and device, receives the shard instead (always a copy, each byte
    moved once) and is the result's data; a shipment whose data already is its place in
    ``out`` (:func:`landing_region`) is checked like any other and moves nothing.
    """
    owner = plan.owner("target", dst)
    by_src = _match_plan(plan, dst, shipments)
    if not by_src:
        return empty_shard(plan, owner)
    seq_lens = sorted({s.kv.data.shape[2] for s in by_src.values() if s.kv.data.dim() == 5})
    if plan.seq_len is None and len(seq_lens) > 1:
        raise ValueError(f"shipments to target rank {dst} disagree on seq_len: {seq_lens}")
    own = _own_tokens(plan, owner, seq_lens[0] if seq_lens else 0)
    mine = owner.tokens if owner.tokens is not None else Tokens.span(0, own)

    data: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    scales_given = torch.zeros(len(owner.layers), dtype=torch.bool)
    for src in sorted(by_src):
        shipment = by_src[src]
        edge = shipment.edge
        where = f"shipment from source rank {src} to target rank {dst}"
        if shipment.marker.tokens != edge.tokens:
            raise ValueError(
                f"{where} is marked as carrying tokens "
                f"{_shown(shipment.marker.tokens)}, but its edge carries "
                f"{_shown(edge.tokens)} [SLICE-4]"
            )
        sliced, _ = apply_head_slice(
            shipment.kv.data, shipment.marker, my_rank=dst, head_axis=HEAD_AXIS
        )
        piece = RequestKV(sliced, shipment.kv.scales)
        check_request_kv(
            piece, plan.model, layers=len(edge.layers), heads=len(edge.heads), where=where
        )
        if edge.tokens is not None and piece.seq_len != len(edge.tokens):
            raise ValueError(
                f"{where} holds {piece.seq_len} tokens; its edge carries {len(edge.tokens)} "
                f"({edge.tokens.describe()}) [RESHARD-3, SLICE-4]"
            )
        if (
            len(by_src) == 1
            and edge.heads == owner.heads
            and edge.layers == owner.layers
            and (edge.tokens is None or edge.tokens == mine)
            and out is None
        ):
            return piece  # one shipment is the whole shard: nothing to place, nothing to copy
        if data is None:
            shape = _shard_shape(plan, owner, own)
            data = sliced.new_empty(shape) if out is None else _check_out(out, shape, sliced, dst)
            if piece.scales is not None:
                scales = piece.scales.new_empty((len(owner.layers), plan.model.kv_tensors))
        target = _region(owner, edge, data)
        layers = slice(
            edge.layers.start - owner.layers.start, edge.layers.stop - owner.layers.start
        )
        if _same_view(target, sliced):
            pass  # already in its place: a receiver's landing buffer [RESHARD-3]
        elif edge.tokens is None:
            copy_bits(target, sliced)  # each byte once, as bits [DTYPE-2]
        else:
            put_tokens(target, edge.tokens.positions_in(mine), sliced, axis=TOKEN_AXIS)
        if scales is not None and piece.scales is not None:
            _merge_scales(scales, scales_given, layers, piece.scales, src, dst)
    assert data is not None, "exact cover [PLAN-2] gives every receiver at least one edge"
    return RequestKV(data, scales)


def _own_tokens(plan: TransferPlan, owner: RankOwnership, seq_len: int) -> int:
    """How many tokens ``owner``'s shard holds: ``seq_len`` (the shipments' own) when every
    shipment carries every token, else what the plan gives it [RESHARD-1, CP-1]."""
    if plan.seq_len is None:
        return seq_len
    return plan.seq_len if owner.tokens is None else len(owner.tokens)


def _shard_shape(plan: TransferPlan, owner: RankOwnership, own: int) -> tuple[int, ...]:
    """``[layers, kv, seq_len, heads, head_dim]`` of ``owner``'s shard of ``own`` tokens
    [RESHARD-1]."""
    model = plan.model
    return (len(owner.layers), model.kv_tensors, own, len(owner.heads), model.head_dim)


def _region(owner: RankOwnership, edge: Edge, data: torch.Tensor) -> torch.Tensor:
    """The view of receiver shard ``data`` holding ``edge``'s layers and heads, every
    token of the shard [RESHARD-3]."""
    start = owner.layers.start
    heads = slice(edge.heads.start - owner.heads.start, edge.heads.stop - owner.heads.start)
    return data[edge.layers.start - start : edge.layers.stop - start, :, :, heads]


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements: nothing to copy between them."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def landing_shape(plan: TransferPlan, dst: int, seq_len: int) -> tuple[int, ...] | None:
    """The shape of receiver ``dst``'s shard when its shipments hold ``seq_len`` tokens
    each, for a buffer :func:`receive` fills through ``out`` [RESHARD-1]; None when
    ``dst`` has no edge (its shard is empty) [CP-1, DP-1]."""
    if not plan.edges_to(dst):
        return None
    owner = plan.owner("target", dst)
    return _shard_shape(plan, owner, _own_tokens(plan, owner, seq_len))


def landing_region(plan: TransferPlan, edge: Edge, out: torch.Tensor) -> torch.Tensor | None:
    """Where :func:`receive` places ``edge``'s shipment in the shard ``out`` (of
    :func:`landing_shape`): a view to copy the shipment's data into beforehand, so that
    receive finds it in place and moves nothing [RESHARD-3, DTYPE-2]. None when the edge
    carries other tokens than the whole shard's, which receive places token by token
    [SLICE-4]."""
    owner = plan.owner("target", edge.dst)
    if edge.tokens is not None and edge.tokens != owner.tokens:
        return None
    return _region(owner, edge, out)


def _shown(tokens: Tokens | None) -> str:
    return "every token" if tokens is None else tokens.describe()


def reshard(
    source_shards: Sequence[RequestKV],
    plan: TransferPlan,
    *,
    slicing: str = "sender",
    out: Sequence[torch.Tensor] | None = None,
) -> list[RequestKV]:
    """Run the whole plan: every sender sends, every receiver assembles [RESHARD-2].

    ``out``, one preallocated tensor per target rank (see :func:`receive`), receives the
    target shards: buffers reused from request to request cost no allocation.
    """
    if len(source_shards) != plan.source.world_size:
        raise ValueError(
            f"expected {plan.source.world_size} source shards (one per rank of "
            f"{plan.source.describe()}), got {len(source_shards)}"
        )
    if out is not None and len(out) != plan.target.world_size:
        raise ValueError(
            f"expected {plan.target.world_size} output tensors (one per rank of "
            f"{plan.target.describe()}), got {len(out)}"
        )
    inbox: dict[int, list[Shipment]] = {dst: [] for dst in plan.target.ranks()}
    for src, local in enumerate(source_shards):
        for shipment in send(plan, src, local, slicing=slicing):
            inbox[shipment.edge.dst].append(shipment)
    return [
        receive(plan, dst, inbox[dst], out=None if out is None else out[dst])
        for dst in plan.target.ranks()
    ]


def _check_out(
    out: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor, dst: int
) -> torch.Tensor:
    """``out`` if it can hold target rank ``dst``'s shard: its shape, dtype and device."""
    if (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != shape
        or out.dtype != like.dtype
        or out.device != like.device
    ):
        got = (
            f"a {out.dtype} tensor of shape {list(out.shape)} on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"out for target rank {dst} must be a {like.dtype} tensor of shape {list(shape)} "
            f"[layers, kv, seq_len, heads, head_dim] on {like.device}; got {got} [RESHARD-1]"
        )
    return out


def _match_plan(plan: TransferPlan, dst: int, shipments: Iterable[Shipment]) -> dict[int, Shipment]:
    """The shipments by sender, refusing any the plan does not list for ``dst`` [RESHARD-3]."""
    expected = {e.src: e for e in plan.edges_to(dst)}
    by_src: dict[int, Shipment] = {}
    for shipment in shipments:
        src = shipment.edge.src
        if src not in expected:
            raise ValueError(
                f"target rank {dst} got a shipment from source rank {src}, which is not one "
                f"of its plan sources {sorted(expected)} [RESHARD-3]"
            )
        if src in by_src:
            raise ValueError(
                f"target rank {dst} got two shipments from source rank {src} [RESHARD-3]"
            )
        if shipment.edge != expected[src]:
            raise ValueError(
                f"shipment from source rank {src} carries edge {shipment.edge} but the plan's "
                f"edge to target rank {dst} is {expected[src]} [RESHARD-3]"
            )
        by_src[src] = shipment
    missing = sorted(set(expected) - set(by_src))
    if missing:
        raise ValueError(
            f"target rank {dst} is missing shipments from source ranks {missing} [RESHARD-3]"
        )
    return by_src


def _merge_scales(
    scales: torch.Tensor,
    given: torch.Tensor,
    layers: slice,
    incoming: torch.Tensor,
    src: int,
    dst: int,
) -> None:
    """Write a shipment's scales; layers another sender already gave must agree [DTYPE-3]."""
    known = given[layers].to(scales.device)
    current = scales[layers]
    if bool(known.any()) and not bit_equal(current[known], incoming[known]):
        raise ValueError(
            f"source rank {src} sends target rank {dst} scales {incoming[known].tolist()} for "
            f"layers another sender gave as {current[known].tolist()} [DTYPE-3]"
        )
    scales[layers] = incoming
    given[layers] = True
