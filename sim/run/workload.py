"""The requests of a run and where each rank keeps them: ids, lengths, chunks, block tables,
the attention-DP groups a router puts them on and the plan that moves each of them.

Everything is derived from the run's seed, so every rank computes the same workload
on its own and nothing but KV travels.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import cached_property

from kvspec.memory.paged import blocks_needed
from kvspec.naming.keys import rank_aware_key
from kvspec.topology.group_plan import GroupPlan, plan_groups
from kvspec.topology.ownership import RankOwnership, rank_ownership
from kvspec.topology.plan import TransferPlan, plan_transfer
from kvspec.transport.streaming import layer_groups, stream_key
from sim.run.config import SimConfig


@dataclass(frozen=True)
class Request:
    """One request: its id, length and the token ranges of its chunks."""

    request_id: str
    index: int
    seq_len: int
    chunks: tuple[range, ...]


@dataclass(frozen=True)
class Workload:
    """The requests of one replica group."""

    config: SimConfig
    replica: int

    @cached_property
    def requests(self) -> tuple[Request, ...]:
        return self.first(self.config.requests)

    def first(self, count: int) -> tuple[Request, ...]:
        """The group's first ``count`` requests (at most all of them), exactly as
        :attr:`requests` holds them, without drawing the rest: a check that needs only the
        first few stays O(count) however many requests the run has."""
        rng = random.Random(f"{self.config.seed}:requests")
        low, high = self.config.seq_len
        out = []
        for i in range(min(count, self.config.requests)):
            seq_len = rng.randint(low, high)
            out.append(
                Request(
                    # Replicas serve different requests; ids never contain the legacy key head.
                    request_id=f"req-{self.replica}-{i:04d}",
                    index=i,
                    seq_len=seq_len,
                    chunks=split_tokens(seq_len, self.config.chunks),
                )
            )
        return tuple(out)

    def dp_rank(self, stage: int, request: Request) -> int:
        """The attention-DP group the router puts ``request`` on at ``stage``: requests go
        round the groups of each stage in turn, so every pair of groups meets [DP-1]."""
        before = math.prod(layout.dp for layout in self.config.stages[:stage])
        return (request.index // before) % self.config.stages[stage].dp

    def owner(self, stage: int, rank: int, request: Request) -> RankOwnership:
        """What ``rank`` of ``stage`` holds of ``request``: its heads, layers and tokens, or
        nothing on another DP group [CP-1, DP-1]."""
        return rank_ownership(
            self.config.stages[stage],
            self.config.model,
            rank,
            seq_len=request.seq_len,
            dp_rank=self.dp_rank(stage, request),
        )

    def held(self, stage: int, rank: int, request: Request) -> int:
        """How many of ``request``'s tokens ``rank`` of ``stage`` holds."""
        owner = self.owner(stage, rank, request)
        return owner.token_count(request.seq_len) if owner.active else 0

    def plans(self, stage: int) -> PlanBook:
        """The plans from ``stage`` to ``stage + 1`` for this group's requests."""
        return PlanBook(self, stage)

    def block_order(self, stage: int, rank: int) -> list[int]:
        """Every block id of one rank's cache, shuffled: the order blocks are handed out,
        so block ids and token order never coincide by accident; a few spare blocks
        belong to no request."""
        _, block_size = self.config.layout_of(stage)
        total = sum(blocks_needed(r.seq_len, block_size) for r in self.requests) + 2
        rng = random.Random(f"{self.config.seed}:{self.replica}:{stage}:{rank}:blocks")
        order = list(range(total))
        rng.shuffle(order)
        return order

    def block_table(self, stage: int, rank: int) -> tuple[int, dict[str, list[int]]]:
        """(number of blocks, block ids per request) of a rank that holds every request
        from the start (stage 0); receivers allocate from :meth:`block_order` as requests
        arrive (:mod:`sim.cache.pool`)."""
        _, block_size = self.config.layout_of(stage)
        order = self.block_order(stage, rank)
        tables, start = {}, 0
        for request in self.requests:
            n = blocks_needed(self.held(stage, rank, request), block_size)
            tables[request.request_id] = order[start : start + n]
            start += n
        return len(order), tables


def split_tokens(seq_len: int, chunks: int) -> tuple[range, ...]:
    """``chunks`` contiguous, non-empty token ranges covering ``range(seq_len)``."""
    base, extra = divmod(seq_len, chunks)
    out, start = [], 0
    for i in range(chunks):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return tuple(out)


@dataclass(frozen=True)
class PairKey:
    """One keyed message of a hybrid request: everything sender ``src`` sends receiver
    ``dst`` of it, every layer group's pieces together, or (streamed) those of the layers
    of stream group ``stream`` [GROUP-3, STREAM-1.2, KEY-4]."""

    key: str
    src: int
    dst: int
    stream: int | None = None
    """The stream layer group the message carries (None: the whole request)."""


@dataclass
class PlanBook:
    """The plans of one stage pair (``stage`` -> ``stage + 1``) for a group's requests.

    Stages without token shards or attention DP have one plan for every request; others
    have one per request length and DP ranks [PLAN-6, DP-1], made once each. A run of
    ``groups`` content (a hybrid model) moves each request by its group plan instead
    (:meth:`groups_of`, one per request length [GROUP-3, WINDOW-1]), and its keys,
    connections and planned bytes are the plan's (source, receiver) pairs.
    """

    workload: Workload
    stage: int
    _plans: dict[tuple[int | None, int, int], TransferPlan] = field(default_factory=dict)
    _group_plans: dict[int, GroupPlan] = field(default_factory=dict)

    @property
    def hybrid(self) -> bool:
        """Whether the run's requests move as layer-group parts (:mod:`sim.run.content`)."""
        return self.workload.config.content == "groups"

    def of(self, request: Request) -> TransferPlan:
        """The plan that moves ``request``."""
        config, stage = self.workload.config, self.stage
        if self.hybrid:
            raise ValueError(
                f"{config.model.describe()} moves by group plans [GROUP-3]: PlanBook.groups_of"
            )
        source, target = config.stages[stage], config.stages[stage + 1]
        sharded = source.token_shards > 1 or target.token_shards > 1
        key = (
            request.seq_len if sharded else None,
            self.workload.dp_rank(stage, request),
            self.workload.dp_rank(stage + 1, request),
        )
        if key not in self._plans:
            self._plans[key] = plan_transfer(
                source,
                target,
                config.transfer_model,  # a record cache's rows [LAYOUT-7]
                policy=config.policy,
                seq_len=request.seq_len,
                source_dp=key[1],
                target_dp=key[2],
            )
        return self._plans[key]

    def groups_of(self, request: Request) -> GroupPlan:
        """The group plan of a hybrid ``request``, each stage's windows aligned to its own
        block size [GROUP-3, WINDOW-1, WINDOW-2]; one per request length."""
        if request.seq_len not in self._group_plans:
            config, stage = self.workload.config, self.stage
            self._group_plans[request.seq_len] = plan_groups(
                config.stages[stage],
                config.stages[stage + 1],
                config.model,
                seq_len=request.seq_len,
                source_block_size=config.layout_of(stage)[1],
                target_block_size=config.layout_of(stage + 1)[1],
                policy=config.policy,
            )
        return self._group_plans[request.seq_len]

    def pairs_of(self, request: Request) -> tuple[tuple[int, int], ...]:
        """The (source, receiver) pairs some group edge of ``request`` joins, ascending."""
        if self.hybrid:
            return tuple(sorted({(e.src, e.dst) for e in self.groups_of(request).edges}))
        return tuple((e.src, e.dst) for e in self.of(request).edges)

    def pair_keys(self, request: Request) -> tuple[PairKey, ...]:
        """Every keyed message of a hybrid ``request``: one per pair, or streamed one per
        pair and stream layer group holding some layer of the pair's edges [KEY-4,
        STREAM-1.2]. Sender and receiver both take theirs from here."""
        config = self.workload.config
        rid, streams = request.request_id, config.stream_groups
        if not streams:
            return tuple(
                PairKey(rank_aware_key(rid, self.stage, 0, src, dst), src, dst)
                for src, dst in self.pairs_of(request)
            )
        ranges = layer_groups(config.model.num_layers, streams)
        layers: dict[tuple[int, int], set[int]] = {}
        for e in self.groups_of(request).edges:
            layers.setdefault((e.src, e.dst), set()).update(e.layers)
        return tuple(
            PairKey(stream_key(rid, self.stage, 0, g, streams, src, dst), src, dst, g)
            for (src, dst), held in sorted(layers.items())
            for g, span in enumerate(ranges)
            if any(layer in span for layer in held)
        )

    def sources_of(self, rank: int) -> tuple[int, ...]:
        """Every source rank ``rank`` receives some request from, ascending [PLAN-3]."""
        found = {s for r in self.workload.requests for s, d in self.pairs_of(r) if d == rank}
        return tuple(sorted(found))

    def targets_of(self, rank: int) -> tuple[int, ...]:
        """Every target rank ``rank`` sends some request to, ascending [PLAN-3]."""
        found = {d for r in self.workload.requests for s, d in self.pairs_of(r) if s == rank}
        return tuple(sorted(found))


def edge_chunks(tokens: int, chunks: int) -> tuple[range, ...]:
    """The chunks of one edge's payload: ``chunks`` ranges of its token positions, fewer
    when the edge carries fewer tokens (with token shards an edge may carry few)."""
    return split_tokens(tokens, max(1, min(chunks, tokens)))
