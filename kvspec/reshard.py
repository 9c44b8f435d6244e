"""Executing a plan on tensors: shard a full KV, send along edges, receive, compare.

The reference representation of one request's KV for the whole model is a tensor
``[num_layers, kv, seq_len, num_kv_heads, head_dim]`` (``kv`` = 2 for K and V, 1 for
an MLA latent). A rank's shard is the same with only its layers and heads
[RESHARD-1]. Senders turn their shard into one :class:`Shipment` per edge, receivers
assemble their shard from the shipments they receive; the result must equal sharding
the full tensor for the target layout, bit for bit [RESHARD-2].

Everything here runs on whatever device the tensors are on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from kvspec._checks import require_choice, require_int
from kvspec.clause import Clause
from kvspec.dtypes import torch_dtype
from kvspec.model import ModelShape
from kvspec.ownership import rank_ownership, stage_ownership
from kvspec.plan import Edge, TransferPlan
from kvspec.slicing import HeadSlice, apply_head_slice, slice_heads
from kvspec.stage import StageLayout

CLAUSES = (
    Clause(
        "RESHARD-1",
        "A rank's shard",
        "The shard of a stage rank is the full request KV [num_layers, kv, seq_len, "
        "num_kv_heads, head_dim] restricted to the layers and heads the rank owns "
        "[HEAD-1..3, LAYER-1..2], in global order.",
    ),
    Clause(
        "RESHARD-2",
        "Resharding reproduces the target's shards",
        "Executing a plan over the source shards of X, in either slicing mode, yields "
        "exactly the target shards of X, bit for bit [DTYPE-2].",
    ),
    Clause(
        "RESHARD-3",
        "A receiver accepts exactly its plan's shipments",
        "A receiver refuses an assembly unless it has exactly one shipment from each of its "
        "plan sources and none from any other rank, each carrying the plan's edge to it, "
        "marked for it [SLICE-3], and of the shape the edge implies (seq_len equal across "
        "shipments). Nothing is dropped, padded or guessed.",
    ),
)

HEAD_AXIS = 3
"""The head axis of the reference representation ``[layers, kv, seq, heads, dim]``."""

SLICING_MODES: tuple[str, ...] = ("sender", "receiver")


@dataclass(frozen=True)
class Shipment:
    """What travels on one edge: the edge, its slice marker and the data.

    ``data`` is ``[len(edge.layers), kv, seq_len, heads, head_dim]``, where ``heads`` is
    the edge's heads once ``marker.applied`` and the sender's whole shard before.
    """

    edge: Edge
    marker: HeadSlice
    data: torch.Tensor


def full_shape(model: ModelShape, seq_len: int) -> tuple[int, int, int, int, int]:
    """Shape of the reference representation of one request [RESHARD-1]."""
    require_int("seq_len", seq_len, minimum=0)
    return (model.num_layers, model.kv_tensors, seq_len, model.num_kv_heads, model.head_dim)


def random_full(
    model: ModelShape, seq_len: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """A full request KV of random bits, NaN payloads and -0.0 included [DTYPE-2]."""
    dtype = torch_dtype(model.dtype)
    bits_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]
    info = torch.iinfo(bits_dtype)
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(
        info.min, info.max, full_shape(model, seq_len), dtype=bits_dtype, generator=generator
    )
    return bits.view(dtype).to(device)


def shard(full: torch.Tensor, layout: StageLayout, model: ModelShape) -> list[torch.Tensor]:
    """The shard of every rank of ``layout``, in rank order [RESHARD-1]."""
    _check_full(full, model)
    return [
        full[r.layers.start : r.layers.stop, :, :, r.heads.start : r.heads.stop]
        for r in stage_ownership(layout, model)
    ]


def send(
    plan: TransferPlan, src: int, local_shard: torch.Tensor, *, slicing: str = "sender"
) -> list[Shipment]:
    """The shipments sender ``src`` puts on each of its edges [SLICE-1, SLICE-2].

    Sender-side slicing sends only the edge's heads, marked applied by the sender;
    receiver-side slicing sends the whole head shard, marked unapplied.
    """
    require_choice("slicing", slicing, SLICING_MODES)
    owner = rank_ownership(plan.source, plan.model, src)
    _check_shard(local_shard, owner.layers, owner.heads, plan.model, "source", src)
    shipments = []
    for edge in plan.edges_from(src):
        first = edge.layers.start - owner.layers.start
        by_layer = local_shard[first : first + len(edge.layers)]
        marker = HeadSlice(
            target_rank=edge.dst,
            from_tp=plan.source.tp,
            to_tp=plan.target.tp,
            offset_in_shard=edge.offset_in_shard,
            num_slices=edge.num_slices,
        )
        if slicing == "sender":
            data = slice_heads(by_layer, edge.offset_in_shard, edge.num_slices, head_axis=HEAD_AXIS)
            marker = replace(marker, applied=True, side="sender")
        else:
            data = by_layer
        shipments.append(Shipment(edge, marker, data))
    return shipments


def receive(plan: TransferPlan, dst: int, shipments: Iterable[Shipment]) -> torch.Tensor:
    """Assemble receiver ``dst``'s shard from its shipments [RESHARD-3, SLICE-3].

    The order in which shipments arrive does not matter.
    """
    owner = rank_ownership(plan.target, plan.model, dst)
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
    seq_lens = {s.data.shape[2] for s in by_src.values() if s.data.dim() == 5}
    if len(seq_lens) > 1:
        raise ValueError(f"shipments to target rank {dst} disagree on seq_len: {sorted(seq_lens)}")
    seq_len = seq_lens.pop() if seq_lens else 0

    result = None
    for src in sorted(by_src):
        shipment = by_src[src]
        data, _ = apply_head_slice(shipment.data, shipment.marker, my_rank=dst, head_axis=HEAD_AXIS)
        edge = shipment.edge
        role = f"shipment from source rank {src} to target"
        _check_shard(data, edge.layers, edge.heads, plan.model, role, dst)
        if result is None:
            shape = (len(owner.layers), plan.model.kv_tensors, seq_len, len(owner.heads))
            result = data.new_empty((*shape, plan.model.head_dim))
        result[
            edge.layers.start - owner.layers.start : edge.layers.stop - owner.layers.start,
            :,
            :,
            edge.heads.start - owner.heads.start : edge.heads.stop - owner.heads.start,
        ] = data
    assert result is not None, "exact cover [PLAN-2] gives every receiver at least one edge"
    return result


def reshard(
    source_shards: Sequence[torch.Tensor], plan: TransferPlan, *, slicing: str = "sender"
) -> list[torch.Tensor]:
    """Run the whole plan: every sender sends, every receiver assembles [RESHARD-2]."""
    if len(source_shards) != plan.source.world_size:
        raise ValueError(
            f"expected {plan.source.world_size} source shards (one per rank of "
            f"{plan.source.describe()}), got {len(source_shards)}"
        )
    inbox: dict[int, list[Shipment]] = {dst: [] for dst in plan.target.ranks()}
    for src, local in enumerate(source_shards):
        for shipment in send(plan, src, local, slicing=slicing):
            inbox[shipment.edge.dst].append(shipment)
    return [receive(plan, dst, inbox[dst]) for dst in plan.target.ranks()]


def _check_full(full: torch.Tensor, model: ModelShape) -> None:
    expected = full_shape(model, full.shape[2] if full.dim() == 5 else 0)
    if full.dim() != 5 or tuple(full.shape) != expected:
        raise ValueError(
            f"full KV must have shape [layers, kv, seq, heads, dim] = {list(expected)} for "
            f"{model.describe()}; got {list(full.shape)}"
        )
    if full.dtype != torch_dtype(model.dtype):
        raise ValueError(f"full KV dtype {full.dtype} != model dtype {model.dtype}")


def _check_shard(
    data: torch.Tensor, layers: range, heads: range, model: ModelShape, role: str, rank: int
) -> None:
    expected = [len(layers), model.kv_tensors, None, len(heads), model.head_dim]
    ok = data.dim() == 5 and all(
        e is None or e == n for e, n in zip(expected, data.shape, strict=True)
    )
    if not ok:
        shown = ["seq" if e is None else e for e in expected]
        raise ValueError(
            f"{role} rank {rank}: expected a tensor of shape {shown} (layers "
            f"{layers.start}..{layers.stop - 1}, heads {heads.start}..{heads.stop - 1}), "
            f"got {list(data.shape)} [RESHARD-3]"
        )
    if data.dtype != torch_dtype(model.dtype):
        raise ValueError(
            f"{role} rank {rank}: dtype {data.dtype} != model dtype {model.dtype} [RESHARD-3]"
        )
