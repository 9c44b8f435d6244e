"""The sim's one-sided paths against the libraries themselves: ``--transport nixl
--transfer write`` against raw NIXL WRITEs of the very same descriptor lists, the same for
``--transport mooncake`` against raw Mooncake batch writes, and what a descriptor's size
costs NIXL (1 KiB against 256 KiB descriptors, the same bytes).

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

**sim over Mooncake vs raw Mooncake.** The same workload and lists through two Mooncake
transfer engines in this process (TCP loopback, P2P handshake), each key's list in
``batch_transfer_sync_write`` calls no longer than the engine's queue, as the sim posts
them (:func:`sim.paths.mooncake.batch_transfer`).

Each needs its library (``pip install 'kvspec[nixl]'``, ``'kvspec[mooncake]'``); without
one its figures are left out, saying so.
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
from sim.harness.cluster import run_simulation
from sim.paths.mooncake import batch_transfer
from sim.paths.onesided_checks import quiet_engines, unloadable
from sim.paths.regions import registered_cache
from sim.run.config import ONE_SIDED_LIBRARIES, SimConfig
from sim.run.workload import Workload

KIB = 1024


def _config(quick: bool, transport: str = "nixl") -> SimConfig:
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
        transport=transport,
        transfer="write",
        # the benchmark's host is the user's own; Mooncake's engine lets anyone in
        allow_unauthenticated_transport=transport == "mooncake",
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


def _regions(config: SimConfig) -> dict[tuple[int, int], list[torch.Tensor]]:
    """(stage, rank) -> buffers the size of that rank's registered regions, in order."""
    workload = Workload(config, 0)
    return {
        (stage, rank): [
            torch.ones(n, dtype=torch.uint8)
            for n in registered_cache(config, workload, stage, rank).regions().values()
        ]
        for stage in (0, 1)
        for rank in range(config.stages[stage].world_size)
    }


def _rows(
    bases: dict[tuple[int, int], list[int]],
    stage: int,
    rank: int,
    region: torch.Tensor,
    offset: torch.Tensor,
    length: torch.Tensor,
) -> np.ndarray:
    """A run list as (address, length, 0) rows in ``rank``'s registered buffers."""
    base = np.array(bases[(stage, rank)], dtype=np.int64)
    lengths = length.numpy().astype(np.int64)
    return np.stack(
        [base[region.numpy()] + offset.numpy(), lengths, np.zeros_like(lengths)], axis=1
    ).astype(np.uint64)


def _key_lists(
    config: SimConfig, bases: dict[tuple[int, int], list[int]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every key's (local, remote) rows, as the sim's write path posts them."""
    return [
        (
            _rows(bases, 0, src, runs.src_region, runs.src_offset, runs.length),
            _rows(bases, 1, dst, runs.dst_region, runs.dst_offset, runs.length),
        )
        for src, dst, runs in _lists(config)
    ]


class _Pair:
    """Two NIXL agents in this process, each registering the regions of its ranks."""

    def __init__(
        self, config: SimConfig, extra: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """``extra``: a (source, target) pair of buffers registered too."""
        quiet_engines()
        from nixl_cu12 import nixl_agent, nixl_agent_config

        conf = nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        self.sender, self.receiver = nixl_agent("bench-src", conf), nixl_agent("bench-dst", conf)
        self.memory = _regions(config)
        self.bases = {key: [t.data_ptr() for t in ts] for key, ts in self.memory.items()}
        for (stage, _), regions in self.memory.items():
            rows = np.array([[t.data_ptr(), t.numel(), 0] for t in regions], dtype=np.uint64)
            (self.sender if stage == 0 else self.receiver).register_memory(rows, "DRAM")
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


def _raw(config: SimConfig, pair: _Pair) -> Callable[[], None]:
    lists = _key_lists(config, pair.bases)

    def move() -> None:
        for local, remote in lists:
            pair.write(local, remote)

    return move


class _MooncakePair:
    """Two Mooncake transfer engines in this process (TCP loopback, P2P handshake), each
    registering the regions of its stage's ranks."""

    def __init__(self, config: SimConfig) -> None:
        quiet_engines()
        from mooncake.engine import TransferEngine

        self.sender, self.receiver = TransferEngine(), TransferEngine()
        for engine in (self.sender, self.receiver):
            if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("a Mooncake transfer engine did not start on 127.0.0.1")
        self.memory = _regions(config)
        self.bases = {key: [t.data_ptr() for t in ts] for key, ts in self.memory.items()}
        for (stage, _), regions in self.memory.items():
            engine = self.sender if stage == 0 else self.receiver
            for t in regions:
                if engine.register_memory(t.data_ptr(), t.numel()) != 0:
                    raise RuntimeError(f"Mooncake refused to register {t.numel()} bytes")
        self.peer = f"127.0.0.1:{self.receiver.get_rpc_port()}"

    def write(self, local: np.ndarray, remote: np.ndarray) -> None:
        """The list in batch writes, each waited for (Mooncake's Python API blocks), no
        longer than the engine's queue, as the sim posts them (:func:`batch_transfer`)."""
        failed = batch_transfer(self.sender.batch_transfer_sync_write, self.peer, local, remote)
        if failed is not None:
            raise RuntimeError(f"a raw Mooncake write failed: {failed}")


def _sim_runs(config: SimConfig) -> tuple[int, list[float]]:
    """The bytes one sim run moves, and each run's transfer time (``REPEAT``, three at
    most: a run starts six processes)."""
    moved, seconds = 0, []
    for _ in range(min(figure.REPEAT, 3)):
        report = run_simulation(replace(config))
        assert report.ok, report.render()
        moved = report.bytes_moved
        seconds.append(report.transfer_s)
    return moved, seconds


def _sim_vs_raw(
    label: str, moved: int, sim_s: list[float], raw: Callable[[], None], baseline_name: str
) -> Figure:
    raw()  # warm: connections made, pages touched
    raw_s = [figure.timed(raw) for _ in sim_s]
    mine, theirs = figure.Spread.of(sim_s), figure.Spread.of(raw_s)
    return Figure(
        name=f"sim TP4->TP2 write over {label} ({moved >> 10} KiB)",
        unit="GB/s",
        value=moved / mine.median / 1e9,
        baseline=moved / theirs.median / 1e9,
        baseline_name=baseline_name,
        ratio=theirs.median / mine.median,
        note="one transfer per key; TCP loopback; no checksums, verification after; "
        "the sim's runs first, not interleaved (a process that started UCX must not fork)",
        value_range=(moved / mine.high / 1e9, moved / mine.low / 1e9),
        repeats=len(sim_s),
    )


def _raw_mooncake(config: SimConfig) -> Callable[[], None]:
    pair = _MooncakePair(config)
    lists = _key_lists(config, pair.bases)

    def move() -> None:
        for local, remote in lists:
            pair.write(local, remote)

    return move


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
    missing = {
        name: why
        for name, (module, _) in ONE_SIDED_LIBRARIES.items()
        if (why := unloadable(module)) is not None
    }
    for name, why in missing.items():
        print(f"benchmarks.onesided: left out: {name} {why}", flush=True)
    # Every sim run first: the sim forks its ranks, and once UCX (or Mooncake's threads)
    # run in this process it must not fork.
    runs = {
        name: (_config(quick, name), *_sim_runs(_config(quick, name)))
        for name in ("nixl", "mooncake")
        if name not in missing
    }
    figures = []
    if "mooncake" in runs:
        config, moved, seconds = runs["mooncake"]
        raw = _raw_mooncake(config)
        figures.append(
            _sim_vs_raw(
                "Mooncake", moved, seconds, raw, "raw Mooncake batch writes of the same lists"
            )
        )
    if "nixl" in runs:
        config, moved, seconds = runs["nixl"]
        raw = _raw(config, _Pair(config))
        figures.append(
            _sim_vs_raw("NIXL", moved, seconds, raw, "raw NIXL WRITEs of the same descriptor lists")
        )
        figures.append(_descriptor_cost(quick))
    return figures
