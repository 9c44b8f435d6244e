"""A simulated transfer of a hybrid model: every layer group, every element and every
state checked, bytes per edge against the group plan [GROUP-3, STATE-2, WINDOW-1].

``python -m sim run --model NAME`` runs here. Each sender and receiver rank is its own
OS process; receivers bind a ZMQ socket on loopback on a port the OS assigns and report
it to the parent, which hands the endpoints to the senders. Every rank computes the
workload (request ids and lengths, from the seed) and the group plan of each request
itself from kvspec (:func:`kvspec.topology.group_plan.plan_groups`). A sender fills what
it holds of each group from the coordinate-hash oracles (KV by coordinate, states by
(layer, part, unit, element)), cuts each of its edges into pieces and sends them
(:mod:`sim.net.group_messages`); a receiver lands each piece at the coordinates it names,
refuses one it does not hold (a sliding-window receiver holds only its window
[WINDOW-1]), and finally checks that every element it holds arrived exactly once and
equals the oracle's bit for bit. The parent sums the bytes of each (group, sender,
receiver) and compares them with the plan's.

This path covers TP and PP layouts of one replica group. Context parallelism,
attention DP, faults, pull, streaming, chunks, fp8 scales and paged cache layouts are
the uniform sim's (:mod:`sim.harness.cluster`); a hybrid run with them is refused.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import signal
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from kvspec.console.units import human_bytes
from kvspec.tensors import group_reshard as gr
from kvspec.topology.group_plan import GroupPlan, plan_groups
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.net.group_messages import end_frames, piece_frames, read_header, read_piece
from sim.net.messages import MessageError, dump, load
from sim.run.config import LIMITS


@dataclass(frozen=True)
class HybridRun:
    """One hybrid run, as plain data."""

    source: StageLayout
    target: StageLayout
    model: ModelShape
    model_name: str = "custom"
    requests: int = 2
    seq_len: tuple[int, int] = (16, 128)
    block_size: int = 16
    """The sender's block size (``--src-block-size``)."""
    policy: str = "lowest"
    seed: int = 0
    timeout: float = 120.0
    dst_block_size: int | None = None
    """The receiver's block size (``--dst-block-size``); None: ``block_size`` [WINDOW-2]."""

    @property
    def receiver_block_size(self) -> int:
        """The receiver's block size [WINDOW-2]."""
        return self.block_size if self.dst_block_size is None else self.dst_block_size

    def __post_init__(self) -> None:
        if not self.model.hybrid:
            raise ValueError("a hybrid run needs a model with layer groups (e.g. --model NAME)")
        if self.model.scale_format is not None:
            raise ValueError(
                f"{self.model.describe()}: fp8 scales of hybrid models are not carried yet"
            )
        for side, layout in (("source", self.source), ("target", self.target)):
            if layout.token_shards > 1 or layout.dp > 1:
                raise ValueError(
                    f"the {side} {layout.describe()} has token shards or attention-DP groups; "
                    "a hybrid run covers TP and PP layouts (cp = dcp = dp = 1)"
                )
        ranks = self.source.world_size + self.target.world_size
        if ranks > LIMITS.ranks:
            raise ValueError(f"the run has {ranks} ranks; the sim runs at most {LIMITS.ranks}")
        if not 1 <= self.requests <= LIMITS.requests:
            raise ValueError(f"--requests must be in 1..{LIMITS.requests}, got {self.requests}")
        for flag, size in (
            ("--src-block-size", self.block_size),
            ("--dst-block-size", self.receiver_block_size),
        ):
            if not 1 <= size <= LIMITS.block_size:
                raise ValueError(f"{flag} must be in 1..{LIMITS.block_size}, got {size}")
        # refuses a layout that cannot hold a group's heads or state units [GROUP-3]
        plan_groups(self.source, self.target, self.model, seq_len=1, policy=self.policy)
        # refuses, before any rank starts, a request whose receiver would need window or
        # chunk tokens its sender has evicted under the two block sizes [WINDOW-2]
        for request, seq_len in self.workload():
            try:
                self.plan(seq_len)
            except ValueError as error:
                raise ValueError(f"{request} ({seq_len} tokens): {error}") from None

    def workload(self) -> list[tuple[str, int]]:
        """(request id, length) of every request, from the seed: every rank computes it."""
        rng = random.Random(f"{self.seed}:requests")
        low, high = self.seq_len
        return [(f"req-{i:04d}", rng.randint(low, high)) for i in range(self.requests)]

    def plan(self, seq_len: int) -> GroupPlan:
        """The group plan of one ``seq_len``-token request [GROUP-3]."""
        return plan_groups(
            self.source,
            self.target,
            self.model,
            seq_len=seq_len,
            source_block_size=self.block_size,
            target_block_size=self.receiver_block_size,
            policy=self.policy,
        )


@dataclass
class HybridReport:
    """What a hybrid run found: requests verified or failed, bytes moved and planned."""

    run: HybridRun
    verified: list[str] = field(default_factory=list)
    failed: dict[str, list[str]] = field(default_factory=dict)
    moved: dict[tuple[int, int, int], int] = field(default_factory=dict)
    planned: dict[tuple[int, int, int], int] = field(default_factory=dict)
    strangers: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def bytes_match(self) -> bool:
        return self.moved == self.planned

    @property
    def ok(self) -> bool:
        return (
            not self.failed
            and not self.errors
            and len(self.verified) == self.run.requests
            and self.bytes_match
        )

    def bytes_by_group(self, which: dict[tuple[int, int, int], int]) -> dict[int, int]:
        totals = dict.fromkeys(range(len(self.run.model.layer_groups)), 0)
        for (group, _, _), n in which.items():
            totals[group] += n
        return totals

    def render(self) -> str:
        run, model = self.run, self.run.model
        lines = [
            f"kvspec sim (hybrid): {run.source.describe()} -> {run.target.describe()}, "
            f"model {run.model_name}: {model.describe()}",
            f"block size: sender {run.block_size}, receiver {run.receiver_block_size} tokens",
            f"requests: {len(self.verified)} verified, {len(self.failed)} failed, of "
            f"{run.requests}"
            + (
                " — ALL VERIFIED (every element and every state checked against the "
                "coordinate-hash oracles)"
                if self.ok
                else ""
            ),
        ]
        for request, reasons in sorted(self.failed.items()):
            lines.extend(f"  FAILED {request}: {reason}" for reason in reasons)
        lines.extend(f"  ERROR {e}" for e in self.errors)
        lines += ["", "bytes per layer group (moved / the plan's bytes for these requests):"]
        moved, planned = self.bytes_by_group(self.moved), self.bytes_by_group(self.planned)
        for index, group in enumerate(model.layer_groups):
            layers = len(model.group_layers(index))
            lines.append(
                f"  group {index}  {group.kind:<7} {layers:>3} layers  "
                f"{human_bytes(moved[index]):>10} / {human_bytes(planned[index])}"
            )
        lines += ["", "bytes per edge (moved / plan):"]
        for key in sorted(set(self.moved) | set(self.planned)):
            index, src, dst = key
            got, want = self.moved.get(key, 0), self.planned.get(key, 0)
            mark = "" if got == want else "   <-- differs from the plan"
            lines.append(
                f"  group {index}  {src:>3} -> {dst:<3} {human_bytes(got):>10} / "
                f"{human_bytes(want)}{mark}"
            )
        verdict = "every edge equals the plan" if self.bytes_match else "EDGES DIFFER FROM THE PLAN"
        lines.append(
            f"  {len(self.planned)} edges, {human_bytes(sum(self.moved.values()))} moved; {verdict}"
        )
        if self.strangers:
            lines.append(f"strangers: {self.strangers} message(s) refused")
        lines.append(f"wall time {self.wall_s:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def edges(which: dict[tuple[int, int, int], int]) -> list[dict[str, int]]:
            return [
                {"group": g, "src": s, "dst": d, "bytes": n}
                for (g, s, d), n in sorted(which.items())
            ]

        return {
            "source": self.run.source.to_dict(),
            "target": self.run.target.to_dict(),
            "model_name": self.run.model_name,
            "model": self.run.model.to_dict(),
            "block_size": {"source": self.run.block_size, "target": self.run.receiver_block_size},
            "requests": self.run.requests,
            "verified": sorted(self.verified),
            "failed": self.failed,
            "errors": self.errors,
            "bytes_by_group": {
                str(g): {"moved": m, "planned": self.bytes_by_group(self.planned)[g]}
                for g, m in self.bytes_by_group(self.moved).items()
            },
            "moved": edges(self.moved),
            "planned": edges(self.planned),
            "bytes_match": self.bytes_match,
            "strangers": self.strangers,
            "ok": self.ok,
            "wall_s": self.wall_s,
        }


def planned_bytes(run: HybridRun) -> dict[tuple[int, int, int], int]:
    """(group, src, dst) -> the plan's bytes summed over the run's requests [GROUP-3]."""
    total: dict[tuple[int, int, int], int] = defaultdict(int)
    for _, seq_len in run.workload():
        for key, n in run.plan(seq_len).bytes_per_edge().items():
            total[key] += n
    return dict(total)


# -- the ranks ------------------------------------------------------------------------------


def _sender(run: HybridRun, rank: int, endpoints: dict[int, str], token: str, control: str) -> None:
    ctx = zmq.Context()
    report = ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 5000)
    report.connect(control)
    sockets: dict[int, zmq.Socket] = {}
    try:
        for dst, endpoint in endpoints.items():
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, -1)  # deliver everything before exit
            sock.connect(endpoint)
            sockets[dst] = sock
        sent: dict[int, int] = defaultdict(int)
        for request, seq_len in run.workload():
            plan = run.plan(seq_len)
            mine = [e for e in plan.edges if e.src == rank]
            for group in sorted({e.group for e in mine}):
                region = gr.held_region(
                    run.source,
                    run.model,
                    group,
                    rank,
                    seq_len=seq_len,
                    block_size=run.block_size,
                    receiving=False,
                )
                data = gr.fill(
                    run.model, region, request, layout=run.source, rank=rank, seed=run.seed
                )
                for edge in (e for e in mine if e.group == group):
                    for piece in gr.cut(edge, region, data, seq_len):
                        sockets[edge.dst].send_multipart(
                            piece_frames(piece, run=token, request=request), copy=False
                        )
                        sent[edge.dst] += 1
        for dst, sock in sockets.items():
            sock.send_multipart(end_frames(run=token, src=rank, pieces=sent[dst]))
        report.send(dump({"type": "sent", "rank": rank}))
    except Exception:  # the parent reports it
        report.send(
            dump({"type": "error", "who": f"sender {rank}", "text": traceback.format_exc()})
        )
    finally:
        for sock in sockets.values():
            sock.close()
        report.close()
        ctx.term()


@dataclass
class _Landing:
    """What a receiver holds of one request: its region and cache per layer group, the
    counters of what landed, and what went wrong."""

    regions: dict[int, gr.Region]
    data: dict[int, gr.GroupData]
    counts: dict[int, gr.GroupData]
    problems: list[str] = field(default_factory=list)


@dataclass
class _Received:
    """What a receiver's inbox took in: bytes per ``group/src``, each sender's piece count
    (and the count its end message claims), and messages refused as a stranger's."""

    moved: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ends: dict[int, int] = field(default_factory=dict)
    got: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    strangers: int = 0

    def lost(self, senders: int) -> list[str]:
        """A line per sender whose pieces did not all arrive."""
        return [
            f"sender {s}: "
            + (
                "no end message"
                if s not in self.ends
                else f"{self.got[s]} of {self.ends[s]} pieces"
            )
            for s in range(senders)
            if self.ends.get(s) != self.got[s]
        ]


def _landings(run: HybridRun, rank: int) -> dict[str, _Landing]:
    """Every request's landing at receiver ``rank``, empty: the region it holds of each
    layer group [GROUP-3] and a cache for it."""
    landings: dict[str, _Landing] = {}
    for request, seq_len in run.workload():
        regions = {
            g: gr.held_region(
                run.target,
                run.model,
                g,
                rank,
                seq_len=seq_len,
                block_size=run.receiver_block_size,
                receiving=True,
            )
            for g in range(len(run.model.layer_groups))
        }
        regions = {g: r for g, r in regions.items() if not r.empty()}
        data = {g: gr.empty(run.model, r) for g, r in regions.items()}
        landings[request] = _Landing(regions, data, {g: gr.counters(d) for g, d in data.items()})
    return landings


def _receive(
    run: HybridRun, rank: int, token: str, inbox: zmq.Socket, landings: dict[str, _Landing]
) -> _Received:
    """Take pieces until every sender's end message came (or the run fell silent), placing
    each in its landing; a message that is not the run's is counted and dropped."""
    seen = _Received()
    # Silence is timed from the first message on: the senders start only once every
    # receiver is up, and how long their start takes is the parent's to bound (it
    # sees a sender fail or die); a busy host must not read a slow start as silence.
    deadline = math.inf  # then moved on by every message of this run
    while len(seen.ends) < run.source.world_size and time.monotonic() < deadline:
        if not inbox.poll(200):
            continue
        frames = inbox.recv_multipart(copy=False)
        try:
            header = read_header(frames[0].buffer, run=token)
            # Only the run's own messages move the silence deadline: a stranger's
            # stream must not keep a receiver waiting for senders that are gone.
            deadline = time.monotonic() + run.timeout
            if header["type"] == "end":
                src = header.get("src")
                if isinstance(src, int) and 0 <= src < run.source.world_size:
                    seen.ends[src] = int(header.get("pieces", -1))
                continue
            if len(frames) != 2:
                raise MessageError(f"a piece has 2 frames, got {len(frames)}")
            piece = read_piece(
                header,
                frames[1].buffer,
                model=run.model,
                dst=rank,
                sources=run.source.world_size,
            )
            named = header.get("request")
            if named not in landings:
                raise MessageError(f"unknown request {str(named)[:40]!r}")
        except MessageError:
            seen.strangers += 1
            continue
        seen.got[piece.src] += 1
        seen.moved[f"{piece.group}/{piece.src}"] += len(frames[1].buffer)
        landing = landings[named]
        try:
            if piece.group not in landing.regions:
                raise ValueError(
                    f"a piece of group {piece.group} from sender {piece.src}, which this "
                    "receiver does not hold at all"
                )
            gr.place(
                piece,
                landing.regions[piece.group],
                landing.data[piece.group],
                landing.counts[piece.group],
            )
        except ValueError as error:
            landing.problems.append(f"from sender {piece.src}: {error}")
    return seen


def _outcomes(
    run: HybridRun, rank: int, landings: dict[str, _Landing], lost: list[str]
) -> dict[str, list[str]]:
    """Request -> its problems at receiver ``rank``: what went wrong landing it, the senders
    whose pieces did not all arrive, and every group region the oracle refuses."""
    outcomes: dict[str, list[str]] = {}
    for request, landing in landings.items():
        problems = list(landing.problems) + lost
        for group, region in landing.regions.items():
            verdict = gr.check_region(
                run.model,
                region,
                landing.data[group],
                landing.counts[group],
                request,
                layout=run.target,
                rank=rank,
                seed=run.seed,
            )
            if verdict:
                problems.append(f"receiver {rank}: {verdict}")
        outcomes[request] = problems
    return outcomes


def _receiver(run: HybridRun, rank: int, token: str, control: str) -> None:
    """Receiver ``rank``'s process: bind an inbox, say where it is, land every request's
    pieces, verify them and report the verdict (or the error) to the parent."""
    ctx = zmq.Context()
    report = ctx.socket(zmq.PUSH)
    report.setsockopt(zmq.LINGER, 5000)
    report.connect(control)
    inbox = ctx.socket(zmq.PULL)
    inbox.setsockopt(zmq.MAXMSGSIZE, 1 << 31)
    try:
        port = inbox.bind_to_random_port("tcp://127.0.0.1")
        report.send(dump({"type": "endpoint", "rank": rank, "endpoint": f"tcp://127.0.0.1:{port}"}))
        landings = _landings(run, rank)
        seen = _receive(run, rank, token, inbox, landings)
        outcomes = _outcomes(run, rank, landings, seen.lost(run.source.world_size))
        verdict = {"type": "verdict", "rank": rank, "outcomes": outcomes}
        report.send(dump({**verdict, "moved": seen.moved, "strangers": seen.strangers}))
    except Exception:  # the parent reports it
        report.send(
            dump({"type": "error", "who": f"receiver {rank}", "text": traceback.format_exc()})
        )
    finally:
        inbox.close(linger=0)
        report.close()
        ctx.term()


def _child(target: Any, *args: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    torch.set_num_threads(1)  # a forked child must not use the parent's thread pool
    target(*args)
    os._exit(0)


def run_hybrid(run: HybridRun) -> HybridReport:
    """Run ``run``: start every rank, collect the receivers' verdicts, compare bytes."""
    from sim.harness.hosts import process_context  # the uniform sim's process start rules

    started = time.monotonic()
    report = HybridReport(run, planned=planned_bytes(run))
    token = secrets.token_hex(16)
    ctx = zmq.Context()
    control = ctx.socket(zmq.PULL)
    control.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
    port = control.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    mp = process_context("cpu")
    procs = []
    try:
        for rank in run.target.ranks():
            proc = mp.Process(target=_child, args=(_receiver, run, rank, token, address))
            proc.start()
            procs.append(proc)
        endpoints: dict[int, str] = {}
        verdicts: dict[int, dict[str, Any]] = {}
        # A receiver gives up after run.timeout without a message (once the first has
        # come), then verifies and reports; the parent waits for every receiver's verdict
        # or its exit, and stops at a rank's error or death.
        receivers = procs[: run.target.world_size]
        # Only a rank hung past every wait of its own meets this deadline.
        deadline = started + (4 + run.requests) * run.timeout + 60
        while len(endpoints) < run.target.world_size or len(verdicts) < run.target.world_size:
            if time.monotonic() > deadline:
                break
            if not control.poll(200):
                if all(p.exitcode is not None for p in receivers) and not control.poll(2000):
                    break  # every receiver has ended and nothing more is on its way
                if any(p.exitcode not in (None, 0) for p in procs):
                    report.errors.append(
                        "a rank died: "
                        + ", ".join(
                            f"pid {p.pid} exit {p.exitcode}"
                            for p in procs
                            if p.exitcode not in (None, 0)
                        )
                    )
                    break
                continue
            message = load(control.recv())
            kind = message.get("type")
            if kind == "endpoint":
                endpoints[int(message["rank"])] = str(message["endpoint"])
                if len(endpoints) == run.target.world_size:
                    for rank in run.source.ranks():
                        proc = mp.Process(
                            target=_child, args=(_sender, run, rank, endpoints, token, address)
                        )
                        proc.start()
                        procs.append(proc)
            elif kind == "verdict":
                verdicts[int(message["rank"])] = message
            elif kind == "error":
                report.errors.append(f"{message.get('who')}: {message.get('text')}")
                break
        if len(verdicts) < run.target.world_size and not report.errors:
            report.errors.append(
                f"deadline: {run.target.world_size - len(verdicts)} receiver(s) sent no verdict"
            )
        problems: dict[str, list[str]] = defaultdict(list)
        moved: dict[tuple[int, int, int], int] = defaultdict(int)
        for dst, verdict in verdicts.items():
            report.strangers += int(verdict.get("strangers", 0))
            for request, reasons in verdict["outcomes"].items():
                problems[request].extend(reasons)
            for key, n in verdict["moved"].items():
                group, src = (int(x) for x in key.split("/"))
                moved[(group, src, dst)] += int(n)
        report.moved = dict(moved)
        for request, _ in run.workload():
            if problems.get(request):
                report.failed[request] = problems[request]
            elif len(verdicts) == run.target.world_size:
                report.verified.append(request)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        control.close(linger=0)
        ctx.term()
    report.wall_s = time.monotonic() - started
    return report
