"""Running a simulated cluster: start every rank, hold the ready barrier, watch, account, stop.

The parent validates the whole run with the spec before anything starts (plans,
layouts, ports, sizes, memory), then starts the ranks — as OS processes
(``multiprocess``), several ranks per process if asked, each rank still with its own
sockets and port; or, for fast property tests, as threads over ``inproc://`` sockets —
and talks to them over one ROUTER socket on loopback. Only its own ranks are heard:
each must open with a *hi* signed with the run's secret (:mod:`sim.auth`); anything
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

import faulthandler
import ipaddress
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import multiprocess
import zmq

from kvspec.memory.cache_layout import PRESETS, CacheShape, empty_cache, get_layout, layouts_for
from kvspec.memory.records import check_holds
from kvspec.naming.keys import RankAwareKey, parse_key
from kvspec.topology.model import ModelShape
from sim import messages
from sim.accounting import RANK_FAULTS, Ledger
from sim.auth import RunSecret
from sim.config import SimConfig
from sim.endpoints import RankId, all_ranks, check_ports
from sim.p2p import check_transport, plan_groups
from sim.rank import run_ranks
from sim.report import PULL_STATS, SimReport, measured_edge_bytes, outcomes_from, planned_edge_bytes
from sim.sizing import check_fits
from sim.workload import Request, Workload

BOOKS_TIMEOUT_S = 10.0
"""How long the parent waits for every rank's final books after *finish*."""
STOP_TIMEOUT_S = 5.0
"""How long ranks get to exit after *stop* before they are terminated."""

Progress = Callable[[int, int, int, float], None]
"""progress(verified, failed, total, bytes_so_far)."""


def validate(config: SimConfig, *, processes_here: int | None = None) -> None:
    """Refuse a run the spec refuses, before any process starts [PLAN-1, PORT-3, LAYOUT-1];
    and a transport this machine cannot run, for ``processes_here`` rank processes
    (by default, every rank of the run on this host)."""
    check_layouts(config)  # first: a record cache's plans are by its rows [LAYOUT-7]
    workload = Workload(config, 0)  # every group's requests have the same lengths
    # Requests go round the DP groups by index, so the first prod(dp) of them meet every
    # pairing of groups [DP-1]: the plans of those, before anything costs O(requests).
    _check_plans(workload, workload.first(math.prod(s.dp for s in config.stages)))
    for stage, layout in enumerate(config.stages):  # the rules fit the caches [CP-2]
        name = "--src-block-size" if stage == 0 else "--dst-block-size"
        try:
            layout.check_block_size(config.layout_of(stage)[1])
        except ValueError as error:
            raise ValueError(f"stage {stage} ({layout.describe()}), {name}: {error}") from None
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
    if config.p2p:
        ranks = len(all_ranks(config))
        check_transport(config, processes_here or -(-ranks // config.ranks_per_process))
    if config.transport != "inproc":
        check_host(config.host)
        if config.ports == "spec":
            check_ports(config)
    check_fits(config)  # O(ranks): before the one check that is O(requests)
    if any(layout.token_shards > 1 for layout in config.stages):
        _check_plans(workload, workload.requests)  # one plan per request length [PLAN-6]


def _check_plans(workload: Workload, requests: Sequence[Request]) -> None:
    """Make the plan that moves each of ``requests`` out of every stage; each is made once
    per key (length where tokens are split, DP groups) and refused as the spec refuses it."""
    for stage in range(workload.config.last_stage):
        plans = workload.plans(stage)
        for request in requests:
            plans.of(request)


def check_layouts(config: SimConfig) -> None:
    """Refuse cache layouts that cannot hold the model, or a pair whose cells hold other
    information, naming the presets each can be paired with [LAYOUT-1, LAYOUT-6, ORACLE-6]."""
    model = config.model
    held = layouts_for(model.attention, cross_layer=True)
    for flag, name in (("--src-layout", config.src_layout), ("--dst-layout", config.dst_layout)):
        spec = get_layout(name)
        if spec.plain and name not in held:
            raise ValueError(
                f"cache layout {name!r} cannot hold an {model.attention} cache; use one "
                f"of {', '.join(held)} [LAYOUT-1]"
            )
        why = _cannot_hold(name, model)
        if why is not None:
            raise ValueError(
                f"{flag} {name} cannot hold {model.describe()}: {why}; the presets that can "
                f"are: {', '.join(_holding(config)) or 'none'}"
            )
    src, dst = config.src_layout, config.dst_layout
    if _information(config, src) != _information(config, dst):
        raise ValueError(
            f"cache layouts {src} -> {dst} do not hold the same information for "
            f"{model.describe()}: a {src} cell holds {_fields(config, src)}, a {dst} cell "
            f"{_fields(config, dst)}; nothing is dropped or made up. {src} pairs with "
            f"{', '.join(_pairable(config, src))}; {dst} pairs with "
            f"{', '.join(_pairable(config, dst))} [LAYOUT-6]"
        )


def _information(config: SimConfig, name: str) -> tuple[tuple[str, str, int], ...]:
    model = config.model
    return get_layout(name).information(model.dtype, model.head_dim, model.kv_tensors)


def _fields(config: SimConfig, name: str) -> str:
    return ", ".join(f"{f} ({w} x {d})" for f, d, w in _information(config, name))


def _cannot_hold(name: str, model: ModelShape) -> str | None:
    """Why preset ``name`` cannot hold ``model``'s cache, or None: every rule of the layout
    (K/V count, dtype, fixed width, field alignment), nothing allocated [LAYOUT-5, ORACLE-6]."""
    spec = get_layout(name)
    try:
        check_holds(spec, model)
        empty_cache(
            get_layout(spec.per_layer or name),
            CacheShape(model.kv_tensors, 1, 1, 1, model.head_dim),
            model.dtype,
            "meta",
        )
    except ValueError as error:
        return str(error)
    return None


def _holding(config: SimConfig) -> list[str]:
    """Every preset whose cells can hold the run's model [LAYOUT-5, ORACLE-6]."""
    return [name for name in PRESETS if _cannot_hold(name, config.model) is None]


def _pairable(config: SimConfig, name: str) -> list[str]:
    """The presets that hold the model with the same information as ``name`` [LAYOUT-6]."""
    want = _information(config, name)
    return [n for n in _holding(config) if _information(config, n) == want]


def check_host(host: str) -> None:
    """Refuse a ``--host`` this machine cannot bind, naming why (a typo, not ours)."""
    try:
        infos = socket.getaddrinfo(host, 0, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"--host {messages.short(host)}: cannot resolve it ({error})") from None
    address = infos[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as error:
            raise ValueError(
                f"--host {host} ({address}) is not an address of this machine: {error.strerror}"
            ) from None


def exposure(config: SimConfig) -> str | None:
    """What a run bound beyond loopback exposes, or None for a loopback run."""
    if config.transport == "inproc":
        return None
    address = socket.getaddrinfo(config.host, 0, socket.AF_INET)[0][4][0]
    if ipaddress.ip_address(address).is_loopback:
        return None
    where = "ports the OS assigns" if config.ports == "os" else f"ports from {config.base_port}"
    p2p = (
        f" The tensor frames go over torch.distributed ({config.transport}), which listens on "
        f"{config.host} too, on ports it picks, and authenticates no peer: keep that network "
        "to the run's hosts."
        if config.p2p
        else ""
    )
    return (
        f"senders listen on {config.host} ({address}), {where}: any host that can reach it can "
        "connect. Ranks accept only peers that prove this run's secret (HMAC-signed "
        "handshakes); the KV itself crosses unencrypted." + p2p
    )


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
            p2p = None  # its place in the process group [sim.p2p]; a GPU each for NCCL
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
                host.process = _context(self.config.device).Process(
                    target=_host_main,
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
        and every sim rank's member (the process that hosts it) [sim.p2p]."""
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
            books_closed=len(self.ledger.closed),
            strangers=dict(self.strangers),
            lifecycle=_lifecycle_summary(self.lifecycle, self.by_tag),
            marks=dict(self.marks),
        )
        for stats in self.rank_stats.values():
            report.receiver_stats.update(
                {
                    k: v
                    for k, v in stats.items()
                    # pull [sim.pull]: descriptors posted and the bytes they moved
                    if k in ("late_ignored", "unexpected_keys", "p2p_lost", *PULL_STATS)
                }
            )
        return report


def _lifecycle_summary(
    by_rank: dict[str, dict[str, Any]], ranks: dict[str, RankId]
) -> dict[str, Any]:
    """Every rank's lifecycle report in one: corruption found in held blocks, trace
    violations, traces checked, blocks poisoned, stale writes that landed."""
    summary: dict[str, Any] = {
        "corrupted": [],
        "violations": [],
        "traces": 0,
        "events": 0,
        "poisoned": 0,
        "clobbers": 0,
        "reused": 0,
    }
    for tag, report in sorted(by_rank.items()):
        name = ranks[tag].name
        summary["corrupted"] += [{"rank": name, **c} for c in report.get("corrupted", [])]
        for trace in report.get("traces", []):
            summary["traces"] += 1
            summary["events"] += trace.get("events", 0)
            if not trace.get("ok", True):
                summary["violations"].append({"rank": name, **trace})
        summary["poisoned"] += report.get("poisoned", 0)
        summary["clobbers"] += report.get("clobbers", 0)
        summary["reused"] += report.get("reused", 0)
    return summary


class _Abort(Exception):
    pass


def _describe_key(key: str) -> str:
    parsed = parse_key(key)
    return (
        f"{key} (from source rank {parsed.from_rank})" if isinstance(parsed, RankAwareKey) else key
    )


def _context(device: str) -> Any:  # a multiprocess context (the package is untyped)
    """fork where it is safe: ranks start in milliseconds with torch already imported.

    CUDA does not survive a fork, so ranks on a GPU (and ranks off Linux) are spawned.
    """
    fork = sys.platform.startswith("linux") and device != "cuda"
    return multiprocess.get_context("fork" if fork else "spawn")


def _host_main(
    config_json: dict[str, Any],
    tags: list[tuple[int, int, int]],
    control: str,
    secret: str,
    dump_file: str,
    parent: int,
    p2p: dict[str, Any] | None = None,
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
    run_ranks(config_json, tags, control, secret, p2p=p2p)


def run_simulation(config: SimConfig, *, progress: Progress | None = None) -> SimReport:
    """Run ``config`` and return its report (see :class:`Cluster`)."""
    return Cluster(config, progress=progress).run()
