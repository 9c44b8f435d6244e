"""Layer-wise streaming: a request's KV sent layer group by layer group, as it is computed.

A prefill computes a request one layer at a time; a sender that streams sends each
layer's KV as soon as it exists instead of after the last layer, so the transfer
overlaps the compute of the layers after it. The model's layers are cut into ``G``
contiguous groups [STREAM-1.1] (``G = num_layers``: one group per layer). Group ``g``
of token chunk ``c`` travels, on every edge that carries some of its layers, as the
edge's payload restricted to those layers (None elsewhere), under the rank-aware key
[KEY-1] of chunk id ``c * G + g`` [STREAM-1.2]: every group of every chunk has a key of
its own, and :func:`stream_position` recovers ``(c, g)``. A receiver places a group as
soon as each source's part of it has arrived, by the plan restricted to the group's
layers [STREAM-1.3], so the first layers are usable while later ones are in flight.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from kvspec.core.clause import Clause, must
from kvspec.core.require import require_int
from kvspec.naming.keys import rank_aware_key
from kvspec.tensors.kv import RequestKV
from kvspec.topology.plan import TransferPlan
from kvspec.transport.payload import (
    CACHE_FIELDS,
    SCALE_FIELDS,
    Payload,
    merge_to_request_kv,
)

CLAUSES = (
    Clause(
        "STREAM-1",
        "Layer-wise streaming: groups, keys and placement",
        "A streamed transfer cuts the model's layers 0..L-1 into G contiguous, non-empty "
        "groups in layer order whose sizes differ by at most one, the larger first "
        "(1 <= G <= L; G = L streams layer by layer). Group g of token chunk c is sent, on "
        "every edge carrying some of its layers, as the edge's payload restricted to those "
        "layers (None elsewhere), under the rank-aware key [KEY-1] of chunk id c*G + g — "
        "for every transfer, two single-rank stages included — so (c, g) = divmod(chunk id, "
        "G). A receiver places a group from each source's part of it, in any arrival order, "
        "by the plan restricted to the group's layers; the result equals the group's layers "
        "of the shard it would merge from the whole payloads [PAYLOAD-3].",
        obligations=(
            must(
                "the groups cut layers 0..L-1 into G contiguous, non-empty groups in order, "
                "sizes differing by at most one, the larger first"
            ),
            must(
                "group g of chunk c is sent under the rank-aware key of chunk id c*G + g, "
                "even between two single-rank stages"
            ),
            must(
                "a group placed from its parts, in any arrival order, equals that group's "
                "layers of the shard merged from the whole payloads"
            ),
        ),
    ),
)


def layer_groups(num_layers: int, groups: int) -> tuple[range, ...]:
    """Layers ``0..num_layers-1`` in ``groups`` contiguous groups, the larger first [STREAM-1.1]."""
    require_int("num_layers", num_layers, minimum=1)
    require_int("groups", groups, minimum=1)
    if groups > num_layers:
        raise ValueError(
            f"cannot cut {num_layers} layer(s) into {groups} non-empty groups; choose "
            f"1..{num_layers} groups [STREAM-1]"
        )
    base, extra = divmod(num_layers, groups)
    out, start = [], 0
    for g in range(groups):
        stop = start + base + (1 if g < extra else 0)
        out.append(range(start, stop))
        start = stop
    return tuple(out)


def stream_chunk_id(chunk_id: int, group: int, groups: int) -> int:
    """The key's chunk id of group ``group`` of token chunk ``chunk_id`` [STREAM-1.2]."""
    require_int("groups", groups, minimum=1)
    require_int("chunk_id", chunk_id, minimum=0)
    require_int("group", group, minimum=0)
    if group >= groups:
        raise ValueError(f"group {group} is not one of the {groups} groups 0..{groups - 1}")
    return chunk_id * groups + group


def stream_position(key_chunk_id: int, groups: int) -> tuple[int, int]:
    """``(token chunk, group)`` of a streamed key's chunk id: the inverse [STREAM-1.2]."""
    require_int("groups", groups, minimum=1)
    require_int("chunk id", key_chunk_id, minimum=0)
    chunk, group = divmod(key_chunk_id, groups)
    return chunk, group


def stream_key(
    request_id: str,
    from_stage: int,
    chunk_id: int,
    group: int,
    groups: int,
    from_rank: int,
    to_rank: int,
) -> str:
    """The key of one group of one chunk on edge ``from_rank -> to_rank`` [STREAM-1.2, KEY-1]."""
    return rank_aware_key(
        request_id, from_stage, stream_chunk_id(chunk_id, group, groups), from_rank, to_rank
    )


def group_layers(layers: range, group: range) -> range:
    """The layers of ``layers`` that lie in ``group`` (possibly none)."""
    return range(max(layers.start, group.start), max(min(layers.stop, group.stop), group.start))


def layer_part(payload: Payload, group: range) -> Payload | None:
    """``payload`` restricted to the layers of ``group``; None when it carries none of
    them [STREAM-1]. Tensors are the payload's own (views), nothing is copied."""
    keep = [layer for layer in payload.layers if layer in group]
    if not keep:
        return None

    def cut(
        values: tuple[torch.Tensor | None, ...] | None,
    ) -> tuple[torch.Tensor | None, ...] | None:
        if values is None:
            return None
        return tuple(t if i in group else None for i, t in enumerate(values))

    fields: dict[str, Any] = {  # by name
        name: cut(getattr(payload, name)) for name in (*CACHE_FIELDS, *SCALE_FIELDS)
    }
    return replace(payload, **fields)


def layer_plan(plan: TransferPlan, group: range) -> TransferPlan:
    """``plan`` restricted to the layers of ``group``: each edge keeps its layers in the
    group, an edge with none is dropped [STREAM-1.3]."""
    edges = []
    for e in plan.edges:
        layers = group_layers(e.layers, group)
        if len(layers):
            edges.append(replace(e, layers=layers))
    return replace(plan, edges=tuple(edges))


def group_sources(plan: TransferPlan, dst: int, group: range) -> tuple[int, ...]:
    """The sources whose edge into ``dst`` carries some layer of ``group``, ascending."""
    return tuple(e.src for e in plan.edges_to(dst) if len(group_layers(e.layers, group)))


def merge_layers(
    plan: TransferPlan, dst: int, group: range, received: Iterable[tuple[int, Payload]]
) -> RequestKV:
    """Receiver ``dst``'s shard on the layers it owns in ``group``, from each source's part
    of the group, in any order [STREAM-1.3, PAYLOAD-3]."""
    owner = plan.owner("target", dst)
    mine = group_layers(owner.layers, group)
    if not len(mine):
        raise ValueError(
            f"target rank {dst} owns layers {owner.layers.start}..{owner.layers.stop - 1}, none "
            f"in the group {group.start}..{group.stop - 1} [STREAM-1]"
        )
    kv = merge_to_request_kv(layer_plan(plan, group), dst, received)
    start = mine.start - owner.layers.start
    return kv.layer_slice(start, start + len(mine))
