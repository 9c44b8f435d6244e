"""Which rank owns which KV heads and which layers.

Heads are split over the TP ranks of a stage [HEAD-1], or replicated when there are
fewer heads than ranks [HEAD-2]; MLA's latent is one head held by every TP rank
[HEAD-3]. Layers are split over the PP ranks in contiguous partitions [LAYER-1,
LAYER-2]. :func:`rank_ownership` combines both for one stage-local rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec._checks import require_int, require_rank
from kvspec.clause import Clause, must, refuses
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "HEAD-1",
        "Heads split over TP ranks",
        "With H total KV heads and tp ranks, H >= tp requires H % tp == 0; TP rank r owns "
        "the contiguous heads [r*H/tp, (r+1)*H/tp).",
        obligations=(
            must("with H >= tp, TP rank r owns the contiguous heads [r*H/tp, (r+1)*H/tp)"),
            refuses("H >= tp with H % tp != 0"),
        ),
    ),
    Clause(
        "HEAD-2",
        "Heads replicated when H < tp",
        "With H < tp, tp % H == 0 is required; TP rank r owns the single head r // (tp/H), "
        "so each head is replicated on tp/H consecutive ranks. Any (H, tp) that satisfies "
        "neither HEAD-1 nor HEAD-2 is refused with both numbers in the error.",
        obligations=(
            must("with H < tp, TP rank r owns the single head r // (tp/H)"),
            refuses("H < tp with tp % H != 0"),
        ),
    ),
    Clause(
        "HEAD-3",
        "MLA latent on every TP rank",
        "An MLA latent (one head, [MODEL-2]) is identical on every TP rank of a pipeline "
        "stage, i.e. HEAD-2 with H = 1; a receiver needs each layer of it from exactly one "
        "sender.",
        obligations=(
            must("every TP rank of a pipeline stage holds the whole MLA latent of its layers"),
            must("a receiver takes each layer of the latent from exactly one sender"),
        ),
    ),
    Clause(
        "LAYER-1",
        "Default layer partition",
        "With n layers over pp pipeline ranks (n >= pp is required), each partition gets "
        "n // pp layers and the remainder n % pp is added one layer each to partitions -2, "
        "-3, ... (counting from the end); the last partition never gets an extra layer. "
        "Partitions are contiguous and in order.",
        obligations=(
            must(
                "n // pp layers each, the remainder added one each to partitions -2, -3, ...; "
                "contiguous and in order"
            ),
            refuses("fewer layers than pipeline ranks"),
        ),
    ),
    Clause(
        "LAYER-2",
        "Explicit layer partition",
        "An explicit partition gives one positive layer count per PP rank; the counts must "
        "sum to num_layers. PP rank p owns the contiguous layers after those of ranks 0..p-1.",
        obligations=(
            must(
                "PP rank p owns the contiguous layers after those of ranks 0..p-1 of the explicit "
                "partition"
            ),
            refuses("an explicit partition whose counts do not sum to num_layers"),
            refuses("an explicit partition with a count below 1"),
            refuses("an explicit partition with another number of entries than pp"),
        ),
    ),
)


def check_heads(num_kv_heads: int, tp: int) -> None:
    """Refuse an (H, tp) pair that is neither split [HEAD-1] nor replicated [HEAD-2] evenly."""
    require_int("num_kv_heads", num_kv_heads, minimum=1)
    require_int("tp", tp, minimum=1)
    if num_kv_heads >= tp and num_kv_heads % tp != 0:
        raise ValueError(
            f"{num_kv_heads} KV heads cannot be split over TP {tp}: with heads >= tp, "
            f"heads % tp must be 0, but {num_kv_heads} % {tp} = {num_kv_heads % tp} [HEAD-1]"
        )
    if num_kv_heads < tp and tp % num_kv_heads != 0:
        raise ValueError(
            f"{num_kv_heads} KV heads cannot be replicated over TP {tp}: with heads < tp, "
            f"tp % heads must be 0, but {tp} % {num_kv_heads} = {tp % num_kv_heads} [HEAD-2]"
        )


def owned_heads(num_kv_heads: int, tp: int, tp_rank: int) -> range:
    """The global KV heads TP rank ``tp_rank`` holds [HEAD-1, HEAD-2, HEAD-3]."""
    check_heads(num_kv_heads, tp)
    require_rank("tp_rank", tp_rank, tp)
    if num_kv_heads >= tp:
        per_rank = num_kv_heads // tp
        return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    head = tp_rank // (tp // num_kv_heads)
    return range(head, head + 1)


def head_replicas(num_kv_heads: int, tp: int, head: int) -> range:
    """The TP ranks that hold ``head``: one rank [HEAD-1] or tp/H consecutive ones [HEAD-2]."""
    check_heads(num_kv_heads, tp)
    require_rank("head", head, num_kv_heads)
    if num_kv_heads >= tp:
        rank = head // (num_kv_heads // tp)
        return range(rank, rank + 1)
    copies = tp // num_kv_heads
    return range(head * copies, (head + 1) * copies)


def default_layer_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per PP rank under the default rule [LAYER-1].

    >>> default_layer_partition(61, 2)
    (31, 30)
    >>> default_layer_partition(10, 4)
    (2, 3, 3, 2)
    """
    require_int("num_layers", num_layers, minimum=1)
    require_int("pp", pp, minimum=1)
    if num_layers < pp:
        raise ValueError(
            f"{num_layers} layers cannot be partitioned over PP {pp}: every pipeline rank "
            f"needs at least one layer, so num_layers must be >= pp [LAYER-1]"
        )
    counts = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        counts[-2 - i] += 1
    return tuple(counts)


def layer_partition(layout: StageLayout, num_layers: int) -> tuple[int, ...]:
    """Layers per PP rank: the layout's explicit partition [LAYER-2] or the default [LAYER-1]."""
    if layout.layer_partition is None:
        return default_layer_partition(num_layers, layout.pp)
    total = sum(layout.layer_partition)
    if total != num_layers:
        raise ValueError(
            f"layer_partition {list(layout.layer_partition)} covers {total} layers but the "
            f"model has num_layers={num_layers}; the counts must sum to {num_layers} [LAYER-2]"
        )
    return layout.layer_partition


def layer_ranges(layout: StageLayout, num_layers: int) -> tuple[range, ...]:
    """The contiguous layer range of each PP rank, in order [LAYER-1, LAYER-2]."""
    ranges = []
    start = 0
    for count in layer_partition(layout, num_layers):
        ranges.append(range(start, start + count))
        start += count
    return tuple(ranges)


@dataclass(frozen=True)
class RankOwnership:
    """What one stage-local rank holds: its coordinates, heads and layers."""

    rank: int
    pp_rank: int
    tp_rank: int
    heads: range
    layers: range


def rank_ownership(layout: StageLayout, model: ModelShape, rank: int) -> RankOwnership:
    """The heads and layers stage-local ``rank`` owns [STAGE-1, HEAD-1..3, LAYER-1..2]."""
    pp_rank, tp_rank = layout.coords(rank)
    return RankOwnership(
        rank=rank,
        pp_rank=pp_rank,
        tp_rank=tp_rank,
        heads=owned_heads(model.num_kv_heads, layout.tp, tp_rank),
        layers=layer_ranges(layout, model.num_layers)[pp_rank],
    )


def stage_ownership(layout: StageLayout, model: ModelShape) -> tuple[RankOwnership, ...]:
    """:func:`rank_ownership` for every rank of the stage, in rank order."""
    check_heads(model.num_kv_heads, layout.tp)
    layer_ranges(layout, model.num_layers)  # validate once, before the per-rank loop
    return tuple(rank_ownership(layout, model, rank) for rank in layout.ranks())
