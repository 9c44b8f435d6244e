"""The requests of a run and where each rank keeps them: ids, lengths, chunks, block tables.

Everything is derived from the run's seed, so every rank computes the same workload
on its own and nothing but KV travels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

from kvspec.memory.paged import blocks_needed
from sim.config import SimConfig


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
        rng = random.Random(f"{self.config.seed}:requests")
        low, high = self.config.seq_len
        out = []
        for i in range(self.config.requests):
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
        arrive (:mod:`sim.pool`)."""
        _, block_size = self.config.layout_of(stage)
        order = self.block_order(stage, rank)
        tables, start = {}, 0
        for request in self.requests:
            n = blocks_needed(request.seq_len, block_size)
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
