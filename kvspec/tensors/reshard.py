"""Executing a plan on tensors: shard a request's KV, send along edges, receive, compare.

The whole model's KV for one request is a :class:`~kvspec.tensors.kv.RequestKV`; a rank's
shard is the same restricted to the layers and heads it owns [RESHARD-1]. Senders
turn their shard into one :class:`Shipment` per edge, receivers assemble their shard
from the shipments they receive; the result equals sharding the whole KV for the
target layout, bit for bit [RESHARD-2].

Everything here runs on whatever device the tensors are on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from kvspec._checks import require_choice
from kvspec.clause import Clause, must, refuses
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import bit_equal
from kvspec.tensors.kv import RequestKV, check_request_kv
from kvspec.tensors.slicing import HeadSlice, apply_head_slice, slice_heads
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership, stage_ownership
from kvspec.topology.plan import Edge, TransferPlan
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "RESHARD-1",
        "A rank's shard",
        "The shard of a stage rank is the request's KV [num_layers, kv, seq_len, "
        "num_kv_heads, head_dim] restricted to the layers and heads the rank owns "
        "[HEAD-1..3, LAYER-1..2], in global order, with the scales of those layers "
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
        "marked for it [SLICE-3], and of the shape the edge implies (seq_len equal across "
        "shipments). Nothing is dropped, padded or guessed.",
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


def shard(full: RequestKV, layout: StageLayout, model: ModelShape) -> list[RequestKV]:
    """The shard of every rank of ``layout``, in rank order [RESHARD-1]."""
    check_request_kv(
        full, model, layers=model.num_layers, heads=model.num_kv_heads, where="the request's KV"
    )
    return [
        full.layer_slice(r.layers.start, r.layers.stop).head_slice(r.heads.start, r.heads.stop)
        for r in stage_ownership(layout, model)
    ]


def send(
    plan: TransferPlan, src: int, local: RequestKV, *, slicing: str = "sender"
) -> list[Shipment]:
    """The shipments sender ``src`` puts on each of its edges [SLICE-1, SLICE-2].

    Sender-side slicing sends only the edge's heads, marked applied by the sender;
    receiver-side slicing sends the whole head shard, marked unapplied.
    """
    require_choice("slicing", slicing, SLICING_MODES)
    owner = rank_ownership(plan.source, plan.model, src)
    check_request_kv(
        local,
        plan.model,
        layers=len(owner.layers),
        heads=len(owner.heads),
        where=f"source rank {src}'s shard",
    )
    shipments = []
    for edge in plan.edges_from(src):
        first = edge.layers.start - owner.layers.start
        kv = local.layer_slice(first, first + len(edge.layers))
        marker = HeadSlice(
            target_rank=edge.dst,
            from_tp=plan.source.tp,
            to_tp=plan.target.tp,
            offset_in_shard=edge.offset_in_shard,
            num_slices=edge.num_slices,
        )
        if slicing == "sender":
            data = slice_heads(kv.data, edge.offset_in_shard, edge.num_slices, head_axis=HEAD_AXIS)
            kv = RequestKV(data, kv.scales)
            marker = replace(marker, applied=True, side="sender")
        shipments.append(Shipment(edge, marker, kv))
    return shipments


def receive(
    plan: TransferPlan,
    dst: int,
    shipments: Iterable[Shipment],
    *,
    out: torch.Tensor | None = None,
) -> RequestKV:
    """Assemble receiver ``dst``'s shard from its shipments [RESHARD-3, SLICE-3, DTYPE-3].

    The order in which shipments arrive does not matter. When one shipment is the whole
    shard, the result is (a view of) its data, not a copy. ``out``, a preallocated
    ``[layers, kv, seq_len, heads, head_dim]`` tensor of the shipments' dtype and device,
    receives the shard instead (always a copy, each byte moved once) and is the result's
    data.
    """
    owner = rank_ownership(plan.target, plan.model, dst)
    by_src = _match_plan(plan, dst, shipments)
    seq_lens = sorted({s.kv.data.shape[2] for s in by_src.values() if s.kv.data.dim() == 5})
    if len(seq_lens) > 1:
        raise ValueError(f"shipments to target rank {dst} disagree on seq_len: {seq_lens}")

    data: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    scales_given = torch.zeros(len(owner.layers), dtype=torch.bool)
    for src in sorted(by_src):
        shipment = by_src[src]
        edge = shipment.edge
        sliced, _ = apply_head_slice(
            shipment.kv.data, shipment.marker, my_rank=dst, head_axis=HEAD_AXIS
        )
        piece = RequestKV(sliced, shipment.kv.scales)
        check_request_kv(
            piece,
            plan.model,
            layers=len(edge.layers),
            heads=len(edge.heads),
            where=f"shipment from source rank {src} to target rank {dst}",
        )
        layers = slice(
            edge.layers.start - owner.layers.start, edge.layers.stop - owner.layers.start
        )
        heads = slice(edge.heads.start - owner.heads.start, edge.heads.stop - owner.heads.start)
        whole = edge.heads == owner.heads and edge.layers == owner.layers
        if len(by_src) == 1 and whole and out is None:
            return piece  # one shipment is the whole shard: nothing to place, nothing to copy
        if data is None:
            shape = (len(owner.layers), plan.model.kv_tensors, seq_lens[0], len(owner.heads))
            shape += (plan.model.head_dim,)
            data = sliced.new_empty(shape) if out is None else _check_out(out, shape, sliced, dst)
            if piece.scales is not None:
                scales = piece.scales.new_empty((len(owner.layers), plan.model.kv_tensors))
        copy_bits(data[layers, :, :, heads], sliced)  # each byte once, as bits [DTYPE-2]
        if scales is not None and piece.scales is not None:
            _merge_scales(scales, scales_given, layers, piece.scales, src, dst)
    assert data is not None, "exact cover [PLAN-2] gives every receiver at least one edge"
    return RequestKV(data, scales)


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
