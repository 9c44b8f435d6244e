"""Running a simulated cluster: start every rank, hold the ready barrier, watch, account, stop.

The parent validates the whole run with the spec before anything starts (plans,
layouts, ports), then starts the ranks — as OS processes (``multiprocess``), several
ranks per process if asked, each rank still with its own sockets and port; or, for
fast property tests, as threads over ``inproc://`` sockets — and talks to them over
one ROUTER socket on loopback. It never trusts a rank to finish: a rank that dies is
noticed and its peers are told; a run that outlives its deadline is ended with a
stack dump of the ranks still running; Ctrl-C stops every rank. Nothing is left
running and no port stays bound.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiprocess
import zmq

from kvspec.cache_layout import get_layout, layouts_for
from kvspec.keys import RankAwareKey, parse_key
from kvspec.plan import plan_transfer
from sim import messages
from sim.config import SimConfig
from sim.endpoints import RankId, all_ranks, check_ports
from sim.rank import run_ranks
from sim.report import SimReport, measured_edge_bytes, outcomes_from, planned_edge_bytes

Progress = Callable[[int, int, int, float], None]
"""progress(verified, failed, total, bytes_so_far)."""


def validate(config: SimConfig) -> None:
    """Refuse a run the spec refuses, before any process starts [PLAN-1, PORT-3, LAYOUT-1]."""
    for stage in range(config.last_stage):
        plan_transfer(
            config.stages[stage], config.stages[stage + 1], config.model, policy=config.policy
        )
    for name in (config.src_layout, config.dst_layout):
        get_layout(name)
        if name not in layouts_for(config.model.attention):
            raise ValueError(
                f"cache layout {name!r} cannot hold an {config.model.attention} cache; use one "
                f"of {', '.join(layouts_for(config.model.attention))} [LAYOUT-1]"
            )
    for name, size in (
        ("--src-block-size", config.src_block_size),
        ("--dst-block-size", config.dst_block_size),
    ):
        if size < 1:
            raise ValueError(f"{name} must be >= 1, got {size}")
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "--device cuda, but torch.cuda.is_available() is False on this machine"
            )
    if config.transport == "tcp":
        check_ports(config)


@dataclass
class Host:
    """A group of ranks sharing one process (or, in-process, one thread per rank)."""

    tags: list[RankId]
    process: Any = None
    threads: list[threading.Thread] = field(default_factory=list)
    dump_file: Path | None = None

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        return any(t.is_alive() for t in self.threads)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.exitcode


class Cluster:
    """One run of the simulated cluster; :meth:`run` returns its :class:`SimReport`."""

    def __init__(self, config: SimConfig, *, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress
        self.context = zmq.Context.instance()
        self.ranks = all_ranks(config)
        self.by_tag = {r.tag: r for r in self.ranks}
        self.ready: set[str] = set()
        self.active_senders: set[str] = set()
        self.timed_out = self.interrupted = False
        self.results: dict[RankId, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.sender_stats: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.dead: dict[str, str] = {}
        self.pending: dict[str, dict[str, list[str]]] = {}
        self.rank_stats: dict[str, dict[str, int]] = {}
        self.hosts: list[Host] = []
        self.expected_results = sum(
            config.requests * config.stages[s].world_size * config.replicas
            for s in range(1, len(config.stages))
        )
        self.dump_dir = Path(tempfile.mkdtemp(prefix="kvspec-sim-"))

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> SimReport:
        validate(self.config)
        started = time.time()
        timed_out = interrupted = False
        self.control = self.context.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        if self.config.transport == "inproc":
            endpoint = f"inproc://kvspec-control-{uuid.uuid4().hex}"
            self.control.bind(endpoint)
        else:
            self.control.bind("tcp://127.0.0.1:*")
            endpoint = self.control.getsockopt_string(zmq.LAST_ENDPOINT)
        try:
            self._start_hosts(endpoint)
            self._barrier()
            for tag in self.by_tag:
                self._command(tag, {"cmd": "go"})
            go = time.time()
            timed_out = not self._watch(go + self.config.timeout)
            if timed_out:
                self._collect_pending()
                self.stack_dumps = self._dump_stacks()
        except KeyboardInterrupt:
            interrupted = True
        except _Abort:
            pass
        finally:
            self._stop()
        return self._report(time.time() - started, timed_out, interrupted)

    def _start_hosts(self, endpoint: str) -> None:
        per = max(1, self.config.ranks_per_process)
        config_json = self.config.to_dict()
        in_process = self.config.transport == "inproc"
        for i in range(0, len(self.ranks), per):
            host = Host(self.ranks[i : i + per])
            tags = [(r.replica, r.stage, r.rank) for r in host.tags]
            if in_process:
                for tag in tags:
                    thread = threading.Thread(
                        target=run_ranks,
                        args=(config_json, [tag], endpoint, True),
                        name=RankId(*tag).tag,
                        daemon=True,
                    )
                    host.threads.append(thread)
                    thread.start()
            else:
                host.dump_file = self.dump_dir / f"host-{i // per}.txt"
                host.process = _context(self.config.device).Process(
                    target=_host_main,
                    args=(config_json, tags, endpoint, str(host.dump_file), os.getpid()),
                    name=f"kvspec-sim-host-{i // per}",
                    daemon=True,
                )
                host.process.start()
            self.hosts.append(host)

    def _barrier(self) -> None:
        """Every rank bound, connected and greeted by its receivers before any traffic."""
        deadline = time.time() + max(60.0, self.config.timeout)
        while len(self.ready) < len(self.ranks):
            if time.time() > deadline:
                missing = sorted(set(self.by_tag) - self.ready)
                self.errors.append(f"ranks never became ready: {', '.join(missing[:10])}")
                raise _Abort
            self._poll(100)
            if self.errors:
                raise _Abort
            self._check_hosts(before_go=True)

    def _watch(self, deadline: float) -> bool:
        """Process events until every result is in; False when the deadline passes."""
        last_progress = 0.0
        while self._results_in() < self.expected_results:
            if time.time() > deadline:
                return False
            self._poll(50)
            if self.errors:
                raise _Abort
            self._check_hosts(before_go=False)
            now = time.time()
            if self.progress and now - last_progress > 0.2:
                self._report_progress()
                last_progress = now
        if self.progress:
            self._report_progress()
        return True

    def _stop(self) -> None:
        live = [t for t in self.by_tag if t not in self.dead]
        for tag in live:
            self._command(tag, {"cmd": "report"})
        end = time.time() + 2
        while time.time() < end and len(self.rank_stats) < len(live):
            self._poll(50)
        for tag in self.by_tag:
            if tag not in self.dead:
                self._command(tag, {"cmd": "stop"})
        end = time.time() + 5
        for host in self.hosts:
            if host.process is not None:
                host.process.join(max(0.1, end - time.time()))
                if host.process.is_alive():
                    host.process.terminate()
                    host.process.join(2)
                if host.process.is_alive():
                    host.process.kill()
                    host.process.join(2)
            for thread in host.threads:
                thread.join(max(0.1, end - time.time()))
        self.control.close(linger=0)

    # -- events --------------------------------------------------------------------------
    def _poll(self, timeout_ms: int) -> None:
        if not self.control.poll(timeout_ms):
            return
        while True:
            try:
                identity, frame = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                event = messages.load(frame)
            except messages.MessageError as error:
                self.errors.append(f"unreadable control event from {identity!r}: {error}")
                continue
            self._on_event(identity.decode(), event)

    def _on_event(self, tag: str, event: dict[str, Any]) -> None:
        who = self.by_tag.get(tag)
        if who is None:
            self.errors.append(f"control event from unknown rank {tag!r}")
            return
        kind = event.get("ev")
        if kind == "ready":
            self.ready.add(tag)
            if event.get("sends"):
                self.active_senders.add(tag)
        elif kind == "result":
            self.results[who][event["request"]] = event
        elif kind == "sent":
            self.sender_stats[tag] = event
        elif kind == "stats":
            self.rank_stats[tag] = event.get("stats", {})
        elif kind == "pending":
            self.pending[tag] = event.get("waiting", {})
        elif kind == "error":
            self.errors.append(f"{who.name} raised:\n{event.get('traceback', '')}")

    def _command(self, tag: str, command: dict[str, Any]) -> None:
        with suppress(zmq.ZMQError):  # a rank that is gone cannot be told anything
            self.control.send_multipart([tag.encode(), messages.dump(command)], zmq.NOBLOCK)

    def _results_in(self) -> int:
        counted = sum(len(v) for v in self.results.values())
        for tag in self.dead:
            who = self.by_tag[tag]
            if who.stage > 0:
                counted += self.config.requests - len(self.results.get(who, {}))
        return counted

    def _check_hosts(self, *, before_go: bool) -> None:
        """Notice ranks that died; tell their peers; abort if it happened before traffic."""
        newly = []
        for host in self.hosts:
            if host.process is None:  # in-process ranks: one thread each
                for thread, who in zip(host.threads, host.tags, strict=True):
                    if not thread.is_alive() and who.tag not in self.dead:
                        self.dead[who.tag] = "its thread ended (killed by a fault)"
                        newly.append(who.tag)
                continue
            if host.alive():
                continue
            code = host.exit_code()
            for who in host.tags:
                if who.tag not in self.dead:
                    how = (
                        "killed by a fault (SIGKILL)"
                        if code == -signal.SIGKILL
                        else f"exit code {code}"
                    )
                    self.dead[who.tag] = f"its process died ({how})"
                    newly.append(who.tag)
        if not newly:
            return
        if before_go:
            self.errors.append(f"ranks died before the run started: {', '.join(newly)}")
            raise _Abort
        for tag in self.by_tag:
            if tag not in self.dead:
                self._command(tag, {"cmd": "dead", "ranks": newly})

    def _collect_pending(self) -> None:
        for tag, who in self.by_tag.items():
            if who.stage > 0 and tag not in self.dead:
                self._command(tag, {"cmd": "pending"})
        end = time.time() + 1.0
        while time.time() < end:
            self._poll(50)

    def _stuck(self, who: RankId) -> bool:
        """A rank that still owes work: results (a receiver) or its end-of-stream (a sender)."""
        if who.tag in self.dead:
            return False
        if who.stage > 0 and len(self.results.get(who, {})) < self.config.requests:
            return True
        return who.tag in self.active_senders and who.tag not in self.sender_stats

    def _dump_stacks(self) -> str:
        """The stacks of the ranks still owing work when the deadline passed."""
        out = []
        stuck = [h for h in self.hosts if any(self._stuck(w) for w in h.tags)]
        for host in stuck:
            if host.process is not None and host.process.is_alive() and host.dump_file:
                os.kill(host.process.pid, signal.SIGUSR1)
        time.sleep(0.5)
        for host in stuck:
            names = ", ".join(w.tag for w in host.tags)
            if host.process is not None and host.dump_file and host.dump_file.exists():
                text = host.dump_file.read_text().strip()
                if text:
                    out.append(f"--- process {host.process.pid} ({names}) ---\n{text}")
            for thread in host.threads:
                if thread.is_alive():
                    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
                    stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
                    out.append(f"--- thread {thread.name} ---\n{stack}")
        return "\n".join(out)

    def _report_progress(self) -> None:
        assert self.progress is not None
        ok = failed = 0
        by_request: dict[tuple[int, str], bool] = {}
        for who, events in self.results.items():
            for rid, event in events.items():
                key = (who.replica, rid)
                by_request[key] = by_request.get(key, True) and event["ok"]
        receivers = sum(self.config.stages[s].world_size for s in range(1, len(self.config.stages)))
        counts: dict[tuple[int, str], int] = defaultdict(int)
        for who, events in self.results.items():
            for rid in events:
                counts[(who.replica, rid)] += 1
        for key, good in by_request.items():
            if not good:
                failed += 1
            elif counts[key] == receivers:
                ok += 1
        moved = sum(
            n
            for events in self.results.values()
            for e in events.values()
            if e["ok"]
            for n in e["edge_bytes"].values()
        )
        self.progress(ok, failed, self.config.requests * self.config.replicas, moved)

    def _missing_reason(self, who: RankId, request_id: str) -> str:
        """Why ``who`` has no result for ``request_id``: death, the deadline, or Ctrl-C."""
        if who.tag in self.dead:
            return f"the rank died before finishing it ({self.dead[who.tag]})"
        if self.timed_out:
            waiting = self.pending.get(who.tag)
            if waiting is None:
                return (
                    f"no result within the {self.config.timeout:g} s deadline and the rank did "
                    "not answer (hung); see its stack below"
                )
            shards = ", ".join(_describe_key(key) for key in waiting.get(request_id, [])[:3])
            return f"timed out after {self.config.timeout:g} s waiting for shard(s) {shards}"
        if self.interrupted:
            return "the run was interrupted (Ctrl-C)"
        return "no result reported"

    def _report(self, wall: float, timed_out: bool, interrupted: bool) -> SimReport:
        self.timed_out, self.interrupted = timed_out, interrupted
        edges, start, end = measured_edge_bytes(self.results)
        receiver_stats = defaultdict(int)
        report = SimReport(
            config=self.config,
            outcomes=outcomes_from(self.config, self.results, self._missing_reason),
            edge_bytes=edges,
            planned_bytes=planned_edge_bytes(self.config),
            sender_stats=self.sender_stats,
            wall_s=wall,
            transfer_s=max(0.0, end - start) if end else 0.0,
            processes=sum(h.process is not None for h in self.hosts),
            errors=self.errors,
            dead=[f"{self.by_tag[t].name}: {why}" for t, why in sorted(self.dead.items())],
            timed_out=timed_out,
            interrupted=interrupted,
            stack_dumps=getattr(self, "stack_dumps", ""),
        )
        for stats in self.rank_stats.values():
            for name in ("duplicates_ignored", "garbage_refused", "codec_refusals", "late_ignored"):
                receiver_stats[name] += stats.get(name, 0)
        report.receiver_stats.update(receiver_stats)
        return report


class _Abort(Exception):
    pass


def _describe_key(key: str) -> str:
    parsed = parse_key(key)
    return (
        f"{key} (from source rank {parsed.from_rank})" if isinstance(parsed, RankAwareKey) else key
    )


def _context(device: str):
    """fork where it is safe: ranks start in milliseconds with torch already imported.

    CUDA does not survive a fork, so ranks on a GPU (and ranks off Linux) are spawned.
    """
    fork = sys.platform.startswith("linux") and device != "cuda"
    return multiprocess.get_context("fork" if fork else "spawn")


def _host_main(
    config_json: dict[str, Any],
    tags: list[tuple[int, int, int]],
    control: str,
    dump_file: str,
    parent: int,
) -> None:
    """Entry point of a rank-hosting process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    dump = open(dump_file, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)

    def orphan_watch() -> None:  # never outlive the parent
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=orphan_watch, daemon=True).start()
    run_ranks(config_json, tags, control, False)


def run_simulation(config: SimConfig, *, progress: Progress | None = None) -> SimReport:
    """Run ``config`` and return its report (see :class:`Cluster`)."""
    return Cluster(config, progress=progress).run()
