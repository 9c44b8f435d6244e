"""The simulated cluster: end-to-end throughput against raw pyzmq, and a 72-rank run.

Throughput: TP1 -> TP1 and TP8 -> TP2 runs moving large requests (verification deferred
until every request has arrived, so the transfer window excludes it), pushed as payloads
and written as byte runs (``--transfer write``), without and with checksums (CRC-32C
where the ``crc32c`` package computes it in hardware), each against raw pyzmq PUSH/PULL
between as many processes moving the same messages in the same run.
Scale: TP64 -> TP8 with 8 KV heads (72 ranks), one rank per process as deployed and 8
per process; wall time, start-up per process and the peak proportional memory (PSS) of
every process of the run. The full run fits a cost model — wall time and memory per
rank, time per request — on 9..72 ranks, checks it against a 128-rank run and
extrapolates it to 512 ranks.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess
import zmq

from benchmarks import figure
from benchmarks.figure import Figure
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.transport.checksums import fastest
from sim.harness.cluster import run_simulation
from sim.run.config import SimConfig


def _raw_zmq_seconds(edges: list[tuple[int, int, int, int, int]]) -> float:
    """Raw pyzmq PUSH/PULL moving the same messages between as many processes as the sim
    runs ranks: ``edges`` are (sender, receiver, message bytes, frames, messages). Timed
    as the sim is: from the first message sent to the last received, across processes
    (wall clock)."""
    senders = sorted({e[0] for e in edges})
    receivers = sorted({e[1] for e in edges})
    fork = multiprocess.get_context("fork")
    results = fork.Queue()

    def pull(index: int, expected: int, port_out: Any) -> None:
        # No torch here: a forked child must not touch the parent's OpenMP thread pool.
        context = zmq.Context()
        sock = context.socket(zmq.PULL)
        port_out.send(sock.bind_to_random_port("tcp://127.0.0.1"))
        for _ in range(expected):
            sock.recv_multipart(copy=False)
        results.put(("recv", time.time()))
        sock.close(linger=0)
        context.term()

    def push(mine: list[tuple[str, int, int, int]]) -> None:
        context = zmq.Context()
        socks, plans = {}, []
        for endpoint, message_bytes, frames, messages in mine:
            sock = socks.get(endpoint) or context.socket(zmq.PUSH)
            sock.connect(endpoint)
            socks[endpoint] = sock
            frame = message_bytes // frames
            buffers = [memoryview(bytearray(b"\1") * frame) for _ in range(frames)]
            plans.append((sock, buffers, messages))
        results.put(("send", time.time()))
        for sock, buffers, messages in plans:
            for _ in range(messages):
                sock.send_multipart(buffers, copy=False)
        for sock in socks.values():
            sock.close(linger=-1)
        context.term()

    endpoints, children = {}, []
    for r in receivers:
        parent_end, child_end = fork.Pipe()
        expected = sum(e[4] for e in edges if e[1] == r)
        child = fork.Process(target=pull, args=(r, expected, child_end))
        child.start()
        children.append(child)
        endpoints[r] = f"tcp://127.0.0.1:{parent_end.recv()}"
    for s in senders:
        mine = [(endpoints[e[1]], e[2], e[3], e[4]) for e in edges if e[0] == s]
        child = fork.Process(target=push, args=(mine,))
        child.start()
        children.append(child)
    stamps = [results.get(timeout=600) for _ in range(len(senders) + len(receivers))]
    for child in children:
        child.join()
    first = min(t for kind, t in stamps if kind == "send")
    last = max(t for kind, t in stamps if kind == "recv")
    return last - first


THROUGHPUT_TRANSFERS: tuple[str, ...] = ("push", "write")
"""Payloads pushed [WIRE-1], and byte runs written from cache to cache (sim.paths.write)."""

_CHECKSUM_NAMES = {"crc32": "CRC-32", "crc32c": "CRC-32C"}

THROUGHPUT_PAIRS: tuple[tuple[int, int], ...] = ((1, 1), (8, 2))
"""Stage pairs of the end-to-end figures (issue 18: TP1->TP1 and TP8->TP2)."""


def _throughput(quick: bool) -> list[Figure]:
    """Each run of the sim interleaved with a run of raw pyzmq moving the same messages
    between as many processes; ``REPEAT`` of each (three at most: a full run moves
    128 MiB per run). Push (payloads, WIRE-1) and write (byte runs straight from and
    into the caches, sim.paths.write), without and with checksums."""
    seq_len, requests = (256, 4) if quick else (1024, 4)
    model = ModelShape(num_layers=8, num_kv_heads=8, head_dim=128)
    request_bytes = seq_len * model.num_layers * model.num_kv_heads * model.head_dim * 2 * 2
    figures = []
    for source_tp, target_tp in THROUGHPUT_PAIRS:
        for transfer in THROUGHPUT_TRANSFERS:
            for checksum in (False, True):
                config = SimConfig(
                    stages=(StageLayout(source_tp), StageLayout(target_tp)),
                    model=model,
                    requests=requests,
                    seq_len=(seq_len, seq_len),
                    verify_after=True,
                    checksum=checksum,
                    transfer=transfer,
                    ports="os",
                    timeout=600,
                )
                # Each sender moves its share of every request to one receiver, in as many
                # frames as a payload has tensors (K and V per layer).
                share = request_bytes // source_tp
                edges = [
                    (s, s * target_tp // source_tp, share, 2 * model.num_layers, requests)
                    for s in range(source_tp)
                ]
                sim_seconds, raw_seconds = [], []
                for _ in range(min(figure.REPEAT, 3)):
                    report = run_simulation(config)
                    moved = report.bytes_moved
                    assert report.ok and moved == requests * request_bytes, report.render()
                    sim_seconds.append(report.transfer_s)
                    raw_seconds.append(_raw_zmq_seconds(edges))
                mine, theirs = figure.Spread.of(sim_seconds), figure.Spread.of(raw_seconds)
                label = f"with {_CHECKSUM_NAMES[fastest()]}" if checksum else "no checksums"
                figures.append(
                    Figure(
                        name=f"sim TP{source_tp}->TP{target_tp} {transfer}, {label} "
                        f"({moved >> 20} MiB)",
                        unit="GB/s",
                        value=moved / mine.median / 1e9,
                        baseline=moved / theirs.median / 1e9,
                        baseline_name="raw pyzmq PUSH/PULL",
                        ratio=theirs.median / mine.median,
                        note="verification after transfer"
                        + (", payloads [WIRE-1]" if transfer == "push" else ", zero-copy runs"),
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


@dataclass(frozen=True)
class ScaleRun:
    """One TP -> TP run with 8 KV heads: its ranks, processes and costs."""

    ranks: int
    processes: int
    requests: int
    wall_s: float
    startup_s: float
    peak_bytes: int


def _scale_run(
    source_tp: int, target_tp: int, *, requests: int, ranks_per_process: int
) -> ScaleRun:
    """Run TP``source_tp`` -> TP``target_tp`` (8 KV heads, 4 layers x 64) with the peak
    PSS of every process of the run sampled every 50 ms."""
    config = SimConfig(
        stages=(StageLayout(source_tp), StageLayout(target_tp)),
        model=ModelShape(num_layers=4, num_kv_heads=8, head_dim=64),
        requests=requests,
        seq_len=(32, 256),
        ranks_per_process=ranks_per_process,
        ports="os",
        timeout=900,
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
    return ScaleRun(
        ranks=sum(s.world_size for s in config.stages),
        processes=report.processes,
        requests=requests,
        wall_s=report.wall_s,
        startup_s=report.startup_s,
        peak_bytes=peak[0],
    )


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - b * mx, b


def _scale(quick: bool) -> list[Figure]:
    """TP64 -> TP8 as deployed (one rank per process) and grouped (8 per process); with
    the full run, a cost model fitted on 9..72 ranks, checked against 128 ranks and
    extrapolated to 512."""
    requests = 4 if quick else 16
    figures = []
    runs = {}
    for per_process in (8, 1):
        run = _scale_run(64, 8, requests=requests, ranks_per_process=per_process)
        runs[per_process] = run
        how = "one rank per process" if per_process == 1 else f"{per_process} ranks per process"
        figures += [
            Figure(
                name=f"sim TP64->TP8, 8 KV heads: {run.ranks} ranks, {how}",
                unit="s",
                value=run.wall_s,
                note=f"{run.requests} requests verified; {run.processes} processes; goal < 60 s",
            ),
            Figure(
                name=f"sim TP64->TP8 start-up per process, {how}",
                unit="ms",
                value=run.startup_s / run.processes * 1e3,
                note=f"{run.startup_s:.2f} s until every rank bound, connected and handshook",
            ),
            Figure(
                name=f"sim TP64->TP8 peak memory (PSS), {how}",
                unit="MiB",
                value=run.peak_bytes / 2**20,
                note="every process of the run; goal < 12 GiB",
            ),
        ]
    if quick:
        return figures
    # The cost model: wall time and memory per rank (one rank per process), per request.
    series = [
        *(_scale_run(tp, tp // 8, requests=requests, ranks_per_process=1) for tp in (8, 16, 32)),
        runs[1],
    ]
    time_0, time_per_rank = _line([r.ranks for r in series], [r.wall_s for r in series])
    mem_0, mem_per_rank = _line([r.ranks for r in series], [r.peak_bytes for r in series])
    doubled = _scale_run(64, 8, requests=2 * requests, ranks_per_process=1)
    time_per_request = (doubled.wall_s - runs[1].wall_s) / requests
    check = _scale_run(112, 16, requests=requests, ranks_per_process=1)  # 128 ranks

    def predict(ranks: int) -> tuple[float, float]:
        return time_0 + time_per_rank * ranks, mem_0 + mem_per_rank * ranks

    predicted_s, predicted_bytes = predict(check.ranks)
    at_512_s, at_512_bytes = predict(512)
    model_note = (
        f"fit on {', '.join(str(r.ranks) for r in series)} ranks, {requests} requests: "
        f"{time_0:.2f} s + {time_per_rank * 1e3:.0f} ms/rank (+{time_per_request * 1e3:.0f} "
        f"ms/request at 72 ranks); {mem_0 / 2**20:.0f} MiB + {mem_per_rank / 2**20:.1f} MiB/rank"
    )
    figures += [
        Figure(
            name=f"sim cost model: wall time at {check.ranks} ranks, predicted / measured",
            unit="x",
            value=predicted_s / check.wall_s,
            note=f"{predicted_s:.1f} s predicted, {check.wall_s:.1f} s measured; {model_note}",
        ),
        Figure(
            name=f"sim cost model: memory at {check.ranks} ranks, predicted / measured",
            unit="x",
            value=predicted_bytes / check.peak_bytes,
            note=f"{predicted_bytes / 2**20:.0f} MiB predicted, "
            f"{check.peak_bytes / 2**20:.0f} MiB measured",
        ),
        Figure(
            name="sim cost model: 512 ranks (TP448->TP64), one per process, extrapolated",
            unit="s",
            value=at_512_s,
            note=f"{at_512_bytes / 2**30:.1f} GiB of memory; {model_note}",
        ),
    ]
    return figures


def run(quick: bool) -> list[Figure]:
    return [*_throughput(quick), *_scale(quick)]
