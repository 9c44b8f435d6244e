"""Mutants of who owns which heads and layers [STAGE-1, HEAD-1..3, LAYER-1..2]."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import owned_heads
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens


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


@mutant("STAGE-2.1")
class CpInnermostRankOrder(ReferenceAdapter):
    """Numbers a pipeline stage's ranks TensorRT-LLM's way, context-parallel rank fastest
    (tp_rank * cp + cp_rank), instead of SGLang's (dp, cp, tp) with tp fastest."""

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        heads, layers = super().owned(layout, model, rank)
        if layout.cp == 1:
            return heads, layers
        tp_rank = layout.coords(rank)[1]
        attn_tp_rank = (tp_rank // layout.cp) % layout.attn_tp
        return owned_heads(model.num_kv_heads, layout.attn_tp, attn_tp_rank), layers


@mutant("STAGE-2.2")
class HeadsOverWholeTp(ReferenceAdapter):
    """Splits heads over all tp ranks of the stage, as if attention-DP and context-parallel
    groups did not exist (``local_heads * tp`` counting)."""

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        heads, layers = super().owned(layout, model, rank)
        try:
            return owned_heads(model.num_kv_heads, layout.tp, layout.coords(rank)[1]), layers
        except ValueError:
            return heads, layers


def _blocks(shard: int, shards: int, seq_len: int, size: int) -> list[range]:
    return [
        range(b * size, min((b + 1) * size, seq_len))
        for b in range(shard, -(-seq_len // size), shards)
    ]


class _TokenMutant(ReferenceAdapter):
    """The reference, with one token rule replaced by :meth:`tokens`."""

    kind = ""

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        raise NotImplementedError

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        if layout.token_shards == 1 or layout.rule.kind != self.kind:
            return super().owned_tokens(layout, model, rank, seq_len)
        return self.tokens(layout, layout.token_shard(rank), seq_len)


@mutant("CP-1.1")
class ContiguousRemainderToLast(_TokenMutant):
    """contiguous:B gives the leftover blocks to the last shards, not the first ones."""

    kind = "contiguous"

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        n, size = layout.token_shards, layout.rule.size
        blocks = -(-seq_len // size)
        each, extra = divmod(blocks, n)
        first = shard * each + max(0, shard - (n - extra))
        count = each + (1 if shard >= n - extra else 0)
        return [range(first * size, min((first + count) * size, seq_len))]


@mutant("CP-1.2")
class InterleaveSizeDropped(_TokenMutant):
    """Drops cp_kv_cache_interleave_size: interleave:I deals single tokens (t % n)."""

    kind = "interleave"

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        return _blocks(shard, layout.token_shards, seq_len, 1)


@mutant("CP-1.2")
class StrideReadsNextShard(_TokenMutant):
    """Computes an interleaved shard's offset with the next rank's index, so each rank
    reads its neighbour's tokens (the PCP stride bug of vLLM #38433)."""

    kind = "interleave"

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        n = layout.token_shards
        return _blocks((shard + 1) % n, n, seq_len, layout.rule.size)


@mutant("CP-1.3")
class RoundRobinByTokens(_TokenMutant):
    """round_robin_blocks:B deals tokens, not blocks of B tokens."""

    kind = "round_robin_blocks"

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        return _blocks(shard, layout.token_shards, seq_len, 1)


@mutant("CP-1.4")
class ZigzagRemainderToLast(_TokenMutant):
    """zigzag gives the leftover tokens to the last segments, not the first ones."""

    kind = "zigzag"

    def tokens(self, layout: StageLayout, shard: int, seq_len: int) -> list[range]:
        segments = 2 * layout.token_shards
        base, extra = divmod(seq_len, segments)

        def segment(i: int) -> range:
            start = i * base + max(0, i - (segments - extra))
            return range(start, start + base + (1 if i >= segments - extra else 0))

        return [segment(shard), segment(segments - 1 - shard)]


@mutant("CP-3.1")
class DcpRanksBlocked(ReferenceAdapter):
    """Forms DCP groups from blocks of attention-TP ranks (dcp_rank = attn_tp_rank //
    (attn_tp / dcp)) instead of consecutive ranks (attn_tp_rank % dcp)."""

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        if layout.dcp == 1:
            return super().owned_tokens(layout, model, rank, seq_len)
        where = layout.locate(rank)
        dcp_rank = where.attn_tp_rank // (layout.attn_tp // layout.dcp)
        shard = where.cp_rank * layout.dcp + dcp_rank
        return list(layout.rule.tokens(shard, layout.token_shards, seq_len).ranges)


@mutant("CP-3.2")
class DcpReplicasKeepEveryToken(ReferenceAdapter):
    """Treats DCP as splitting attention compute only: every replica of a head keeps all
    the tokens of its context-parallel group."""

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        if layout.dcp == 1:
            return super().owned_tokens(layout, model, rank, seq_len)
        cp_rank = layout.locate(rank).cp_rank
        shards = range(cp_rank * layout.dcp, (cp_rank + 1) * layout.dcp)
        held = Tokens.of(
            r for s in shards for r in layout.rule.tokens(s, layout.token_shards, seq_len).ranges
        )
        return list(held.ranges)
