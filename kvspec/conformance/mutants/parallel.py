"""Mutants of the second release's layouts: attention groups, token shards, DP ranks and
TP pairs that do not divide [STAGE-2, CP-1, CP-3, PLAN-6, DP-1, SLICE-1, SLICE-4,
ORACLE-4, PORT-1].

Each is the reference with one rule written the way the field writes it: TensorRT-LLM's
rank order, vLLM's interleave size dropped, a stride that reads another shard's tokens
(vLLM #38433), a plan cached per topology, the first release's equal-slice arithmetic
applied to TP4 -> TP6, SGLang's destination-contiguous packing taken for placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.naming.keys import recv_keys, send_keys
from kvspec.naming.ports import PortScheme, port
from kvspec.strategies import TransferCase
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import oracle_kv
from kvspec.tensors.reshard import Shipment
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import owned_heads
from kvspec.topology.plan import TransferPlan
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

# -- attention groups [STAGE-2] --------------------------------------------------------------


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


# -- token rules [CP-1, CP-3] ----------------------------------------------------------------


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


# -- plans, routing and keys [PLAN-6, DP-1] --------------------------------------------------


@mutant("PLAN-6.3")
class PlanCachedPerTopology(ReferenceAdapter):
    """Caches the plan per (layouts, model, policy), so the second request of the same
    layouts reuses the first one's token sets, whatever its length."""

    def __init__(self) -> None:
        self._plans: dict[Any, TransferPlan] = {}

    def plan(self, case: TransferCase) -> TransferPlan:
        key = (case.source, case.target, case.model, case.policy, case.source_dp, case.target_dp)
        if key not in self._plans:
            self._plans[key] = super().plan(case)
        return self._plans[key]


@mutant("DP-1.1")
class RouterChoiceIgnored(ReferenceAdapter):
    """Plans every request between DP group 0 of each stage, whatever DP ranks the router
    chose."""

    def plan(self, case: TransferCase) -> TransferPlan:
        return super().plan(replace(case, source_dp=0, target_dp=0))


def _group_local(layout: StageLayout, rank: int) -> int:
    """A rank's index within its attention-DP group."""
    if layout.dp == 1:
        return rank
    width = layout.tp // layout.dp
    where = layout.locate(rank)
    return where.pp_rank * width + where.tp_rank % width


@mutant("DP-1.2")
class GroupLocalKeyRanks(ReferenceAdapter):
    """Names the ranks of a key by their index within the DP group, so the key of DP group
    1's rank 0 is DP group 0's rank 0's."""

    def _local(self, case: TransferCase, keys: Sequence[tuple[str, int]]) -> list:
        if case.source.dp == 1 and case.target.dp == 1:
            return list(keys)
        out = []
        for key, other in keys:
            request, stage, chunk, src, dst = key.rsplit("_", 4)
            src = str(_group_local(case.source, int(src)))
            dst = str(_group_local(case.target, int(dst)))
            out.append(("_".join((request, stage, chunk, src, dst)), other))
        return out

    def send_keys(self, case: TransferCase, request_id: str, src: int, **stages: Any):
        return self._local(case, send_keys(self.plan(case), request_id, src, **stages))

    def recv_keys(self, case: TransferCase, request_id: str, dst: int, **stages: Any):
        return self._local(case, recv_keys(self.plan(case), request_id, dst, **stages))


@mutant("PLAN-6.1", "SLICE-1.3")
class EqualSliceArithmetic(ReferenceAdapter):
    """Cuts every edge as an equal slice (offset = head_offset // heads), the first
    release's arithmetic, which TP4 -> TP6 breaks: heads 1..2 of a 3-head shard become 0..1."""

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        out = super().sender_transform(case, src, shard, slicing)
        if slicing != "sender":
            return out
        whole = super().sender_transform(case, src, shard, "receiver")
        plan = self.plan(case)
        for dst in out:
            edge = plan.edge(src, dst)
            if edge.offset_in_shard is None:
                width = len(edge.heads)
                offset = min(edge.head_offset // width, edge.shard_heads // width - 1)
                out[dst] = whole[dst].head_slice(offset * width, (offset + 1) * width)
        return out


@mutant("PLAN-6.2")
class WholeTokenShardOnEveryEdge(ReferenceAdapter):
    """Sends its whole token shard on every edge, leaving the receiver to pick its tokens."""

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        out = super().sender_transform(case, src, shard, slicing)
        owner = case.owner("source", src)
        if owner.tokens is None and not case.sharded:
            return out
        plan = self.plan(case)
        for dst in list(out):
            edge = plan.edge(src, dst)
            first = edge.layers.start - owner.layers.start
            kv = shard.layer_slice(first, first + len(edge.layers))
            if slicing == "sender":
                start = edge.head_offset
                kv = kv.head_slice(start, start + len(edge.heads))
            out[dst] = kv
        return out


# -- markers and placement [SLICE-1, SLICE-4] ------------------------------------------------


@mutant("SLICE-1.3")
class HeadRangeReadAsSlice(ReferenceAdapter):
    """Reads a marker's heads [a, b) as slice a // (b - a) of equal slices of b - a heads."""

    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        marker = shipment.marker
        if marker.heads is None or marker.applied:
            return super().apply_marker(case, dst, shipment)
        start, stop = marker.heads
        width = stop - start
        offset = min(start // width, shipment.kv.data.shape[3] // width - 1)
        kv = shipment.kv.head_slice(offset * width, (offset + 1) * width)
        return replace(shipment, kv=kv, marker=replace(marker, applied=True, side="receiver"))


@mutant("SLICE-4.1")
class TokensPackedBySource(ReferenceAdapter):
    """Places each source's tokens one after another in source order (SGLang's DCP1 -> DCP-N
    destination-contiguous packing taken as the layout), not at their positions."""

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        kv = super().receiver_combine(case, dst, shipments)
        owner = case.owner("target", dst)
        mine = owner.tokens if owner.tokens is not None else Tokens.span(0, kv.seq_len)
        order: list[int] = []  # receiver positions, in the order the sources send them
        for shipment in sorted(shipments, key=lambda s: s.edge.src):
            if shipment.edge.tokens is not None:
                for position in shipment.edge.tokens.positions_in(mine).tokens():
                    if position not in order:
                        order.append(position)
        if len(order) != kv.seq_len:
            return kv
        return RequestKV(kv.data[:, :, order], kv.scales)


@mutant("SLICE-4.2")
class MarkerTokensIgnored(ReferenceAdapter):
    """Places tokens by the plan alone and never reads the token ranges a payload's marker
    names, so a payload marked with other tokens is placed as if it had its edge's."""

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        trusted = [
            replace(s, marker=replace(s.marker, tokens=s.edge.tokens))
            if isinstance(s.marker, HeadSlice)
            else s
            for s in shipments
        ]
        return super().receiver_combine(case, dst, trusted)


# -- the oracle and ports [ORACLE-4, PORT-1] -------------------------------------------------


@mutant("ORACLE-4.3")
class TokenSetFilledByPosition(ReferenceAdapter):
    """Fills a token set by its local positions 0..n-1, the classic context-parallel oracle
    bug: every rank fills the request's first tokens."""

    def oracle_fill(self, model: ModelShape, request_id: str, **region: Any) -> RequestKV:
        tokens = region["tokens"]
        if isinstance(tokens, Tokens):
            region = {**region, "tokens": range(len(tokens))}
        return oracle_kv(model, request_id, **region)


@mutant("PORT-1.2")
class DpTermDropped(ReferenceAdapter):
    """Binds every rank at its stage-local rank, even under a scheme with a dp_stride."""

    def stage_port(
        self,
        base: int,
        stage: int,
        layout: StageLayout,
        rank: int,
        replica: int,
        scheme: PortScheme,
    ) -> int:
        return port("kv", base, stage, rank, replica, scheme=scheme)
