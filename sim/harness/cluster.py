"""Running a simulated cluster: start every rank, hold the ready barrier, watch, account, stop.

The parent validates the whole run with the spec before anything starts (plans,
layouts, ports, sizes, memory), then starts the ranks — as OS processes
(``multiprocess``), several ranks per process if asked, each rank still with its own
sockets and port; or, for fast property tests, as threads over ``inproc://`` sockets —
and talks to them over one ROUTER socket on loopback. Only its own ranks are heard:
each must open with a *hi* signed with the run's secret (:mod:`sim.net.auth`); anything
else is dropped and counted as a stranger, never fatal.

The run's phases: every sender binds and reports its endpoint; the parent hands the
endpoints to the receivers; everyone handshakes and reports ready; *go*; results
stream in; *finish* (each rank flushes, reads every stream to its end and reports its
books, so every fault is counted where injected and where observed); *stop*. It never
trusts a rank to finish: a rank that dies is noticed and its peers are told; a run
that outlives its deadline is ended with a stack dump of the ranks still running;
Ctrl-C stops every rank within a second. Nothing is left running, no port stays
bound and no temporary file stays behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import zmq

from kvspec.naming.keys import RankAwareKey, parse_key
from sim.books.accounting import RANK_FAULTS, Ledger, lifecycle_summary
from sim.books.report import PULL_STATS, SimReport
from sim.books.tally import (
    measured_edge_bytes,
    measured_group_bytes,
    outcomes_from,
    planned_edge_bytes,
    planned_group_bytes,
)
from sim.harness.hosts import Host, host_main, process_context
from sim.harness.validation import validate
from sim.net import messages
from sim.net.auth import RunSecret
from sim.net.endpoints import RankId, all_ranks
from sim.net.p2p import plan_groups
from sim.rank.loop import run_ranks
from sim.run.config import SimConfig

BOOKS_TIMEOUT_S = 10.0
"""How long the parent waits for every rank's final books after *finish*."""
STOP_TIMEOUT_S = 5.0
"""How long ranks get to exit after *stop* before they are terminated."""

Progress = Callable[[int, int, int, float], None]
"""progress(verified, failed, total, bytes_so_far)."""


class Cluster:
    """One run of the simulated cluster; :meth:`run` returns its :class:`SimReport`."""

    def __init__(self, config: SimConfig, *, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress
        self.context: zmq.Context[Any] = zmq.Context.instance()
        self.secret = RunSecret.new()
        self.ranks = all_ranks(config)
        self.by_tag = {r.tag: r for r in self.ranks}
        self.routes: dict[bytes, str] = {}  # verified connection -> rank tag
        self.route_of: dict[str, bytes] = {}
        self.endpoints: dict[str, str | None] = {}
        self.ready: set[str] = set()
        self.startup_s = 0.0
        self.marks: dict[str, float] = {}  # phase -> time.time() it ended (SimReport.marks)
        self.active_senders: set[str] = set()
        self.timed_out = self.interrupted = False
        self.results: dict[RankId, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.sender_stats: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.setup_error: str | None = None
        self.dead: dict[str, str] = {}
        self.pending: dict[str, dict[str, list[str]]] = {}
        self.rank_stats: dict[str, dict[str, int]] = {}
        self.ledger = Ledger()
        self.strangers: Counter[str] = Counter()
        self.lifecycle: dict[str, dict[str, Any]] = {}  # rank -> its final lifecycle report
        self.announced: dict[str, str] = {}  # rank -> the rank fault it announced
        self.hosts: list[Host] = []
        self.stop_event = threading.Event()
        self.control_endpoint: str | None = None
        self.stack_dumps = ""
        self.expected_results = sum(
            config.requests * config.stages[s].world_size * config.replicas
            for s in range(1, len(config.stages))
        )
        self.dump_dir: Path | None = None
        self.p2p_server: Any = None  # sim run --transport gloo|nccl: the group's store

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> SimReport:
        """Validate, start, run and stop; a refused configuration raises ``ValueError``."""
        validate(self.config)
        started = time.time()
        self.marks["started"] = started
        self._open_control()
        drain = False
        try:
            self._start_hosts()
            self._await_setup("bound", self._on_bound_all)
            self._broadcast({"cmd": "connect", "endpoints": self.endpoints})
            self._await_setup("ready", None)
            self.startup_s = time.time() - started
            self.marks["go"] = time.time()
            self._broadcast({"cmd": "go"})
            self.timed_out = not self._watch(time.time() + self.config.timeout)
            self.marks["results"] = time.time()
            if self.timed_out:
                self._collect_pending()
                self.stack_dumps = self._dump_stacks()
            drain = not self.timed_out
            self._close_books(drain=drain)
        except KeyboardInterrupt:
            self.interrupted = True
        except _Abort:
            pass
        finally:
            try:
                self._stop(fast=self.interrupted)
            except KeyboardInterrupt:
                self.interrupted = True
                self._stop(fast=True)
            finally:
                self.control.close(linger=0)
                self.p2p_server = None  # its listening port closes with it
                if self.dump_dir is not None:
                    shutil.rmtree(self.dump_dir, ignore_errors=True)
        self.marks["stopped"] = time.time()
        return self._report(time.time() - started)

    def _open_control(self) -> None:
        self.control = self.context.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.setsockopt(zmq.MAXMSGSIZE, messages.MAX_CONTROL)
        self.control.setsockopt(zmq.RCVHWM, 100_000)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self.config.transport == "inproc":
            self.control.bind(f"inproc://kvspec-{self.secret.run_id}-control")
        else:
            self.control.bind("tcp://127.0.0.1:*")
        self.control_endpoint = self.control.getsockopt_string(zmq.LAST_ENDPOINT)

    def _start_hosts(self, ranks: list[RankId] | None = None) -> None:
        """Start ``ranks`` (all of the run's by default; a torchrun worker starts its share)."""
        ranks = self.ranks if ranks is None else ranks
        per = max(1, self.config.ranks_per_process)
        config_json = self.config.to_dict()
        in_process = self.config.transport == "inproc"
        if not in_process:
            self.dump_dir = Path(tempfile.mkdtemp(prefix="kvspec-sim-"))
        plan = self._p2p_plan()
        for i in range(0, len(ranks), per):
            host = Host(ranks[i : i + per])
            tags = [(r.replica, r.stage, r.rank) for r in host.tags]
            p2p = None  # its place in the process group [sim.net.p2p]; a GPU each for NCCL
            if plan is not None:
                p2p = {**plan, "rank": plan["groups"][host.tags[0].tag], "device": i // per}
            if in_process:
                for tag in tags:
                    thread = threading.Thread(
                        target=run_ranks,
                        args=(config_json, [tag], self.control_endpoint, self.secret.hex),
                        kwargs={"stop_event": self.stop_event},
                        name=RankId(*tag).tag,
                        daemon=True,
                    )
                    host.threads.append(thread)
                    thread.start()
            else:
                assert self.dump_dir is not None
                host.dump_file = self.dump_dir / f"host-{i // per}.txt"
                host.process = process_context(self.config.device).Process(
                    target=host_main,
                    args=(
                        config_json,
                        tags,
                        self.control_endpoint,
                        self.secret.hex,
                        str(host.dump_file),
                        os.getpid(),
                        p2p,
                    ),
                    name=f"kvspec-sim-host-{i // per}",
                    daemon=True,
                )
                host.process.start()
            self.hosts.append(host)

    def _p2p_plan(self) -> dict[str, Any] | None:
        """``--transport gloo|nccl``: the run's process group — its store, its key prefix
        and every sim rank's member (the process that hosts it) [sim.net.p2p]."""
        if not self.config.p2p:
            return None
        host, port = self._p2p_store()
        groups = plan_groups(self._p2p_shares(), max(1, self.config.ranks_per_process))
        return {
            "store": [host, port],
            "prefix": f"kvspec-sim-p2p/{self.secret.run_id}",
            "groups": groups,
            "world": max(groups.values()) + 1,
        }

    def _p2p_store(self) -> tuple[str, int]:
        """One host: a store of the parent's own, on loopback, on a port the OS assigns."""
        import torch.distributed as dist

        self.p2p_server = dist.TCPStore(
            "127.0.0.1",
            0,
            is_master=True,
            timeout=timedelta(seconds=self.config.timeout),
            wait_for_workers=False,
        )
        return "127.0.0.1", int(self.p2p_server.port)

    def _p2p_shares(self) -> list[list[RankId]]:
        """Every worker's ranks (one host: one worker, every rank)."""
        return [self.ranks]

    def _await_setup(self, event: str, done: Callable[[], None] | None) -> None:
        """Wait until every rank has sent ``event`` (``bound``, then ``ready``)."""
        have = self.endpoints if event == "bound" else self.ready
        deadline = time.time() + max(60.0, self.config.timeout)
        while len(have) < len(self.ranks):
            if time.time() > deadline:
                missing = sorted(set(self.by_tag) - set(have))
                self.setup_error = (
                    f"ranks never reported {event!r} within {max(60.0, self.config.timeout):g} s: "
                    + ", ".join(missing[:10])
                )
                raise _Abort
            self._poll(100)
            self._check_hosts(before_go=True)
        if done is not None:
            done()

    def _on_bound_all(self) -> None:
        self.endpoints = {tag: ep for tag, ep in self.endpoints.items() if ep is not None}

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

    def _close_books(self, *, drain: bool) -> None:
        """*finish*: every live rank flushes, (if ``drain``) reads each stream to its end,
        and reports its final books; then a last call for books, so that what a sender
        observed while its receivers drained (an abort, say) is in them too."""
        live = [t for t in self.by_tag if t not in self.dead and self.announced.get(t) != "hang"]
        self._broadcast({"cmd": "finish", "drain": drain}, only=live)
        self._await_books(live)
        self.ledger.closed.clear()
        live = [t for t in live if t not in self.dead]
        self._broadcast({"cmd": "books"}, only=live)
        self._await_books(live)

    def _await_books(self, live: list[str]) -> None:
        end = time.time() + BOOKS_TIMEOUT_S
        while time.time() < end and not set(live) <= self.ledger.closed:
            self._poll(50)
            self._check_hosts(before_go=False)
            live = [t for t in live if t not in self.dead]
        missing = sorted(set(live) - self.ledger.closed)
        if missing:
            self.errors.append(
                f"ranks did not report their books within {BOOKS_TIMEOUT_S:g} s of finish: "
                + ", ".join(missing[:10])
            )

    def _stop(self, *, fast: bool) -> None:
        """*stop*, then make sure: wait, terminate, kill. ``fast`` (Ctrl-C) does not wait."""
        self._broadcast({"cmd": "stop"})
        self.stop_event.set()
        processes = [h.process for h in self.hosts if h.process is not None]
        threads = [t for h in self.hosts for t in h.threads]
        for host in self.hosts:  # a rank hung by a fault cannot hear stop: do not wait for it
            if host.process is not None and any(
                self.announced.get(w.tag) == "hang" for w in host.tags
            ):
                host.process.terminate()
        end = time.time() + (0.0 if fast else STOP_TIMEOUT_S)  # Ctrl-C: terminate at once
        while time.time() < end and any(p.is_alive() for p in processes):
            time.sleep(0.01)
        for signal_them in ("terminate", "kill"):
            alive = [p for p in processes if p.is_alive()]
            for process in alive:
                getattr(process, signal_them)()
            give_up = time.time() + 1.0
            while time.time() < give_up and any(p.is_alive() for p in alive):
                time.sleep(0.01)
        for process in processes:
            process.join(0.1)
        for thread in threads:
            thread.join(max(0.05, end - time.time()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            self.errors.append(f"in-process ranks did not stop: {', '.join(stuck[:10])}")

    # -- events --------------------------------------------------------------------------
    def _poll(self, timeout_ms: int) -> None:
        if not self.control.poll(timeout_ms):
            return
        while True:
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            tag = self.routes.get(frames[0]) if len(frames) == 2 else None
            if tag is None:
                self._greet(frames)
                continue
            try:
                event = messages.load(frames[1])
            except messages.MessageError as error:  # a verified rank sent it: a bug of ours
                self.errors.append(f"unreadable control event from {tag}: {error}")
                continue
            self._on_event(tag, event)

    def _greet(self, frames: list[bytes]) -> None:
        """A message from an unverified connection: a rank's signed hi, or a stranger."""
        try:
            hi = messages.load(frames[1], limit=4096) if len(frames) == 2 else {}
        except messages.MessageError:
            hi = {}
        tag = hi.get("rank")
        if (
            hi.get("ev") == "hi"
            and isinstance(tag, str)
            and tag in self.by_tag
            and tag not in self.route_of
            and self.secret.verify(hi.get("mac"), "hi", tag)
        ):
            self.routes[frames[0]] = tag
            self.route_of[tag] = frames[0]
        else:
            self.strangers["control messages"] += 1

    def _on_event(self, tag: str, event: dict[str, Any]) -> None:
        who = self.by_tag[tag]
        kind = event.get("ev")
        if kind == "bound":
            self.endpoints[tag] = event.get("endpoint")
        elif kind == "ready":
            self.ready.add(tag)
            if event.get("sends"):
                self.active_senders.add(tag)
        elif kind == "result":
            self.results[who][event["request"]] = event
        elif kind == "sent":
            self.sender_stats[tag] = event
        elif kind == "final":
            self.rank_stats[tag] = event.get("stats", {})
            self.ledger.add(tag, event.get("book", {}))
            self.strangers.update(event.get("strangers", {}))
            self.lifecycle[tag] = event.get("lifecycle", {})
        elif kind == "pending":
            self.pending[tag] = event.get("waiting", {})
        elif kind == "fault":
            self.announced[tag] = str(event.get("kind"))
            if self.announced[tag] in RANK_FAULTS:  # a restart is booked edge by edge
                self.ledger.own.inject(self.announced[tag], tag)
            self._command(tag, {"cmd": "ack"})
        elif kind == "error":
            text = f"{who.name} failed during {event.get('phase', 'the run')}: {event.get('error')}"
            if event.get("phase") != "run" and self.setup_error is None:
                self.setup_error = text
            self.errors.append(f"{text}\n{event.get('traceback', '')}")
            raise _Abort

    def _command(self, tag: str, command: dict[str, Any]) -> None:
        route = self.route_of.get(tag)
        if route is None:
            return
        with suppress(zmq.ZMQError):  # a rank that is gone cannot be told anything
            self.control.send_multipart([route, messages.dump(command)], zmq.NOBLOCK)

    def _broadcast(self, command: dict[str, Any], *, only: list[str] | None = None) -> None:
        for tag in self.by_tag if only is None else only:
            if tag not in self.dead:
                self._command(tag, command)

    def _results_in(self) -> int:
        counted = sum(len(v) for v in self.results.values())
        for tag in self.dead:
            who = self.by_tag[tag]
            if who.stage > 0:
                counted += self.config.requests - len(self.results.get(who, {}))
        return counted

    def _check_hosts(self, *, before_go: bool) -> None:
        """Notice ranks that died; tell their peers; abort if it happened before traffic."""
        newly = self._find_dead()
        if not newly:
            return
        for tag in newly:
            if self.announced.get(tag) == "kill":
                self.ledger.own.observe("kill", tag)
        if before_go:
            self._poll(0)  # an error event the rank sent before it died says why
            if self.setup_error is None:
                self.setup_error = f"ranks died during start-up: {', '.join(newly)}" + "".join(
                    f" ({self.dead[t]})" for t in newly[:1]
                )
            raise _Abort
        for tag in self.by_tag:
            if tag not in self.dead:
                self._command(tag, {"cmd": "dead", "ranks": newly})

    def _find_dead(self) -> list[str]:
        """The ranks of this process's hosts that died since the last look (booked in
        ``self.dead`` with how); a torchrun coordinator adds those of other hosts."""
        newly = []
        for host in self.hosts:
            if host.process is None:  # in-process ranks: one thread each
                for thread, who in zip(host.threads, host.tags, strict=True):
                    if not thread.is_alive() and who.tag not in self.dead:
                        self.dead[who.tag] = (
                            "its thread ended (killed by a fault)"
                            if self.announced.get(who.tag) == "kill"
                            else "its thread ended"
                        )
                        newly.append(who.tag)
                continue
            if host.alive():
                continue
            code = host.exit_code()
            for who in host.tags:
                if who.tag not in self.dead:
                    how = (
                        "killed by a fault (SIGKILL)"
                        if code == -signal.SIGKILL and self.announced.get(who.tag) == "kill"
                        else f"killed by signal {-code}"
                        if code is not None and code < 0
                        else f"exit code {code}"
                    )
                    self.dead[who.tag] = f"its process died ({how})"
                    newly.append(who.tag)
        return newly

    def _collect_pending(self) -> None:
        """Ask every live receiver what it still waits for (at most 1 s for the answers)."""
        asked = [
            tag
            for tag, who in self.by_tag.items()
            if who.stage > 0 and tag not in self.dead and self.announced.get(tag) != "hang"
        ]
        self._broadcast({"cmd": "pending"}, only=asked)
        end = time.time() + 1.0
        while time.time() < end and not set(asked) <= set(self.pending):
            self._poll(20)

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
        signalled = False
        for host in stuck:
            if host.process is not None and host.process.is_alive() and host.dump_file:
                os.kill(host.process.pid, signal.SIGUSR1)
                signalled = True
        if signalled:
            time.sleep(0.5)  # faulthandler writes the dump from a signal handler
        for host in stuck:
            names = ", ".join(w.tag for w in host.tags)
            if host.process is not None and host.dump_file and host.dump_file.exists():
                text = host.dump_file.read_text().strip()
                if text:
                    out.append(f"--- process {host.process.pid} ({names}) ---\n{text}")
            for thread in host.threads:
                if thread.is_alive():
                    ident = thread.ident  # an alive thread has one
                    frame = None if ident is None else sys._current_frames().get(ident)
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

    def _report(self, wall: float) -> SimReport:
        if self.timed_out:
            for tag, kind in self.announced.items():
                if kind == "hang" and tag not in self.ledger.closed:
                    self.ledger.own.observe("hang", tag)
        edges, start, end = measured_edge_bytes(self.results)
        report = SimReport(
            config=self.config,
            outcomes=outcomes_from(self.config, self.results, self._missing_reason),
            edge_bytes=edges,
            planned_bytes=planned_edge_bytes(self.config),
            group_bytes=measured_group_bytes(self.results),
            planned_group_bytes=planned_group_bytes(self.config),
            sender_stats=self.sender_stats,
            wall_s=wall,
            transfer_s=max(0.0, end - start) if end else 0.0,
            startup_s=self.startup_s,
            processes=sum(h.process is not None for h in self.hosts),
            errors=self.errors,
            setup_error=self.setup_error,
            dead=[f"{self.by_tag[t].name}: {why}" for t, why in sorted(self.dead.items())],
            timed_out=self.timed_out,
            interrupted=self.interrupted,
            stack_dumps=self.stack_dumps,
            fault_keys={
                "injected": dict(self.ledger.injected),
                "observed": dict(self.ledger.observed),
            },
            library_errors=dict(self.ledger.errors),
            books_closed=len(self.ledger.closed),
            strangers=dict(self.strangers),
            lifecycle=lifecycle_summary(self.lifecycle, self.by_tag),
            marks=dict(self.marks),
        )
        for stats in self.rank_stats.values():
            report.receiver_stats.update(
                {
                    k: v
                    for k, v in stats.items()
                    # pull [sim.paths.pull]: descriptors posted and the bytes they moved
                    if k in ("late_ignored", "unexpected_keys", "p2p_lost", *PULL_STATS)
                }
            )
        return report


class _Abort(Exception):
    pass


def _describe_key(key: str) -> str:
    parsed = parse_key(key)
    return (
        f"{key} (from source rank {parsed.from_rank})" if isinstance(parsed, RankAwareKey) else key
    )


def run_simulation(config: SimConfig, *, progress: Progress | None = None) -> SimReport:
    """Run ``config`` and return its report (see :class:`Cluster`)."""
    return Cluster(config, progress=progress).run()
