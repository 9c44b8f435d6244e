"""The simulated cluster: end-to-end throughput against raw pyzmq, and a 72-rank run.

Throughput: a TP1 -> TP1 run moving large requests (verification deferred until every
request has arrived, so the transfer window excludes it) against raw pyzmq PUSH/PULL
between two processes moving the same messages, frame for frame, in the same run.
Scale: TP64 -> TP8 with 8 KV heads (72 ranks, 8 per process); wall time and the peak
of the summed resident memory of every process of the run.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import multiprocess
import zmq

from benchmarks import figure
from benchmarks.figure import Figure
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.cluster import run_simulation
from sim.config import SimConfig


def _raw_zmq_seconds(message_bytes: int, frames: int, messages: int) -> float:
    """Time from the first to the last message of PUSH/PULL between two processes."""
    frame = message_bytes // frames

    def push(endpoint: str) -> None:
        # No torch here: a forked child must not touch the parent's OpenMP thread pool.
        context = zmq.Context()
        sock = context.socket(zmq.PUSH)
        sock.connect(endpoint)
        buffers = [bytearray(b"\1") * frame for _ in range(frames)]
        for _ in range(messages):
            sock.send_multipart([memoryview(b) for b in buffers], copy=False)
        sock.close(linger=-1)
        context.term()

    context = zmq.Context.instance()
    pull = context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    child = multiprocess.get_context("fork").Process(target=push, args=(f"tcp://127.0.0.1:{port}",))
    child.start()
    pull.recv_multipart(copy=False)
    started = time.perf_counter()
    for _ in range(messages - 1):
        pull.recv_multipart(copy=False)
    seconds = time.perf_counter() - started
    child.join()
    pull.close(linger=0)
    return seconds * messages / (messages - 1)


def _throughput(quick: bool) -> list[Figure]:
    """Each run of the sim interleaved with a run of raw pyzmq moving the same messages;
    ``REPEAT`` of each (three at most: a full run moves 64 MiB per run)."""
    seq_len, requests = (256, 8) if quick else (1024, 8)
    model = ModelShape(num_layers=8, num_kv_heads=8, head_dim=128)
    message_bytes = seq_len * model.num_layers * model.num_kv_heads * model.head_dim * 2 * 2
    frames = 2 * model.num_layers
    figures = []
    for checksum in (False, True):
        config = SimConfig(
            stages=(StageLayout(1), StageLayout(1)),
            model=model,
            requests=requests,
            seq_len=(seq_len, seq_len),
            verify_after=True,
            checksum=checksum,
            ports="os",
            timeout=600,
        )
        sim_seconds, raw_seconds = [], []
        for _ in range(min(figure.REPEAT, 3)):
            report = run_simulation(config)
            moved = report.bytes_moved
            assert report.ok and moved == requests * message_bytes, report.render()
            sim_seconds.append(report.transfer_s)
            raw_seconds.append(_raw_zmq_seconds(message_bytes, frames, requests))
        mine, theirs = figure.Spread.of(sim_seconds), figure.Spread.of(raw_seconds)
        label = "with CRC-32" if checksum else "no checksums"
        figures.append(
            Figure(
                name=f"sim TP1->TP1 end to end, {label} ({moved >> 20} MiB)",
                unit="GB/s",
                value=moved / mine.median / 1e9,
                baseline=moved / theirs.median / 1e9,
                baseline_name="raw pyzmq PUSH/PULL",
                ratio=theirs.median / mine.median,
                note="verification after transfer",
                value_range=(moved / mine.high / 1e9, moved / mine.low / 1e9),
                repeats=len(sim_seconds),
            )
        )
    return figures


def _tree_pss_bytes(root: int) -> int:
    """Proportional set size of ``root`` and every descendant, from /proc.

    PSS divides each shared page among the processes sharing it, so forked ranks that
    share torch's pages are not counted many times over, as summed RSS would.
    """
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            parents[int(entry.name)] = int(status.split("PPid:", 1)[1].split()[0])
            rollup = (entry / "smaps_rollup").read_text()
            rss[int(entry.name)] = int(rollup.split("Pss:", 1)[1].split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    total, frontier = rss.get(root, 0), [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                total += rss.get(pid, 0)
                frontier.append(pid)
    return total


def _scale(quick: bool) -> list[Figure]:
    config = SimConfig(
        stages=(StageLayout(64), StageLayout(8)),
        model=ModelShape(num_layers=4, num_kv_heads=8, head_dim=64),
        requests=4 if quick else 16,
        seq_len=(32, 256),
        ranks_per_process=8,
        ports="os",
        timeout=600,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_pss_bytes(os.getpid()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    report = run_simulation(config)
    done.set()
    sampler.join()
    assert report.ok, report.render()
    ranks = sum(s.world_size for s in config.stages)
    return [
        Figure(
            name=f"sim TP64->TP8, 8 KV heads: {ranks} ranks in {report.processes} processes",
            unit="s",
            value=report.wall_s,
            note=f"{report.verified} requests verified",
        ),
        Figure(
            name="sim TP64->TP8 peak memory (PSS), all processes",
            unit="MiB",
            value=peak[0] / 2**20,
        ),
    ]


def run(quick: bool) -> list[Figure]:
    return [*_throughput(quick), *_scale(quick)]
