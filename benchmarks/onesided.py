"""The sim's one-sided path against the library itself: ``--transport nixl --transfer
write`` against raw NIXL WRITEs of the very same descriptor lists, and what a
descriptor's size costs NIXL (1 KiB against 256 KiB descriptors, the same bytes).

**sim over NIXL vs raw NIXL.** The sim runs TP4 -> TP2 (verification after transfer, no
checksums); its figure is the useful throughput from the first key sent to the last
received. The baseline, in the same session, is two NIXL agents in this process moving
every key's list (:func:`kvspec.memory.descriptors.plan_runs` over the same workload and
registrations, the same byte counts and offsets) as one WRITE with a notification each,
one in flight at a time, each waited for by progressing both agents: NIXL with nothing
of the sim around it. ``REPEAT`` of each (three at most: a sim run starts six
processes), the sim's first: the sim forks its ranks, and a process that has started UCX
must not fork, so the two sides cannot interleave as the other benchmarks do.

**descriptor size.** One WRITE of the same bytes as 1 KiB descriptors and as 256 KiB
ones, interleaved: the per-descriptor cost NIXL (UCX over TCP loopback here) adds.

Both need NIXL (``pip install 'kvspec[nixl]'``); without it they are left out, saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from benchmarks import figure
from benchmarks.figure import Figure
from kvspec.memory.descriptors import Runs, plan_runs, share_positions
from kvspec.memory.paged import blocks_needed
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.cluster import run_simulation
from sim.config import ONE_SIDED_LIBRARIES, SimConfig
from sim.onesided_checks import quiet_engines, unloadable
from sim.regions import registered_cache
from sim.workload import Workload

KIB = 1024


def _config(quick: bool) -> SimConfig:
    seq_len = 64 if quick else 512
    return SimConfig(
        stages=(StageLayout(4), StageLayout(2)),
        model=ModelShape(num_layers=4, num_kv_heads=4, head_dim=128),
        requests=4 if quick else 8,
        seq_len=(seq_len, seq_len),
        verify_after=True,
        checksum=False,
        ports="os",
        timeout=600,
        transport="nixl",
        transfer="write",
    )


def _lists(config: SimConfig) -> list[tuple[int, int, Runs]]:
    """Every key's runs in the run: (source rank, target rank, runs), as the sim computes
    them (one chunk, no token shards)."""
    workload = Workload(config, 0)
    book = workload.plans(0)
    out = []
    for request in workload.requests:
        plan = book.of(request)
        for edge in plan.edges:
            source = registered_cache(config, workload, 0, edge.src)
            target = registered_cache(config, workload, 1, edge.dst)
            tokens = range(request.seq_len)
            share = share_positions(plan, edge, tokens)
            src_ids = workload.block_table(0, edge.src)[1][request.request_id]
            dst_ids = workload.block_table(1, edge.dst)[1][request.request_id]
            src_ids = src_ids[: blocks_needed(share.source_slots, source.block_size)]
            dst_ids = dst_ids[: blocks_needed(share.target_slots, target.block_size)]
            out.append(
                (
                    edge.src,
                    edge.dst,
                    plan_runs(plan, edge, source, src_ids, target, dst_ids, tokens),
                )
            )
    return out


class _Pair:
    """Two NIXL agents in this process, each registering the regions of its ranks."""

    def __init__(
        self, config: SimConfig, extra: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """``extra``: a (source, target) pair of buffers registered too."""
        quiet_engines()
        from nixl_cu12 import nixl_agent, nixl_agent_config

        workload = Workload(config, 0)
        conf = nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        self.sender, self.receiver = nixl_agent("bench-src", conf), nixl_agent("bench-dst", conf)
        self.bases: dict[tuple[int, int], list[int]] = {}
        self.memory: list[torch.Tensor] = []
        for stage, agent in ((0, self.sender), (1, self.receiver)):
            for rank in range(config.stages[stage].world_size):
                sizes = registered_cache(config, workload, stage, rank).regions().values()
                regions = [torch.ones(n, dtype=torch.uint8) for n in sizes]
                self.memory += regions
                rows = np.array([[t.data_ptr(), t.numel(), 0] for t in regions], dtype=np.uint64)
                agent.register_memory(rows, "DRAM")
                self.bases[(stage, rank)] = [t.data_ptr() for t in regions]
        if extra is not None:
            self.sender.register_memory(extra[0])
            self.receiver.register_memory(extra[1])
        self.sender.add_remote_agent(self.receiver.get_agent_metadata())
        self.receiver.add_remote_agent(self.sender.get_agent_metadata())

    def write(self, local: np.ndarray, remote: np.ndarray, notif: bytes = b"k") -> None:
        """One WRITE with a notification, waited for by progressing both agents."""
        agent = self.sender
        handle = agent.initialize_xfer(
            "WRITE",
            agent.get_xfer_descs(local, "DRAM"),
            agent.get_xfer_descs(remote, "DRAM"),
            "bench-dst",
            notif,
        )
        state, told = agent.transfer(handle), False
        deadline = time.monotonic() + 60
        while state == "PROC" or not told:  # the receiver's side must progress too
            told = told or bool(self.receiver.get_new_notifs())
            if state == "PROC":
                state = agent.check_xfer_state(handle)
            if time.monotonic() > deadline:
                raise RuntimeError(f"a raw NIXL WRITE did not complete in 60 s ({state})")
        if state != "DONE":
            raise RuntimeError(f"a raw NIXL WRITE ended {state}")
        agent.release_xfer_handle(handle)

    def rows(
        self,
        stage: int,
        rank: int,
        region: torch.Tensor,
        offset: torch.Tensor,
        length: torch.Tensor,
    ) -> np.ndarray:
        bases = np.array(self.bases[(stage, rank)], dtype=np.int64)
        lengths = length.numpy().astype(np.int64)
        return np.stack(
            [bases[region.numpy()] + offset.numpy(), lengths, np.zeros_like(lengths)], axis=1
        ).astype(np.uint64)


def _raw(config: SimConfig, pair: _Pair) -> Callable[[], None]:
    lists = [
        (
            pair.rows(0, src, runs.src_region, runs.src_offset, runs.length),
            pair.rows(1, dst, runs.dst_region, runs.dst_offset, runs.length),
        )
        for src, dst, runs in _lists(config)
    ]

    def move() -> None:
        for local, remote in lists:
            pair.write(local, remote)

    return move


def _sim_vs_raw(quick: bool) -> Figure:
    config = _config(quick)
    moved, sim_s, raw_s = 0, [], []
    # Not interleaved: the sim forks its rank processes, and a process that has started
    # UCX must not fork (its children hang), so every sim run goes before NIXL starts here.
    for _ in range(min(figure.REPEAT, 3)):
        report = run_simulation(replace(config))
        assert report.ok, report.render()
        moved = report.bytes_moved
        sim_s.append(report.transfer_s)
    raw = _raw(config, _Pair(config))
    raw()  # warm: connections made, pages touched
    raw_s = [figure.timed(raw) for _ in sim_s]
    mine, theirs = figure.Spread.of(sim_s), figure.Spread.of(raw_s)
    return Figure(
        name=f"sim TP4->TP2 write over NIXL ({moved >> 10} KiB)",
        unit="GB/s",
        value=moved / mine.median / 1e9,
        baseline=moved / theirs.median / 1e9,
        baseline_name="raw NIXL WRITEs of the same descriptor lists",
        ratio=theirs.median / mine.median,
        note="one WRITE per key; UCX over TCP loopback; no checksums, verification after; "
        "the sim's runs first, not interleaved (UCX must not fork)",
        value_range=(moved / mine.high / 1e9, moved / mine.low / 1e9),
        repeats=len(sim_s),
    )


def _descriptor_cost(quick: bool) -> Figure:
    nbytes = (2 if quick else 16) << 20
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    pair = _Pair(_config(True), (src, dst))

    def lists(size: int) -> tuple[Any, Any]:
        starts = np.arange(0, nbytes, size, dtype=np.uint64)
        row = np.full_like(starts, size)
        zero = np.zeros_like(starts)
        local = np.stack([starts + src.data_ptr(), row, zero], axis=1)
        remote = np.stack([starts + dst.data_ptr(), row, zero], axis=1)
        return local, remote

    small, large = lists(KIB), lists(256 * KIB)
    return figure.compare(
        f"NIXL WRITE as 1 KiB descriptors ({nbytes >> 20} MiB)",
        nbytes,
        lambda: pair.write(*small),
        lambda: pair.write(*large),
        "the same bytes as 256 KiB descriptors",
        "one WRITE each; what a descriptor costs NIXL over UCX (TCP loopback)",
        repeat=min(figure.REPEAT, 5),
        reference=True,
    )


def run(quick: bool) -> list[Figure]:
    why = unloadable(ONE_SIDED_LIBRARIES["nixl"][0])
    if why is not None:
        print(f"benchmarks.onesided: left out: NIXL {why}", flush=True)
        return []
    return [_sim_vs_raw(quick), _descriptor_cost(quick)]
