"""One simulated rank: it keeps a paged cache, sends KV along its plan's edges and verifies
what it receives, every element, against the coordinate-hash oracle.

A rank of stage 0 fills its cache from the oracle and sends; a rank of the last
stage receives; a rank in between does both (it forwards what it verified). Every
rule comes from :mod:`kvspec`: the plans, keys, ports, payloads, wire format, paged
layouts and the oracle. This module only moves bytes and keeps the books.

Start-up, in order: a rank connects to the parent and says a signed *hi*; builds
and (stage 0) fills its cache; a sender binds a ZMQ ROUTER on its KV endpoint and
reports where; once every sender has bound, the parent hands the endpoints to the
receivers, which connect one DEALER per plan source and send a signed *hello*; the
sender answers each verified hello with a signed *welcome* and from then on sends that
receiver's KV to that connection only (:mod:`sim.net.auth`). Data messages are
``[envelope, *wire frames]`` sent zero-copy; the last message to each receiver is an
end-of-stream listing every key meant for it, so a lost shard is reported as lost at
once instead of by a timeout. When the parent says *finish*, a rank flushes what it
holds, reads to the end of every stream and reports its books (:mod:`sim.books.accounting`).
Every socket accepts messages no larger than the run can produce (:mod:`sim.net.sizing`).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import traceback
from types import MappingProxyType
from typing import Any

import torch
import zmq

from kvspec.lifecycle.trace import TraceVerdict, check_trace
from sim.cache.memory import RankMemory
from sim.net import messages
from sim.net.auth import RunSecret, new_nonce
from sim.net.endpoints import RankId, all_ranks, bind_endpoint
from sim.net.p2p import Link
from sim.net.sizing import max_receiver_message, max_router_message
from sim.paths.datapath import DataPath, PathPorts, RankView
from sim.paths.groups import GroupPull, GroupPush
from sim.paths.pull import PullAgent
from sim.paths.push import PushPath
from sim.paths.write import WriteAgent
from sim.rank.context import RankContext
from sim.rank.receiver import Receiver
from sim.rank.sender import Sender
from sim.run.config import ONE_SIDED, SimConfig
from sim.run.faults import FaultInjector
from sim.run.workload import Workload

POLL_MS = 20
HELLO_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 2.0
KV_HWM = 64
"""Messages a KV pipe holds each way before the sender waits: memory stays bounded."""
PATHS: dict[str, type[PushPath] | type[PullAgent] | type[WriteAgent]] = {
    "push": PushPath,
    "pull": PullAgent,
    "write": WriteAgent,
}
"""The data path of each ``--transfer`` (:mod:`sim.paths.datapath`)."""
GROUP_PATHS: dict[str, type[GroupPush] | type[GroupPull]] = {"push": GroupPush, "pull": GroupPull}
"""The data path of each ``--transfer`` of a hybrid's layer groups (:mod:`sim.paths.groups`)."""


def path_for(config: SimConfig) -> Any:
    """The data path class of a run: ``--transfer``'s (a hybrid's: its layer groups'), or
    over ``--transport nixl`` or ``mooncake`` the one-sided path (:mod:`sim.paths.nixl`,
    :mod:`sim.paths.mooncake`, imported only then)."""
    if config.content == "groups":
        return GROUP_PATHS[config.transfer]
    if config.transport == "nixl":
        from sim.paths.nixl import NixlPath

        return NixlPath
    if config.transport == "mooncake":
        from sim.paths.mooncake import MooncakePath

        return MooncakePath
    return PATHS[config.transfer]


def global_rank(config: SimConfig, who: RankId) -> int:
    """``who``'s place among every rank of the run: replica by replica, stage by stage."""
    return all_ranks(config).index(who)


def device_for(config: SimConfig, who: RankId, devices: int | None = None) -> torch.device:
    """For ``--device cuda``: ranks placed by global rank over the ``devices`` visible
    devices (``cuda:(global rank % devices)``), so two stages' rank 0 do not share a GPU
    while another idles; else the CPU."""
    if config.device == "cuda":
        count = torch.cuda.device_count() if devices is None else devices
        return torch.device("cuda", global_rank(config, who) % count)
    return torch.device("cpu")


class Killed(Exception):
    """A simulated crash: the rank ends at once, with no goodbye."""


class Stopped(Exception):
    """The parent said stop before the run began (another rank failed, or Ctrl-C)."""


class Rank:
    """The event loop of one rank; :meth:`run` returns when the parent says stop.

    The loop owns the sockets and the conversation with the parent; what goes out is
    the sender role's (:mod:`sim.rank.sender`), what comes in the receiver role's
    (:mod:`sim.rank.receiver`), the cache the memory's (:mod:`sim.cache.memory`), and how a
    request's bytes move the data path's (:mod:`sim.paths.datapath`), each given the
    rank's context or, the data path, its ports, never the rank."""

    def __init__(
        self,
        config: SimConfig,
        who: RankId,
        control: str,
        context: zmq.Context[Any],
        secret: RunSecret,
        stop_event: threading.Event | None = None,
        link: Link | None = None,
    ) -> None:
        self.config, self.who, self.context = config, who, context
        self.link = link  # --transport gloo|nccl: tensor frames over torch.distributed
        self.control_endpoint = control
        self.secret = secret
        self.stop_event = stop_event  # set by the parent of an in-process run at its end
        self.in_process = stop_event is not None
        workload = Workload(config, who.replica)
        self.memory = RankMemory(config, who, workload, device_for(config, who), self._wait)
        self.ctx = ctx = RankContext(
            config,
            who,
            workload,
            FaultInjector(config.faults, config.seed, who.replica, who.stage, who.rank),
            self.memory,
            pump=self._pump,
            event=self._event,
            stopping=lambda: self.stopping,
            strike=lambda sending: self._maybe_die(sending=sending),
            announce=self._announce,
        )
        self.sender = Sender(ctx, secret)
        self.receiver = Receiver(ctx, secret, self.sender.outbox.append, self.sender.skip)
        if ctx.out_plan is None:
            self.receiver.forward = lambda request_id: None  # the last stage sends on nothing
        self.stopping = self.finishing = self.drain = self.final_sent = self.acked = False
        self.monitor: zmq.Socket[Any] | None = None
        self.path: DataPath = path_for(config)(self._ports())
        self.poll_ms: int = getattr(self.path, "poll_ms", POLL_MS)  # a one-sided path's own
        self.out_of_band = config.transport in ONE_SIDED  # completions beside the ZMQ stream

    def _ports(self) -> PathPorts:
        """What the data path is given of this rank (:class:`sim.paths.datapath.PathPorts`):
        a read-only view, the sender as its outbound port, the receiver as its inbound."""
        ctx = self.ctx
        view = RankView(
            config=ctx.config,
            who=ctx.who,
            workload=ctx.workload,
            requests=MappingProxyType(ctx.requests),
            in_plan=ctx.in_plan,
            out_plan=ctx.out_plan,
            sources=ctx.sources,
            memory=ctx.memory,
            layer_groups=ctx.layer_groups,
            faults=ctx.faults,
            stats=ctx.stats,
            strangers=ctx.strangers,
            book=ctx.book,
            compute=self._compute,
            strike=ctx.strike,
        )
        return PathPorts(view=view, out=self.sender, inbound=self.receiver)

    # -- setup -----------------------------------------------------------------------
    def _open_control(self) -> None:
        """Connect to the parent and say who we are, signed with the run's secret."""
        self.control = self.context.socket(zmq.DEALER)
        self.control.setsockopt(zmq.LINGER, 2000)
        self.control.setsockopt(zmq.MAXMSGSIZE, messages.MAX_CONTROL)
        self.control.connect(self.control_endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        tag = self.who.tag
        self.control.send(
            messages.dump({"ev": "hi", "rank": tag, "mac": self.secret.sign("hi", tag)})
        )

    def _bind(self) -> None:
        """A sender binds its KV socket and reports the endpoint it really got."""
        if not self.ctx.targets:
            self._event({"ev": "bound", "endpoint": None})
            return
        router = self.sender.router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.SNDHWM, KV_HWM)
        router.setsockopt(zmq.RCVHWM, KV_HWM)
        # only hellos come in, and in a pull run reads [sim.paths.pull]
        router.setsockopt(zmq.MAXMSGSIZE, max_router_message(self.config))
        if self.config.transport != "inproc":
            self.monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
            self.poller.register(self.monitor, zmq.POLLIN)
        endpoint = bind_endpoint(self.config, self.who, self.secret.run_id)
        try:
            router.bind(endpoint)
        except zmq.ZMQError as error:
            raise CannotBind(
                f"{self.who.name} cannot bind its KV endpoint {endpoint}: {error}"
                + _bind_hint(error, self.config)
            ) from None
        self.poller.register(router, zmq.POLLIN)
        self._event({"ev": "bound", "endpoint": router.getsockopt_string(zmq.LAST_ENDPOINT)})

    def _connect(self, endpoints: dict[str, str]) -> None:
        """Connect to every plan source at the endpoint it reported, and say a signed hello.

        A connection is never re-made once lost (no reconnect), so a program that takes
        a dead sender's port cannot become that sender for us.
        """
        limit = max_receiver_message(self.config)
        for src in self.ctx.sources:
            sender = self.ctx.peer(self.who.stage - 1, src)
            dealer = self.context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, KV_HWM)
            dealer.setsockopt(zmq.MAXMSGSIZE, limit)
            dealer.setsockopt(zmq.RECONNECT_IVL, -1)
            dealer.connect(endpoints[sender.tag])
            nonce = self.receiver.nonces[src] = new_nonce()
            mac = self.secret.sign("hello", sender.tag, self.who.tag, nonce)
            dealer.send(messages.hello(self.who.rank, nonce, mac))
            self.receiver.dealers[dealer] = src
            self.poller.register(dealer, zmq.POLLIN)

    def _handshake(self) -> None:
        """Wait until every target's hello and every source's welcome has verified."""
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        targets, peers = set(self.ctx.targets), self.sender.peers
        sources, welcomed = set(self.ctx.sources), self.receiver.welcomed
        while set(peers) != targets or welcomed != sources:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.who.name}: after {HELLO_TIMEOUT_S:g} s, no verified hello from "
                    f"receivers {sorted(targets - set(peers))} and no verified "
                    f"welcome from senders {sorted(sources - welcomed)}"
                )
            self._pump(POLL_MS)
            if self.stopping:
                raise Stopped

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        phase = "start-up"
        ctx, sender, receiver = self.ctx, self.sender, self.receiver
        try:
            self._open_control()
            self.memory.build()
            if self.who.stage == 0:
                self.memory.fill_from_oracle()
                sender.reuse_early()
                sender.outbox.extend(r.request_id for r in ctx.workload.requests)
            if ctx.in_plan is not None:
                receiver.expect_keys()
            self.memory.reserve_host_buffers()
            self._bind()
            endpoints = self._await_command("connect")["endpoints"]
            if self.link is not None:  # every process is up: meet in the process group
                ctx.carrier = self.link.carrier(self.who)
            self._connect(endpoints)
            self._handshake()
            self.path.prepare()  # pull, write: regions registered, lists prepared
            self._event({"ev": "ready", "sends": bool(ctx.targets)})
            self._await_command("go")
            self.path.start()
            phase = "run"
            receiver.receive_nothing()
            while not self.stopping:
                self._step()
        except (Killed, Stopped):
            return  # a simulated crash drops everything; a stop before the run has nothing to say
        except Exception as error:
            if getattr(self, "control", None) is None:
                raise  # not even connected: the parent sees this rank die
            self._event(
                {
                    "ev": "error",
                    "phase": phase,
                    "error": (
                        str(error)
                        if isinstance(error, CannotBind)
                        else f"{type(error).__name__}: {error}"
                    )[:2000],
                    # the host's refusal is the user's to fix, not a bug to trace
                    "traceback": ""
                    if isinstance(error, CannotBind)
                    else traceback.format_exc()[-8000:],
                }
            )
            self._await_stop()
        finally:
            self._close()

    def _await_command(self, name: str) -> dict[str, Any]:
        """Wait for the parent's command ``name``, handling any other command meanwhile."""
        while True:
            if self.control.poll(POLL_MS * 5):
                command = messages.load(self.control.recv())
                if command.get("cmd") == name:
                    return command
                self._on_control(command)
            if self.stopping:
                raise Stopped

    def _await_stop(self) -> None:
        while not self.stopping:
            if self.control.poll(200):
                self._on_control(messages.load(self.control.recv()))

    def _step(self) -> None:
        sender = self.sender
        self.path.progress()  # pull: keep its reads posted
        self._pump(0 if sender.outbox and not self.finishing else self.poll_ms)
        if sender.outbox and not self.finishing:
            request_id = sender.outbox.pop(0)
            assert self.ctx.out_plan is not None
            self.path.post(request_id)
        elif sender.unfinished and (self.finishing or self._nothing_left_to_forward()):
            sender.finish()
        if self.finishing and not self.final_sent and self._drained():
            self._send_final()

    def _nothing_left_to_forward(self) -> bool:
        if not self.path.served():  # pull [sim.paths.pull]: reads still to answer
            return False
        if self.who.stage == 0:
            return True
        return all(state.done for state in self.receiver.incoming.values())

    def _compute(self, layers: int) -> None:
        """The simulated prefill of ``layers`` layers; the rank serves its sockets meanwhile."""
        end = time.monotonic() + layers * self.config.compute_s
        while (left := end - time.monotonic()) > 0 and not self.stopping:
            self._pump(math.ceil(left * 1000))

    def _wait(self) -> None:
        """While a buffer is in flight: serve the sockets for a moment."""
        self._pump(POLL_MS)

    def _progress(self, sending: bool) -> float:
        if sending:
            return self.sender.progress()
        incoming = self.receiver.incoming
        return sum(s.done for s in incoming.values()) / max(1, len(incoming))

    def _drained(self) -> bool:
        """Sending is done and, when draining, every source's stream has ended (or died)
        and every abort it was asked to acknowledge has been [LIFE-4]."""
        if self.sender.unfinished:
            return False
        if not self.drain:
            return True
        gone = self.receiver.ended_sources | self.receiver.dead_sources
        waiting = {src for _, src in self.receiver.awaiting_ack} - self.receiver.dead_sources
        return set(self.ctx.sources) <= gone and not waiting

    def _send_final(self) -> None:
        """The rank's last word: its counters, its fault books, the strangers it met, and
        the lifecycle: every held request verified again, every trace checked [LIFE]
        (once: a last call for books repeats it)."""
        if not self.final_sent:
            self.lifecycle_report = self._lifecycle_report()
        self.final_sent = True
        strangers = dict(self.ctx.strangers)
        lifecycle = self.lifecycle_report
        accepted = self.ctx.stats.get("connections_accepted", 0)
        if accepted > len(self.sender.peers):
            strangers["kv connections"] = accepted - len(self.sender.peers)
        self._event(
            {
                "ev": "final",
                "stats": dict(self.ctx.stats),
                "book": self.ctx.book.to_dict(),
                "strangers": strangers,
                "lifecycle": lifecycle,
            }
        )

    def _lifecycle_report(self) -> dict[str, Any]:
        """Re-verify every request still held (a late write into a reused block shows
        here), poison what never quiesced, and check this rank's traces [LIFE-1..7]."""
        report: dict[str, Any] = {"corrupted": [], "traces": []}
        if self.sender.send_trace:
            verdict = check_trace(self.sender.send_trace, num_blocks=0)
            report["traces"].append(
                self._trace_summary("sends", verdict, len(self.sender.send_trace))
            )
        if self.memory.pool is None:
            return report
        if not self.drain:
            report["poisoned"] = self.memory.pool.poison_unquiesced()
        for request_id in list(self.receiver.holding):
            self.receiver.recheck(request_id)
        report["corrupted"] = self.receiver.corrupted
        verdict = self.memory.pool.verdict()
        report["traces"].append(self._trace_summary("blocks", verdict, len(self.memory.pool.trace)))
        report["clobbers"] = len(self.memory.pool.clobbers)
        report["reused"] = self.memory.pool.reused
        report["held"] = len(self.receiver.holding)
        return report

    def _trace_summary(self, name: str, verdict: TraceVerdict, events: int) -> dict[str, Any]:
        return {
            "trace": name,
            "events": events,
            "ok": verdict.ok,
            "obligation": verdict.obligation,
            "violation": "" if verdict.ok else verdict.describe()[:600],
        }

    # -- control ---------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> None:
        self.control.send(messages.dump({**event, "rank": self.who.tag}))

    def _on_control(self, command: dict[str, Any]) -> None:
        name = command.get("cmd")
        if name == "stop":
            self.stopping = True
        elif name == "dead":
            for tag in command.get("ranks", []):
                self.receiver.source_died(tag)
        elif name == "pending":
            self._event({"ev": "pending", "waiting": self.receiver.waiting_summary()})
        elif name == "finish":
            self.finishing, self.drain = True, bool(command.get("drain"))
        elif name == "books" and self.final_sent:
            self._send_final()  # the last call: what was observed since is in it
        elif name == "ack":
            self.acked = True

    def _pump(self, timeout_ms: int) -> None:
        """Handle whatever arrives within ``timeout_ms``: commands, hellos and data."""
        sock: zmq.Socket[Any]
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.control:
                self._on_control(messages.load(sock.recv()))
            elif sock is self.sender.router:
                self.sender.on_router(sock.recv_multipart(), self.path.on_read)
            elif sock is self.monitor:
                sock.recv_multipart()
                self.ctx.stats["connections_accepted"] += 1
            else:
                src = self.receiver.dealers[sock]
                frames = sock.recv_multipart(copy=False)
                if self.ctx.carrier is not None:  # [sim.net.p2p]: the frames that came over it
                    joined = self.ctx.carrier.join(self.ctx.peer(self.who.stage - 1, src), frames)
                    if joined is None:
                        self.ctx.stats["p2p_lost"] += 1
                        continue
                    frames = joined
                if len(frames) == 1 and self.out_of_band:  # an end-of-stream, say: the
                    self.path.progress()  # completions queued before it go first [sim.paths.nixl]
                self.receiver.on_data(src, frames, self.path.complete)

    def _maybe_die(self, *, sending: bool) -> None:
        """Apply a ``kill``/``hang`` fault once this rank has done its fraction of work."""
        for fault in self.config.faults.ranks:
            if fault.kind not in ("kill", "hang") or not fault.applies_to(
                self.who.stage, self.config.last_stage, self.who.rank, sending=sending
            ):
                continue
            done = self._progress(sending)
            if done < fault.fraction:
                continue
            self._announce(fault.kind)
            if fault.kind == "hang":  # unresponsive until the run ends it
                if self.stop_event is not None:
                    self.stop_event.wait()
                    raise Killed
                while True:
                    time.sleep(1)
            if self.in_process:
                raise Killed
            os.kill(os.getpid(), signal.SIGKILL)

    def _announce(self, kind: str) -> None:
        """Tell the parent a rank fault strikes now, and wait until it has heard, so the
        fault is booked even though the rank is about to die or fall silent."""
        self._event({"ev": "fault", "kind": kind})
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while not self.acked and time.monotonic() < deadline:
            if self.control.poll(POLL_MS):
                self._on_control(messages.load(self.control.recv()))

    def _close(self) -> None:
        for sock in (self.monitor, self.sender.router, *self.receiver.dealers):
            if sock is not None:
                sock.close(linger=0)
        if getattr(self, "control", None) is not None:
            self.control.close(linger=1000)  # let the last events reach the parent


class CannotBind(RuntimeError):
    """The host refuses a rank's endpoint (a port another program holds, an address that
    is not this machine's): the user's to fix, so reported as a refusal, without a trace."""


def _bind_hint(error: zmq.ZMQError, config: SimConfig) -> str:
    """What to do about a failed bind, by its cause."""
    if error.errno == zmq.EADDRINUSE:
        return (
            "; another program holds that port: choose another --base-port, use "
            "--base-port auto, or let the OS choose with --ports os"
        )
    if error.errno == zmq.EADDRNOTAVAIL:
        return f"; --host {config.host} is not an address of this machine"
    return ""


def run_ranks(
    config_json: dict[str, Any],
    tags: list[tuple[int, int, int]],
    control: str,
    secret: str,
    stop_event: threading.Event | None = None,
    p2p: dict[str, Any] | None = None,
) -> None:
    """Host ``tags`` (replica, stage, rank) in this process, one thread each.

    ``stop_event`` is given for an in-process run: the parent sets it when the run
    ends, so that even a rank hung by a fault returns. ``p2p`` is the process group's
    plan for ``--transport gloo|nccl`` (:mod:`sim.net.p2p`).
    """
    config = SimConfig.from_dict(config_json)
    torch.set_num_threads(1)
    context: zmq.Context[Any] = zmq.Context.instance()
    run_secret = RunSecret.from_hex(secret)
    link = Link(config, p2p) if p2p is not None else None
    ranks = [
        Rank(config, RankId(*tag), control, context, run_secret, stop_event, link) for tag in tags
    ]
    threads = [threading.Thread(target=r.run, name=r.who.tag, daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
