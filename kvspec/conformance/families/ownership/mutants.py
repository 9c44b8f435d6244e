"""Mutants of who owns which heads and layers [STAGE-1, HEAD-1..3, LAYER-1..2]."""

from __future__ import annotations

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


@mutant("STAGE-1.1")
class TpMajorRankNumbering(ReferenceAdapter):
    """Numbers stage ranks TP-major (rank = tp_rank * pp + pp_rank), as some launchers do."""

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        tp_rank, pp_rank = divmod(rank, layout.pp)
        return super().owned(layout, model, layout.rank(pp_rank, tp_rank))


@mutant("HEAD-1.1")
class StridedHeadSplit(ReferenceAdapter):
    """Deals heads round-robin (rank r gets heads r, r+tp, ...) instead of a contiguous block."""

    def owned(self, layout, model, rank):
        heads, layers = super().owned(layout, model, rank)
        if model.attention == "mha" and model.num_kv_heads >= layout.tp:
            tp_rank = layout.coords(rank)[1]
            return list(range(tp_rank, model.num_kv_heads, layout.tp)), layers
        return heads, layers


@mutant("HEAD-2.1")
class ReplicatedHeadsRoundRobin(ReferenceAdapter):
    """With H < tp, gives rank r head r % H instead of r // (tp/H)."""

    def owned(self, layout, model, rank):
        heads, layers = super().owned(layout, model, rank)
        if model.attention == "mha" and model.num_kv_heads < layout.tp:
            head = layout.coords(rank)[1] % model.num_kv_heads
            return range(head, head + 1), layers
        return heads, layers


@mutant("HEAD-3.1")
class MlaSplitLikeHeads(ReferenceAdapter):
    """Treats the MLA latent as if only TP rank 0 held it."""

    def owned(self, layout, model, rank):
        heads, layers = super().owned(layout, model, rank)
        if model.attention == "mla" and layout.coords(rank)[1] > 0:
            return range(0), layers
        return heads, layers


@mutant("LAYER-1.1")
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


@mutant("LAYER-1.1")
class PipelineRemainderToFirst(ReferenceAdapter):
    """Gives the PP remainder to the first partitions (0, 1, ...), the common alternative."""

    def owned(self, layout, model, rank):
        heads, layers = super().owned(layout, model, rank)
        if layout.layer_partition is not None:
            return heads, layers
        base, extra = divmod(model.num_layers, layout.pp)
        pp_rank = layout.coords(rank)[0]
        start = pp_rank * base + min(pp_rank, extra)
        return heads, range(start, start + base + (pp_rank < extra))


@mutant("LAYER-2.1")
class IgnoresExplicitPartition(ReferenceAdapter):
    """Always uses the default partition."""

    def owned(self, layout, model, rank):
        return super().owned(StageLayout(layout.tp, layout.pp), model, rank)
