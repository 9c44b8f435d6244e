"""What a run needs, computed before it starts: memory, and the largest message each
socket may accept.

Both come from the configuration's real sizes, so a hostile peer cannot make a rank
buffer more than the run itself would send, and a run that cannot fit in memory is
refused up front with the estimate instead of failing minutes later.
"""

from __future__ import annotations

import os

from kvspec.memory.paged import blocks_needed
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import Edge
from sim.net import messages
from sim.run.config import SimConfig
from sim.run.workload import Workload

PROCESS_OVERHEAD = 80 << 20
"""Resident memory of one rank-hosting process beyond its caches (torch, zmq, Python)."""
HEADER_SLACK = 64 << 10
"""Room for a wire header, an envelope or a handshake beyond the payload's own bytes."""


def cache_bytes(config: SimConfig) -> int:
    """Bytes of every rank's paged cache, every stage and replica group, at the longest
    request length (each rank holds every request of its group); of a hybrid, of its group
    regions."""
    if config.content == "groups":
        # A hybrid's group regions: each receiver holds exactly what its group plan moves
        # to it [GROUP-3]; the senders about as much again.
        workload = Workload(config, 0)
        longest = max(workload.requests, key=lambda r: r.seq_len)
        return 2 * config.requests * workload.plans(0).groups_of(longest).nbytes() * config.replicas
    model, total = config.model, 0
    for stage, layout in enumerate(config.stages):
        _, block_size = config.layout_of(stage)
        slots = config.requests * blocks_needed(config.seq_len[1], block_size) * block_size
        for rank in layout.ranks():
            owner = rank_ownership(layout, model, rank)
            per_slot = len(owner.layers) * len(owner.heads) * config.cell_bytes
            total += slots * per_slot
    return total * config.replicas


def estimated_memory(config: SimConfig) -> int:
    """The run's peak memory, roughly: the caches, once more for what is in flight and
    being assembled, and each process's own overhead."""
    ranks = sum(s.world_size for s in config.stages) * config.replicas
    processes = 1 if config.transport == "inproc" else -(-ranks // config.ranks_per_process)
    return 2 * cache_bytes(config) + (processes + 1) * PROCESS_OVERHEAD


def available_memory() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo``, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config: SimConfig, *, fraction: float = 0.8) -> None:
    """Refuse a run whose estimated memory exceeds ``fraction`` of what is available."""
    need, have = estimated_memory(config), available_memory()
    if have is not None and need > fraction * have:
        raise ValueError(
            f"the run needs about {need / 2**30:.1f} GiB ({config.requests} request(s) of up to "
            f"{config.seq_len[1]} tokens on {sum(s.world_size for s in config.stages)} ranks x "
            f"{config.replicas} group(s)); {have / 2**30:.1f} GiB is available. Use fewer or "
            "shorter requests, fewer replicas or a smaller model"
        )


def max_data_frame(config: SimConfig) -> int:
    """The largest frame a receiver of this run can legitimately get: one layer's K (or
    V, or latent) of the longest request, every head a sender holds, plus header room."""
    model = config.transfer_model  # a record cache's rows carry its scales [LAYOUT-7]
    longest = 0
    for layout in config.stages[:-1]:
        heads = max(len(rank_ownership(layout, model, r).heads) for r in layout.ranks())
        longest = max(longest, config.seq_len[1] * heads * model.head_dim * model.itemsize)
    return longest + HEADER_SLACK


def max_stream_message(config: SimConfig) -> int:
    """The largest one-frame message on a KV socket: an end-of-stream listing every key of
    every request and chunk, each possibly with the reason it was skipped."""
    return config.requests * config.chunks * 1024 + HEADER_SLACK


def max_receiver_message(config: SimConfig) -> int:
    """ZMQ_MAXMSGSIZE of a receiver's KV socket (it limits every frame)."""
    if config.content == "groups":
        return max(max_pieces_frame(config), max_stream_message(config), 1 << 20)
    return max(max_data_frame(config), max_stream_message(config), max_pull_range(config), 1 << 20)


def max_pieces_frame(config: SimConfig) -> int:
    """The largest frame of a hybrid's pieces: the most one (group, source, receiver) edge
    of the run's requests carries [GROUP-3], plus header room (a description lists at
    most a few pieces per edge)."""
    workload, largest = Workload(config, 0), 0
    for stage in range(config.last_stage):
        book = workload.plans(stage)
        for seq_len in sorted({r.seq_len for r in workload.requests}):
            request = next(r for r in workload.requests if r.seq_len == seq_len)
            edges = book.groups_of(request).edges
            largest = max(largest, max((e.nbytes for e in edges), default=0))
    return largest + HEADER_SLACK


def _edges(config: SimConfig) -> list[tuple[Edge, int]]:
    """(edge, tokens it carries) of every plan the run's requests move by: one per request
    length and DP groups where stages split requests by tokens or serve them on attention-DP
    groups [PLAN-6, DP-1] (every replica group's requests have the same lengths)."""
    workload, out = Workload(config, 0), []
    for stage in range(config.last_stage):
        book, seen = workload.plans(stage), set()
        for request in workload.requests:
            plan = book.of(request)
            if id(plan) in seen:
                continue
            seen.add(id(plan))
            length = config.seq_len[1] if plan.seq_len is None else request.seq_len
            out += [(e, e.token_count(length)) for e in plan.edges]
    return out


def max_pull_range(config: SimConfig) -> int:
    """The largest range a pull answer can carry: one edge's whole share of the longest
    request (ranges coalesce across fields, tokens and layers) [DESC-3]."""
    if config.transfer not in ("pull", "write"):
        return 0
    cell = config.cell_bytes  # every field of a cell, inline scales included [LAYOUT-6]
    longest = max(
        (len(e.layers) * len(e.heads) * cell * tokens for e, tokens in _edges(config)), default=0
    )
    return longest + HEADER_SLACK


def max_read_message(config: SimConfig) -> int:
    """The largest read a pull receiver sends: a row per (layer, token, head, field) of one
    edge's share of the longest request, the most a list can have [DESC-1]."""
    rows = max((len(e.layers) * len(e.heads) * t * 4 for e, t in _edges(config)), default=0)
    return rows * 40 + HEADER_SLACK


NIXL_METADATA = 1 << 20
"""The largest agent metadata message a rank takes (:mod:`sim.paths.nixl`)."""


def max_router_message(config: SimConfig) -> int:
    """ZMQ_MAXMSGSIZE of a sender's KV socket: hellos, and in a pull run reads."""
    if config.transport in ("nixl", "mooncake"):  # a receiver's metadata [sim.paths.onesided]
        return max(messages.MAX_HANDSHAKE, NIXL_METADATA)
    if config.transfer != "pull" or config.content == "groups":  # a hybrid's reads name a key
        return messages.MAX_HANDSHAKE
    return max(messages.MAX_HANDSHAKE, max_read_message(config))
