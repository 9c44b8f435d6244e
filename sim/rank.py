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
receiver's KV to that connection only (:mod:`sim.auth`). Data messages are
``[envelope, *wire frames]`` sent zero-copy; the last message to each receiver is an
end-of-stream listing every key meant for it, so a lost shard is reported as lost at
once instead of by a timeout. When the parent says *finish*, a rank flushes what it
holds, reads to the end of every stream and reports its books (:mod:`sim.accounting`).
Every socket accepts messages no larger than the run can produce (:mod:`sim.sizing`).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import traceback
from collections import Counter, defaultdict, deque
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import zmq

from kvspec.lifecycle.machine import Lifecycle, LifecycleError, LifecycleRefusal
from kvspec.lifecycle.trace import TraceVerdict, check_trace
from kvspec.memory.paged import (
    blocks_needed,
)
from kvspec.naming.keys import parse_key, recv_keys, send_keys
from kvspec.tensors.reshard import send
from kvspec.transport.checksums import checksum_of, fastest
from kvspec.transport.chunks import reassemble, split_chunks
from kvspec.transport.payload import (
    Payload,
    merge_payloads,
    merge_to_request_kv,
    payload_from_shipment,
)
from kvspec.transport.streaming import (
    group_layers,
    group_sources,
    layer_groups,
    layer_part,
    merge_layers,
    stream_chunk_id,
    stream_key,
)
from kvspec.transport.wire import WireError, decode, encode
from sim import messages
from sim.accounting import FaultBook
from sim.auth import RunSecret, new_nonce
from sim.config import SimConfig
from sim.endpoints import RankId, all_ranks, bind_endpoint
from sim.faults import FaultInjector
from sim.memory import RankMemory
from sim.p2p import Carrier, Link
from sim.pool import BlockPool
from sim.pull import PullAgent
from sim.sizing import max_receiver_message, max_router_message
from sim.staging import Slot
from sim.workload import Request, Workload, edge_chunks
from sim.write import WriteAgent

POLL_MS = 20
HELLO_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 2.0
LATE_SPAN = 8
"""``late=P``: a late copy lands after 1..LATE_SPAN more messages on its edge."""
KV_HWM = 64
"""Messages a KV pipe holds each way before the sender waits: memory stays bounded."""
MAX_REASON = 300


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


@dataclass
class Incoming:
    """What a receiver holds of one request until it is complete or failed."""

    request: Request
    waiting: set[str]
    chunks: dict[int, list[tuple[int, Payload]]] = field(default_factory=lambda: defaultdict(list))
    first_sent: float = float("inf")
    edge_bytes: Counter[int] = field(default_factory=Counter)
    received_at: float | None = None
    done: bool = False
    keys: dict[str, int] = field(default_factory=dict)  # every key of it -> its source
    arrived: int = 0
    abort_after: int | None = None  # abort=P: abort once this many shards arrived
    groups: dict[int, list[tuple[int, Payload]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # streamed [STREAM-1]: each layer group's parts until every source's has arrived
    started: float = float("inf")  # when the earliest source began computing it
    ready_at: float | None = None  # every layer in the cache


@dataclass
class LateCopy:
    """``late=P``: a copy of a sent message, held until ``span`` more messages went out."""

    key: str
    frames: list[Any]
    seq: int
    span: int
    after: int = 0
    """Messages of a higher ``seq`` sent since: with one, it lands late."""


class Killed(Exception):
    """A simulated crash: the rank ends at once, with no goodbye."""


class Stopped(Exception):
    """The parent said stop before the run began (another rank failed, or Ctrl-C)."""


class Rank:
    """The event loop of one rank; :meth:`run` returns when the parent says stop."""

    def __init__(
        self,
        config: SimConfig,
        who: RankId,
        control: str,
        context: zmq.Context,
        secret: RunSecret,
        stop_event: threading.Event | None = None,
        link: Link | None = None,
    ) -> None:
        self.config, self.who, self.context = config, who, context
        self.link = link  # --transport gloo|nccl: tensor frames over torch.distributed
        self.carrier: Carrier | None = None
        self.control_endpoint = control
        self.secret = secret
        self.stop_event = stop_event  # set by the parent of an in-process run at its end
        self.in_process = stop_event is not None
        self.model = config.model
        self.workload = Workload(config, who.replica)
        self.requests = {r.request_id: r for r in self.workload.requests}
        self.stage_layout = config.stages[who.stage]
        self.device = device_for(config, who)
        self.memory = RankMemory(config, who, self.workload, self.device, self._wait)
        self.owner = self.memory.owner
        self.staging = self.memory.staging  # pull [sim.pull] stages through it on a device
        self.copy_stream = self.memory.copy_stream
        # The plans per request: one for all of them unless the stages split requests by
        # tokens or serve them on attention-DP groups [PLAN-6, DP-1].
        self.in_plan = self.workload.plans(who.stage - 1) if who.stage > 0 else None
        self.out_plan = self.workload.plans(who.stage) if who.stage < config.last_stage else None
        self.targets = self.out_plan.targets_of(who.rank) if self.out_plan else ()
        self.sources = self.in_plan.sources_of(who.rank) if self.in_plan else ()
        self.faults = FaultInjector(config.faults, config.seed, who.replica, who.stage, who.rank)
        self.stats: Counter[str] = Counter()
        self.strangers: Counter[str] = Counter()
        self.book = FaultBook()
        self.incoming: dict[str, Incoming] = {}
        self.unverified: list[Incoming] = []
        self.key_owner: dict[str, tuple[str, int, int]] = {}  # key -> (request, chunk, src)
        self.key_group: dict[str, int] = {}  # streamed [STREAM-1]: key -> its layer group
        self.groups = config.stream_groups
        self.layer_groups = layer_groups(self.model.num_layers, self.groups) if self.groups else ()
        self.outbox: list[str] = []  # request ids ready to send
        self.sent_keys: dict[int, list[str]] = defaultdict(list)
        self.skipped: dict[int, dict[str, str]] = defaultdict(dict)
        self.next_seq: Counter[int] = Counter()  # per target: the envelope's seq
        self.held: dict[int, list[tuple[str, list[Any], int]]] = defaultdict(list)  # reordered
        self.peers: dict[int, bytes] = {}  # target rank -> its verified connection
        self.nonces: dict[int, str] = {}  # source rank -> the nonce of our hello
        self.welcomed: set[int] = set()  # sources whose welcome verified
        self.seen: set[str] = set()  # keys that arrived in any form
        self.max_seq: dict[int, int] = {}  # per source: the highest seq seen
        self.stopping = self.finishing = self.drain = self.final_sent = self.acked = False
        self.ended_sources: set[int] = set()
        self.dead_sources: set[int] = set()
        self.unfinished_senders = len(self.targets) > 0
        self.router: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.dealers: dict[zmq.Socket, int] = {}
        # lifecycle [LIFE]: the receiver's block pool, the sender's promises and epoch
        self.pool: BlockPool | None = None
        self.holding: deque[str] = deque()  # delivered requests still held, oldest first
        self.awaiting_ack: set[tuple[str, int]] = set()  # (request, source) aborts pending
        self.sends = Lifecycle(0)  # a sender's side of the rules: no send after an ack
        self.send_trace: list[dict[str, Any]] = []
        self.epoch = 0
        self.aborted_out: set[tuple[str, int]] = set()  # (request, target) told to stop
        self.late: dict[int, list[LateCopy]] = defaultdict(list)
        self.top_seq: dict[int, int] = {}  # per target: the highest seq put on the wire
        self.transmits = 0
        self.restarted_from: set[int] = set()
        faults = config.faults
        self.recheck = config.unsafe_reuse or bool(
            faults.late or faults.abort or any(f.kind == "restart" for f in faults.ranks)
        )  # a held request is verified again before its blocks go back
        self.corrupted: list[dict[str, Any]] = []
        # pull [sim.pull]: receivers read byte ranges from the senders' caches; write
        # [sim.write]: senders write them, the same agent's other side
        agents = {"pull": PullAgent, "write": WriteAgent}
        self.pull = agents[config.transfer](self) if config.transfer in agents else None

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
        if not self.targets:
            self._event({"ev": "bound", "endpoint": None})
            return
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, KV_HWM)
        self.router.setsockopt(zmq.RCVHWM, KV_HWM)
        # only hellos come in, and in a pull run reads [sim.pull]
        self.router.setsockopt(zmq.MAXMSGSIZE, max_router_message(self.config))
        if self.config.transport != "inproc":
            self.monitor = self.router.get_monitor_socket(zmq.EVENT_ACCEPTED)
            self.poller.register(self.monitor, zmq.POLLIN)
        endpoint = bind_endpoint(self.config, self.who, self.secret.run_id)
        try:
            self.router.bind(endpoint)
        except zmq.ZMQError as error:
            raise CannotBind(
                f"{self.who.name} cannot bind its KV endpoint {endpoint}: {error}"
                + _bind_hint(error, self.config)
            ) from None
        self.poller.register(self.router, zmq.POLLIN)
        self._event({"ev": "bound", "endpoint": self.router.getsockopt_string(zmq.LAST_ENDPOINT)})

    def _connect(self, endpoints: dict[str, str]) -> None:
        """Connect to every plan source at the endpoint it reported, and say a signed hello.

        A connection is never re-made once lost (no reconnect), so a program that takes
        a dead sender's port cannot become that sender for us.
        """
        limit = max_receiver_message(self.config)
        for src in self.sources:
            sender = self._peer(self.who.stage - 1, src)
            dealer = self.context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, KV_HWM)
            dealer.setsockopt(zmq.MAXMSGSIZE, limit)
            dealer.setsockopt(zmq.RECONNECT_IVL, -1)
            dealer.connect(endpoints[sender.tag])
            nonce = self.nonces[src] = new_nonce()
            mac = self.secret.sign("hello", sender.tag, self.who.tag, nonce)
            dealer.send(messages.hello(self.who.rank, nonce, mac))
            self.dealers[dealer] = src
            self.poller.register(dealer, zmq.POLLIN)

    def _edge_name(self, src: int, dst: int, stage: int) -> str:
        return f"replica {self.who.replica} stage {stage}->{stage + 1} {src}->{dst}"

    def _peer(self, stage: int, rank: int) -> RankId:
        return RankId(self.who.replica, stage, rank)

    def _handshake(self) -> None:
        """Wait until every target's hello and every source's welcome has verified."""
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while set(self.peers) != set(self.targets) or self.welcomed != set(self.sources):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.who.name}: after {HELLO_TIMEOUT_S:g} s, no verified hello from "
                    f"receivers {sorted(set(self.targets) - set(self.peers))} and no verified "
                    f"welcome from senders {sorted(set(self.sources) - self.welcomed)}"
                )
            self._pump(POLL_MS)
            if self.stopping:
                raise Stopped

    def _expect_keys(self) -> None:
        """The keys this receiver waits for: one per (request, chunk, plan source) [KEY-4]."""
        assert self.in_plan is not None
        chunked = self.config.chunks > 1
        for request in self.workload.requests:
            waiting: set[str] = set()
            plan = self.in_plan.of(request)
            # An edge's payload is cut into chunks of its own tokens [CHUNK-1, SLICE-4].
            counts = {
                e.src: len(edge_chunks(e.token_count(request.seq_len), self.config.chunks))
                for e in plan.edges_to(self.who.rank)
            }
            if self.groups:
                self._expect_groups(request, waiting)
            for chunk_id in range(0 if self.groups else len(request.chunks)):
                for key, src in recv_keys(
                    plan,
                    request.request_id,
                    self.who.rank,
                    from_stage=self.who.stage - 1,
                    to_stage=self.who.stage,
                    chunk_id=chunk_id,
                    chunked=chunked,
                ):
                    if chunk_id >= counts[src]:
                        continue
                    waiting.add(key)
                    self.key_owner[key] = (request.request_id, chunk_id, src)
            self.incoming[request.request_id] = Incoming(
                request,
                waiting,
                keys={k: self.key_owner[k][2] for k in waiting},
                abort_after=self.faults.abort_point(request.request_id, len(waiting)),
            )

    def _expect_groups(self, request: Request, waiting: set[str]) -> None:
        """A streamed request's keys: one per layer group and source carrying some of its
        layers [STREAM-1.2]."""
        assert self.in_plan is not None
        plan = self.in_plan.of(request)
        for g, group in enumerate(self.layer_groups):
            sources = group_sources(plan, self.who.rank, group)
            for key, src in recv_keys(
                plan,
                request.request_id,
                self.who.rank,
                from_stage=self.who.stage - 1,
                to_stage=self.who.stage,
                chunk_id=stream_chunk_id(0, g, self.groups),
                chunked=True,
            ):
                if src in sources:
                    waiting.add(key)
                    self.key_owner[key] = (request.request_id, 0, src)
                    self.key_group[key] = g

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        phase = "start-up"
        try:
            self._open_control()
            self.memory.build()
            self.cache, self.tables, self.pool = (
                self.memory.cache,
                self.memory.tables,
                self.memory.pool,
            )
            if self.who.stage == 0:
                self.memory.fill_from_oracle()
                self.outbox = [r.request_id for r in self.workload.requests]
            if self.in_plan is not None:
                self._expect_keys()
            self.memory.reserve_host_buffers()
            self._bind()
            endpoints = self._await_command("connect")["endpoints"]
            if self.link is not None:  # every process is up: meet in the process group
                self.carrier = self.link.carrier(self.who)
            self._connect(endpoints)
            self._handshake()
            if self.pull is not None:  # pull, write: regions registered, lists prepared
                self.pull.prepare()
            self._event({"ev": "ready", "sends": bool(self.targets)})
            self._await_command("go")
            if self.pull is not None:  # pull [sim.pull]
                self.pull.start()
            phase = "run"
            self.started = time.time()
            self._receive_nothing()
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
        if self.pull is not None:  # pull [sim.pull]
            self.pull.post_reads()
        self._pump(0 if self.outbox and not self.finishing else POLL_MS)
        if self.outbox and not self.finishing:
            self._send_request(self.outbox.pop(0))
        elif self.unfinished_senders and (self.finishing or self._nothing_left_to_forward()):
            self._finish_sending()
        if self.finishing and not self.final_sent and self._drained():
            self._send_final()

    def _drained(self) -> bool:
        """Sending is done and, when draining, every source's stream has ended (or died)
        and every abort it was asked to acknowledge has been [LIFE-4]."""
        if self.unfinished_senders:
            return False
        if not self.drain:
            return True
        gone = self.ended_sources | self.dead_sources
        waiting = {src for _, src in self.awaiting_ack} - self.dead_sources
        return set(self.sources) <= gone and not waiting

    def _send_final(self) -> None:
        """The rank's last word: its counters, its fault books, the strangers it met, and
        the lifecycle: every held request verified again, every trace checked [LIFE]
        (once: a last call for books repeats it)."""
        if not self.final_sent:
            self.lifecycle_report = self._lifecycle_report()
        self.final_sent = True
        strangers = dict(self.strangers)
        lifecycle = self.lifecycle_report
        accepted = self.stats.get("connections_accepted", 0)
        if accepted > len(self.peers):
            strangers["kv connections"] = accepted - len(self.peers)
        self._event(
            {
                "ev": "final",
                "stats": dict(self.stats),
                "book": self.book.to_dict(),
                "strangers": strangers,
                "lifecycle": lifecycle,
            }
        )

    def _lifecycle_report(self) -> dict[str, Any]:
        """Re-verify every request still held (a late write into a reused block shows
        here), poison what never quiesced, and check this rank's traces [LIFE-1..7]."""
        report: dict[str, Any] = {"corrupted": [], "traces": []}
        if self.send_trace:
            verdict = check_trace(self.send_trace, num_blocks=0)
            report["traces"].append(self._trace_summary("sends", verdict, len(self.send_trace)))
        if self.pool is None:
            return report
        if not self.drain:
            report["poisoned"] = self.pool.poison_unquiesced()
        for request_id in list(self.holding):
            self._recheck(request_id)
        report["corrupted"] = self.corrupted
        verdict = self.pool.verdict()
        report["traces"].append(self._trace_summary("blocks", verdict, len(self.pool.trace)))
        report["clobbers"] = len(self.pool.clobbers)
        report["reused"] = self.pool.reused
        report["held"] = len(self.holding)
        return report

    def _trace_summary(self, name: str, verdict: TraceVerdict, events: int) -> dict[str, Any]:
        return {
            "trace": name,
            "events": events,
            "ok": verdict.ok,
            "obligation": verdict.obligation,
            "violation": "" if verdict.ok else verdict.describe()[:600],
        }

    def _wait(self) -> None:
        """While a buffer is in flight: serve the sockets for a moment."""
        self._pump(POLL_MS)

    # -- control ---------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> None:
        self.control.send(messages.dump({**event, "rank": self.who.tag}))

    def _on_control(self, command: dict[str, Any]) -> None:
        name = command.get("cmd")
        if name == "stop":
            self.stopping = True
        elif name == "dead":
            for tag in command.get("ranks", []):
                self._source_died(tag)
        elif name == "pending":
            self._event({"ev": "pending", "waiting": self._waiting_summary()})
        elif name == "finish":
            self.finishing, self.drain = True, bool(command.get("drain"))
        elif name == "books" and self.final_sent:
            self._send_final()  # the last call: what was observed since is in it
        elif name == "ack":
            self.acked = True

    def _source_died(self, tag: str) -> None:
        for src in self.sources:
            if RankId(self.who.replica, self.who.stage - 1, src).tag != tag:
                continue
            self.dead_sources.add(src)
            if src in self.ended_sources:
                continue
            for state in self.incoming.values():
                lost = sorted(k for k in state.waiting if self.key_owner[k][2] == src)
                if lost and not state.done:
                    self._fail(state, f"source rank {src} died; shard {lost[0]} never arrived")

    def _waiting_summary(self) -> dict[str, list[str]]:
        return {
            rid: sorted(state.waiting)
            for rid, state in self.incoming.items()
            if not state.done and state.waiting
        }

    # -- sending ---------------------------------------------------------------------
    def _send_request(self, request_id: str) -> None:
        """Gather one request from the cache and send every chunk along every edge."""
        assert self.out_plan is not None
        if self.pull is not None:  # pull [sim.pull]: answer its reads instead
            self.pull.ready(request_id)
            return
        request = self.requests[request_id]
        plan = self.out_plan.of(request)
        held = self.memory.held(request)
        kv, slot = self.memory.gather(request)
        _, block_size = self.config.layout_of(self.who.stage)
        keys = {(dst, c): key for key, dst, c in self._out_keys(request)}
        pieces = []  # per edge, its payload cut into chunks of its own tokens [CHUNK-1]
        for shipment in send(plan, self.who.rank, kv, slicing=self.config.slicing):
            whole = shipment.kv.seq_len == held  # the edge takes every token held here
            payload = payload_from_shipment(
                plan,
                shipment,
                request_id,
                block_size=block_size,
                block_ids=self.tables[request_id] if whole else (),
            )
            sizes = [len(r) for r in edge_chunks(payload.seq_len, self.config.chunks)]
            chunks = split_chunks(payload, sizes) if len(sizes) > 1 else (payload,)
            pieces.append((shipment.edge.dst, chunks))
        started = time.time() if self.config.stream != "off" else None
        if self.groups:
            self._stream(request, pieces, started, slot)
            return
        self._compute(len(self.owner.layers))  # whole: every layer first (none unless --stream)
        for chunk_id in range(len(request.chunks)):  # chunk by chunk, edge by edge
            for dst, chunks in pieces:
                if chunk_id < len(chunks):
                    self._transmit(dst, keys[(dst, chunk_id)], chunks[chunk_id], started, slot)

    def _stream(
        self,
        request: Request,
        pieces: list[tuple[int, Any]],
        started: float | None,
        slot: Slot | None = None,
    ) -> None:
        """Send each layer group of every edge as soon as this rank has computed its
        layers of the group [STREAM-1]."""
        done = self.owner.layers.start
        for g, group in enumerate(self.layer_groups):
            mine = group_layers(self.owner.layers, group)
            if not len(mine):
                continue
            self._compute(mine.stop - done)
            done = mine.stop
            for dst, chunks in pieces:
                part = layer_part(chunks[0], group)
                if part is not None:
                    key = stream_key(
                        request.request_id, self.who.stage, 0, g, self.groups, self.who.rank, dst
                    )
                    self._transmit(dst, key, part, started, slot)

    def _compute(self, layers: int) -> None:
        """The simulated prefill of ``layers`` layers; the rank serves its sockets meanwhile."""
        end = time.monotonic() + layers * self.config.compute_s
        while (left := end - time.monotonic()) > 0 and not self.stopping:
            self._pump(math.ceil(left * 1000))

    def _out_keys(self, request: Request) -> list[tuple[str, int, int]]:
        """(key, target rank, chunk id) of everything this sender sends of ``request``
        [KEY-4]: each edge's chunks of its own tokens."""
        assert self.out_plan is not None
        plan = self.out_plan.of(request)
        if self.groups:  # one key per layer group and edge carrying some of it [STREAM-1.2]
            return [
                (
                    stream_key(
                        request.request_id, self.who.stage, 0, g, self.groups, self.who.rank, e.dst
                    ),
                    e.dst,
                    0,
                )
                for g, group in enumerate(self.layer_groups)
                for e in plan.edges_from(self.who.rank)
                if len(group_layers(e.layers, group))
            ]
        counts = {
            e.dst: len(edge_chunks(e.token_count(request.seq_len), self.config.chunks))
            for e in plan.edges_from(self.who.rank)
        }
        return [
            (key, dst, chunk_id)
            for chunk_id in range(len(request.chunks))
            for key, dst in self._send_keys(request.request_id, chunk_id)
            if chunk_id < counts[dst]
        ]

    def _send_keys(self, request_id: str, chunk_id: int) -> tuple[tuple[str, int], ...]:
        """(key, target rank) of every edge this sender sends one chunk on [KEY-4]."""
        assert self.out_plan is not None
        return send_keys(
            self.out_plan.of(self.requests[request_id]),
            request_id,
            self.who.rank,
            from_stage=self.who.stage,
            to_stage=self.who.stage + 1,
            chunk_id=chunk_id,
            chunked=self.config.chunks > 1,
        )

    def _transmit(
        self,
        dst: int,
        key: str,
        payload: Payload,
        started: float | None = None,
        gathered: Slot | None = None,
    ) -> None:
        """Send one data message, with the run's faults applied and booked [sim.faults];
        frames in the ``gathered`` slot of the gather ring keep it in flight."""
        request = self.key_request(key)
        if (request, dst) in self.aborted_out:
            self.skipped[dst][key] = "a receiver of the request aborted it"
            return
        self.sent_keys[dst].append(key)
        self._maybe_die(sending=True)
        self.transmits += 1
        if self._fault_strikes("fail-nth", self.transmits):
            self.book.inject("fail-nth", key)
            self._put(dst, [messages.notice("failed", key)])
            return
        payload, slot = self.memory.host(payload)
        slot = slot or gathered
        # CRC-32C where compiled code computes it, else CRC-32 [WIRE-6, WIRE-7]
        wire = encode(payload, checksum=fastest() if self.config.checksum else False)
        if slot is not None and self.config.faults.any:  # pragma: no cover - needs a GPU
            # Faults keep frames back (reorder, late) or send them twice: they get their
            # own memory, so that the staging slot is reused only when the socket is done.
            wire, slot = [bytes(f) for f in wire], None
        seq = self.next_seq[dst]
        self.next_seq[dst] += 1
        head = messages.envelope(
            key, seq, time.time(), epoch=self.epoch, checksum=self.config.checksum, started=started
        )
        if self._put_through_faults(dst, key, [head, *wire], seq, slot=slot, traced=True):
            self._maybe_restart()

    def put_ranges(
        self, dst: int, key: str, frames: list[Any], slot: Slot | None, algorithm: str
    ) -> None:
        """Send byte ranges straight from cache memory (a pull answer, a write) as one data
        message: the next sequence number, an envelope whose ``ranges_crc`` covers the
        frames when the run checksums (``algorithm``), through the run's faults
        [sim.faults]. Frames in a staging ``slot`` are copied first when faults may keep
        them back."""
        if slot is not None and self.config.faults.any:  # pragma: no cover - needs a GPU
            frames, slot = [bytes(f) for f in frames], None  # faults keep frames back
        seq = self.next_seq[dst]
        self.next_seq[dst] += 1
        checksum = self.config.checksum
        head = messages.envelope(
            key,
            seq,
            time.time(),
            epoch=self.epoch,
            checksum=checksum,
            ranges_crc=checksum_of(algorithm, frames) if checksum else None,
            ranges_alg=algorithm if checksum else None,
        )
        self._put_through_faults(dst, key, [head, *frames], seq, slot=slot)

    def _put_through_faults(
        self,
        dst: int,
        key: str,
        frames: list[Any],
        seq: int,
        *,
        slot: Slot | None = None,
        traced: bool = False,
    ) -> bool:
        """Send one data message (envelope first) to ``dst`` through the run's wire faults,
        each booked, in the one order push, pull and write share [sim.faults]: garbage
        before it, drop, corrupt (the envelope stays readable), delay, reorder (held until
        something overtakes it), dup. ``traced`` sends it as a push does [LIFE-4]; True when
        it went out, False when it was dropped or held back."""
        if self.faults.hit("garbage"):
            self._put(dst, [self.faults.garbage()])
            self.book.inject("garbage", self._edge_name(self.who.rank, dst, self.who.stage))
        if self.faults.hit("drop"):
            self.book.inject("drop", key)
            return False
        if self.faults.hit("corrupt"):
            frames = self.faults.corrupt(frames, first=1)
            self.book.inject("corrupt", key)
        if self.config.faults.delay_s:
            time.sleep(self.config.faults.delay_s)
        if self.faults.hit("reorder"):
            self.held[dst].append((key, frames, seq))  # booked once something overtakes it
            return False
        if traced:
            self._send(dst, key, frames, seq, slot=slot)
        else:
            self._put(dst, frames, slot=slot)
        if self.faults.hit("dup"):
            self._put(dst, frames)
            self.book.inject("dup", key)
        self._release_held(dst, overtaken=True)
        return True

    def key_request(self, key: str) -> str:
        """The request a key of this rank's sends names [KEY-1]."""
        return parse_key(key).request_id

    def _send(
        self, dst: int, key: str, frames: list[Any], seq: int, *, slot: Slot | None = None
    ) -> None:
        """Put a data message on the wire, recorded as a send [LIFE-4]; ``late=P`` keeps a
        copy back, to land after the next message on this edge. Frames in a staging
        ``slot`` keep it in flight until the socket is done with them [sim.staging]."""
        self._record_send({"ev": "send", "request": self.key_request(key)})
        self._put(dst, frames, slot=slot)
        top = self.top_seq[dst] = max(self.top_seq.get(dst, -1), seq)
        waiting = []
        for copy in self.late.pop(dst, []):
            copy.after += seq > copy.seq  # only a later message overtakes it
            if copy.after < copy.span:
                waiting.append(copy)
            else:
                self._put(dst, copy.frames)
                self.book.inject("late", copy.key)
        if waiting:
            self.late[dst] = waiting
        if self.faults.hit("late"):  # it lands after 1..LATE_SPAN more messages on the edge
            span = self.faults.rng.randint(1, LATE_SPAN)
            overtaken = int(top > seq)  # its original was itself overtaken (reordered)
            self.late[dst].append(LateCopy(key, frames, seq, span, overtaken))

    def _flush_late(self, dst: int, request: str | None = None) -> None:
        """Send now the late copies held for ``dst`` (of ``request`` only, if given): a copy
        that something overtook lands late; one that nothing overtook is a plain dup."""
        keep = []
        for copy in self.late.pop(dst, []):
            if request is not None and self.key_request(copy.key) != request:
                keep.append(copy)
                continue
            self._put(dst, copy.frames)
            self.book.inject("late" if copy.after else "dup", copy.key)
        if keep:
            self.late[dst] = keep

    def _record_send(self, event: dict[str, Any]) -> None:
        with suppress(LifecycleRefusal, LifecycleError):  # the trace checker names it
            self.sends.apply(event)
        if len(self.send_trace) < 200_000:
            self.send_trace.append(event)

    def _fault_strikes(self, kind: str, count: int) -> bool:
        return any(
            f.kind == kind
            and f.applies_to(self.who.stage, self.config.last_stage, self.who.rank, sending=True)
            and f.nth == count
            for f in self.config.faults.ranks
        )

    def _maybe_restart(self) -> None:
        """``restart=R``: past its fraction of the work the sender comes back in a new
        epoch; what its old incarnation still held lands after the announcement, then it
        declares the old epoch quiet [LIFE-6]."""
        for fault in self.config.faults.ranks:
            if (
                fault.kind != "restart"
                or self.epoch > 0
                or not fault.applies_to(
                    self.who.stage, self.config.last_stage, self.who.rank, sending=True
                )
                or self._progress(True) < fault.fraction
            ):
                continue
            self._announce("restart")
            self.epoch += 1
            for dst in self.targets:
                self._put(dst, [messages.notice("restart", self.epoch)])
                self.book.inject("restart", self._edge_name(self.who.rank, dst, self.who.stage))
            for dst in self.targets:  # the old epoch's leftovers, landing after the restart
                self._flush_late(dst)
                self._put(dst, [messages.notice("quiesced", self.epoch - 1)])

    def _release_held(self, dst: int, *, overtaken: bool) -> None:
        """Send the messages held back for ``dst``; a reorder happened if one overtook them."""
        for key, frames, seq in self.held.pop(dst, []):
            self._send(dst, key, frames, seq)
            if overtaken:
                self.book.inject("reorder", key)

    def _put(self, dst: int, frames: list[Any], *, slot: Slot | None = None) -> None:
        """Queue frames for receiver ``dst``'s verified connection without blocking the loop
        (over gloo or NCCL the tensor frames then go, and are waited for [sim.p2p]);
        frames in a staging ``slot`` are tracked, the slot held until zmq lets them go."""
        assert self.router is not None
        bulk: list[Any] = []
        carrier, peer = self.carrier, self._peer(self.who.stage + 1, dst)
        if carrier is not None:  # the tensor frames go over torch.distributed [sim.p2p]
            parts = carrier.split(peer, frames)
            if parts is None:  # its pair failed: lost, and reported so by the end-of-stream
                self.stats["p2p_lost"] += 1
                return
            frames, bulk = parts
        message = [self.peers[dst], *frames]
        while True:
            try:
                tracker = self.router.send_multipart(
                    message, copy=False, flags=zmq.NOBLOCK, track=slot is not None
                )
                if slot is not None:
                    slot.hold(tracker)
                self.stats["messages_sent"] += 1
                if carrier is not None and bulk:
                    carrier.send(peer, bulk)
                return
            except zmq.Again:  # the pipe is full: read what arrives so none fills both ways
                self._pump(POLL_MS)
                if self.stopping:
                    return
            except zmq.ZMQError as error:
                if error.errno == zmq.EHOSTUNREACH:
                    self.stats["unreachable"] += 1
                    return
                raise

    def _pump(self, timeout_ms: int) -> None:
        """Handle whatever arrives within ``timeout_ms``: commands, hellos and data."""
        sock: zmq.Socket[Any]
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.control:
                self._on_control(messages.load(sock.recv()))
            elif sock is self.router:
                self._on_router(sock.recv_multipart())
            elif sock is self.monitor:
                sock.recv_multipart()
                self.stats["connections_accepted"] += 1
            else:
                src = self.dealers[sock]
                frames = sock.recv_multipart(copy=False)
                if self.carrier is not None:  # [sim.p2p]: the frames that came over it
                    joined = self.carrier.join(self._peer(self.who.stage - 1, src), frames)
                    if joined is None:
                        self.stats["p2p_lost"] += 1
                        continue
                    frames = joined
                self._on_data(src, frames)

    def _on_router(self, frames: list[bytes]) -> None:
        """What reaches a sender's KV socket: a receiver's signed hello, or a stranger."""
        assert self.router is not None  # these frames came from it
        if self.pull is not None and len(frames) == 3:  # pull [sim.pull]: a read
            self.pull.on_read(frames)
            return
        if len(frames) != 2:
            self.strangers["kv messages"] += 1
            return
        peer, body = frames
        verified = {route: dst for dst, route in self.peers.items()}
        if peer in verified:
            self._on_abort(verified[peer], body)
            return
        try:
            hello = messages.read_handshake(body)
        except messages.MessageError:
            self.strangers["kv messages"] += 1
            return
        dst = hello.get("hello")
        if dst not in self.targets:
            self.strangers["kv hellos refused"] += 1
            return
        receiver = self._peer(self.who.stage + 1, dst).tag
        if not self.secret.verify(hello["mac"], "hello", self.who.tag, receiver, hello["nonce"]):
            self.strangers["kv hellos refused"] += 1
            return
        if dst in self.peers:
            if self.peers[dst] != peer:  # a replayed hello from another connection
                self.strangers["kv identities already taken"] += 1
            return
        self.peers[dst] = peer
        mac = self.secret.sign("welcome", self.who.tag, receiver, hello["nonce"])
        self.router.send_multipart([peer, messages.welcome(self.who.rank, mac)])

    def _on_abort(self, dst: int, body: bytes) -> None:
        """Receiver ``dst`` aborted a request: send nothing more of it, flush what was
        still held for it, then acknowledge — after which nothing of it is sent [LIFE-4]."""
        try:
            request = messages.read_abort(body)
        except messages.MessageError:
            return  # a repeated hello, say
        self.book.observe("abort", f"{request} {self.who.rank}->{dst}")
        # The request has failed: nothing more of it goes to any receiver once the abort
        # is acknowledged, so what is still held for each is flushed first [LIFE-4].
        for target in self.targets:
            self.aborted_out.add((request, target))
            held = self.held.pop(target, [])
            keep_held = [entry for entry in held if self.key_request(entry[0]) != request]
            for key, frames, seq in held:
                if self.key_request(key) == request:
                    self._send(target, key, frames, seq)  # nothing overtook it: in order
            if keep_held:
                self.held[target] = keep_held
            self._flush_late(target, request)
        self._record_send({"ev": "abort_ack", "request": request})
        self._put(dst, [messages.notice("ack", request)])

    def _nothing_left_to_forward(self) -> bool:
        if self.pull is not None and not self.pull.all_served():  # pull [sim.pull]
            return False
        if self.who.stage == 0:
            return True
        return all(state.done for state in self.incoming.values())

    def _finish_sending(self) -> None:
        for dst in self.targets:
            self._release_held(dst, overtaken=False)  # nothing overtook them: in order
            self._flush_late(dst)
            self._put(dst, [messages.end_of_stream(self.sent_keys[dst], self.skipped[dst])])
        self.unfinished_senders = False
        self._event({"ev": "sent", "stats": dict(self.stats)})

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

    def _progress(self, sending: bool) -> float:
        if sending:
            total = (
                len(self.requests)
                * max(self.config.chunks, self.groups)
                * max(1, len(self.targets))
            )
            return sum(len(k) for k in self.sent_keys.values()) / total
        finished = sum(s.done for s in self.incoming.values())
        return finished / max(1, len(self.incoming))

    # -- receiving -------------------------------------------------------------------
    def expected_envelope(
        self, src: int, frames: list[zmq.Frame]
    ) -> tuple[dict[str, Any], tuple[str, int, int]] | None:
        """The envelope of a data message from ``src`` and the (request, chunk, source) its
        key belongs to; ``None``, counted, when it is unreadable or not a key ``src`` sends
        here (push and pull alike)."""
        try:
            envelope = messages.read_envelope(frames[0].buffer)
        except messages.MessageError:
            self.stats["unreadable_envelopes"] += 1
            return None
        owner = self.key_owner.get(envelope["key"])
        if owner is None or owner[2] != src:
            self.stats["unexpected_keys"] += 1
            return None
        return envelope, owner

    def admit_answer(
        self, src: int, frames: list[zmq.Frame]
    ) -> tuple[dict[str, Any], tuple[str, int, int]] | None:
        """A pull answer or a write from ``src``, once: its envelope and owner as
        :meth:`expected_envelope` reads them, a second copy booked as a dup and an overtaken
        one as a reorder [sim.faults], its key no longer awaited; ``None`` when not to land."""
        read = self.expected_envelope(src, frames)
        if read is None:
            return None
        head, owner = read
        key = head["key"]
        if key in self.seen:
            self.book.observe("dup", key)
            return None
        self.seen.add(key)
        if head["seq"] < self.max_seq.get(src, -1):
            self.book.observe("reorder", key)
        else:
            self.max_seq[src] = head["seq"]
        self.incoming[owner[0]].waiting.discard(key)
        return read

    def _on_data(self, src: int, frames: list[zmq.Frame]) -> None:
        """One message from source ``src``: its welcome, a notice, an end-of-stream, or KV."""
        received_at = time.time()
        if src not in self.welcomed:
            self._on_welcome(src, frames)
            return
        if len(frames) == 1:
            try:
                message = messages.read_single(frames[0].buffer, limit=1 << 62)
            except messages.MessageError:  # garbage has no key: it is booked by its edge
                self.book.observe(
                    "garbage", self._edge_name(src, self.who.rank, self.who.stage - 1)
                )
                return
            if "end" in message:
                self._source_ended(src, message)
            else:
                self._on_notice(src, message)
            return
        if self.pull is not None:  # pull [sim.pull]: an answer to a read
            self.pull.on_answer(src, frames, received_at)
            return
        read = self.expected_envelope(src, frames)
        if read is None:
            return
        envelope, owner = read
        key = envelope["key"]
        request_id, chunk_id, _ = owner
        state = self.incoming[request_id]
        if key in self.seen:  # a second copy: right after the first (dup) or later (late)
            late = envelope["seq"] < self.max_seq.get(src, -1)
            self.book.observe("late" if late else "dup", key)
            self._stale_write(key, envelope["epoch"], frames)
            return
        self.seen.add(key)
        if envelope["seq"] < self.max_seq.get(src, -1):
            self.book.observe("reorder", key)
        else:
            self.max_seq[src] = envelope["seq"]
        state.waiting.discard(key)
        if self.pool is not None and request_id not in self.pool.tables and not state.done:
            needed = blocks_needed(
                self.memory.held(state.request), self.config.layout_of(self.who.stage)[1]
            )
            self.pool.admit(request_id, needed, state.keys)
        landed = True
        if self.pool is not None and request_id in self.pool.tables:
            outcome = self.pool.write(key, envelope["epoch"])
            landed = outcome == "landed"
            if outcome == "stale":
                self._clobber(key, frames)
        try:
            payload = decode(
                [f.buffer for f in frames[1:]], require_checksum=self.config.require_checksum
            )
        except WireError as error:
            self.book.observe("corrupt", key)  # counted even when the request already failed
            if self.pool is not None and request_id in self.pool.tables:
                self.pool.fail(key)
                self.pool.quiesce(key)  # it arrived whole: nothing more will land from it
            self._fail(state, f"shard {key} from source rank {src} refused by the codec: {error}")
            return
        if self.pool is not None and request_id in self.pool.tables:
            self.pool.complete(key)
        if not landed:
            self.stats["writes_refused"] += 1  # a closed handle or a stale epoch
            return
        if state.done:
            self.stats["late_ignored"] += 1  # its request already failed for another reason
            return
        if payload.request_id != request_id or payload.chunk.chunk_id != chunk_id:
            self._fail(
                state,
                f"shard {key} from source rank {src} holds request "
                f"{messages.short(payload.request_id)} chunk {payload.chunk.chunk_id}, not what "
                "its key names",
            )
            return
        state.first_sent = min(state.first_sent, envelope["t"])
        if isinstance(envelope.get("t0"), (int, float)):
            state.started = min(state.started, envelope["t0"])
        state.edge_bytes[src] += sum(
            t.numel() * t.element_size()
            for t in (*payload.key_cache, *payload.value_cache)
            if t is not None
        )
        state.arrived += 1
        if self.groups:  # streamed: a layer group lands once every source's part is here
            if not self._land_part(state, self.key_group[key], src, payload):
                return
        else:
            state.chunks[chunk_id].append((src, payload))
        if state.abort_after is not None and state.arrived > state.abort_after and state.waiting:
            self._fail(state, f"aborted by the receiver after {state.arrived} shard(s) (abort)")
            return
        if not state.waiting:
            if self.groups:
                self.landed(state, received_at)
            else:
                self._complete(state, received_at)

    def _land_part(self, state: Incoming, g: int, src: int, payload: Payload) -> bool:
        """Keep one source's part of layer group ``g``; once every source's part is here,
        place the group and scatter it into the cache's layers [STREAM-1.3, PAGED-4].
        False when the group was refused (the request has failed)."""
        assert self.in_plan is not None
        parts = state.groups[g]
        parts.append((src, payload))
        plan = self.in_plan.of(state.request)
        group = self.layer_groups[g]
        if len(parts) < len(group_sources(plan, self.who.rank, group)):
            return True
        mine = group_layers(self.owner.layers, group)
        first = mine.start - self.owner.layers.start
        try:
            kv = self.memory.to_device(merge_layers(plan, self.who.rank, group, parts))
            cache = self.cache
            layers = replace(
                cache,
                layers=cache.layers[first : first + len(mine)],
                scales=None if cache.scales is None else cache.scales[first : first + len(mine)],
            )
            self.memory.scatter(kv, layers, self.tables[state.request.request_id])
        except ValueError as error:
            self._fail(state, f"layers {mine.start}..{mine.stop - 1} refused on assembly: {error}")
            return False
        del state.groups[g]  # the frames can go: the cache holds these layers now
        return True

    def _stale_write(self, key: str, epoch: int, frames: list[zmq.Frame]) -> None:
        """A copy of a shard whose transfer already ended. The rules refuse it [LIFE-4];
        with ``--unsafe-reuse`` it lands where its handle pointed."""
        if self.pool is None or key not in self.pool.handles:
            return
        if self.pool.write(key, epoch) == "stale":
            self._clobber(key, frames)
        else:
            self.stats["writes_refused"] += 1

    def _clobber(self, key: str, frames: list[zmq.Frame]) -> None:
        """Land a closed handle's data at the blocks it was posted with, as an RDMA write
        to a stale address would: whoever owns those blocks now gets its bytes."""
        assert self.pool is not None
        try:
            payload = decode([f.buffer for f in frames[1:]])
        except WireError:
            return
        values = next(t for t in payload.key_cache if t is not None).reshape(-1)
        handle = self.pool.handles[key]
        reused = [b for b in handle.blocks if self.pool.owner.get(b) not in (None, handle.request)]
        for layer in self.cache.layers:
            for view in self.cache.views(layer):
                for block in reused:
                    target = view[block]
                    repeats = -(-target.numel() // max(1, values.numel()))
                    source = values.repeat(repeats)[: target.numel()].reshape(target.shape)
                    target.copy_(source.to(target.dtype))

    def _on_notice(self, src: int, message: dict[str, Any]) -> None:
        """A sender's notice [LIFE]: an abort acknowledged, a send failed, a restart."""
        pool = self.pool
        if pool is None:
            return
        if "ack" in message:
            request = message["ack"]
            self.awaiting_ack.discard((request, src))
            for key, h in pool.handles.items():
                if h.request == request and h.source == src:
                    pool.quiesce(key)
        elif "failed" in message:
            key = message["failed"]
            owner = self.key_owner.get(key)
            if owner is None or owner[2] != src:
                return
            self.book.observe("fail-nth", key)
            state = self.incoming[owner[0]]
            state.waiting.discard(key)
            self.seen.add(key)
            if owner[0] not in pool.tables and not state.done:
                size = self.config.layout_of(self.who.stage)[1]
                pool.admit(
                    owner[0], blocks_needed(self.memory.held(state.request), size), state.keys
                )
            pool.fail(key)
            pool.quiesce(key)  # the sender says the failed send wrote nothing
            self._fail(state, f"the send of shard {key} failed at source rank {src}")
        elif "restart" in message:
            epoch = message["restart"]
            self.book.observe("restart", self._edge_name(src, self.who.rank, self.who.stage - 1))
            self.restarted_from.add(src)
            for key in pool.restart(src, epoch):
                state = self.incoming[pool.handles[key].request]
                self._fail(
                    state,
                    f"source rank {src} restarted in epoch {epoch}; shard {key} of its old "
                    "epoch will never complete",
                )
        elif "quiesced" in message:
            for key, h in pool.handles.items():
                if h.source == src and h.epoch <= message["quiesced"]:
                    pool.quiesce(key)

    def _on_welcome(self, src: int, frames: list[zmq.Frame]) -> None:
        """The first message from a source must be its signed welcome over our nonce."""
        sender = self._peer(self.who.stage - 1, src).tag
        try:
            message = messages.read_handshake(frames[0].buffer) if len(frames) == 1 else {}
        except messages.MessageError:
            message = {}
        if message.get("welcome") == src and self.secret.verify(
            message.get("mac"), "welcome", sender, self.who.tag, self.nonces[src]
        ):
            self.welcomed.add(src)
        else:
            self.strangers["kv messages before the welcome"] += 1

    def _source_ended(self, src: int, message: dict[str, Any]) -> None:
        """End-of-stream: any key of ``src`` still missing will never come."""
        if src in self.ended_sources:
            return
        self.ended_sources.add(src)
        skipped = message.get("skipped", {})
        for key in message["end"]:
            owner = self.key_owner.get(key)
            if owner is not None and owner[2] == src and key not in self.seen:
                self.book.observe("drop", key)
        for state in self.incoming.values():
            if state.done:
                continue
            lost = sorted(k for k in state.waiting if self.key_owner[k][2] == src)
            if not lost:
                continue
            if lost[0] in skipped:
                reason = f"source rank {src} did not send shard {lost[0]}: {skipped[lost[0]]}"
            elif lost[0] in message["end"]:
                reason = (
                    f"shard {lost[0]} from source rank {src} never arrived intact (it was sent; "
                    "lost or unreadable on the way)" + self._p2p_failure(src)
                )
            else:
                reason = f"source rank {src} never sent shard {lost[0]}"
            self._fail(state, reason)

    def _p2p_failure(self, src: int) -> str:
        """Why the tensor frames from ``src`` stopped coming over torch.distributed, if
        they did [sim.p2p]."""
        if self.carrier is None:
            return ""
        why = self.carrier.broken.get(self._peer(self.who.stage - 1, src).tag)
        return f"; its frames over {self.config.transport} failed: {why}" if why else ""

    def _complete(self, state: Incoming, received_at: float) -> None:
        """Merge, reassemble and scatter into the cache [PAYLOAD-3, CHUNK-2, PAGED-4]; then
        verify every element now, or once every request has arrived (``verify_after``)."""
        assert self.in_plan is not None
        request = state.request
        plan = self.in_plan.of(request)
        try:
            if len(state.chunks) == 1:  # one chunk: straight to the shard, one copy fewer
                pairs = state.chunks[0]
                kv = merge_to_request_kv(plan, self.who.rank, pairs, landing=self.memory.landing)
            elif plan.seq_len is not None:  # edges chunk their own tokens: each, then merge
                by_source: dict[int, list[Payload]] = defaultdict(list)
                for pairs in state.chunks.values():
                    for src, payload in pairs:
                        by_source[src].append(payload)
                whole = [(src, reassemble(chunks)) for src, chunks in by_source.items()]
                kv = merge_to_request_kv(plan, self.who.rank, whole)
            else:
                merged = [
                    merge_payloads(plan, self.who.rank, pairs) for pairs in state.chunks.values()
                ]
                kv = reassemble(merged).to_request_kv()
            kv = self.memory.to_device(kv)
            self.memory.scatter(kv, self.cache, self.tables[request.request_id])
        except ValueError as error:
            self._fail(state, f"refused on assembly: {error}")
            return
        state.chunks.clear()  # the frames can go: the cache holds the request now
        self.landed(state, received_at)

    def landed(self, state: Incoming, received_at: float) -> None:
        """Every byte of the request is in the cache: verify now, or (``verify_after``)
        once every request has landed."""
        state.received_at = received_at
        state.ready_at = time.time()
        if not self.config.verify_after:
            self._verify(state)
            return
        self.unverified.append(state)
        if all(s.done or s.received_at is not None for s in self.incoming.values()):
            for waiting in self.unverified:
                self._verify(waiting)
            self.unverified.clear()

    def _receive_nothing(self) -> None:
        """Requests this rank holds nothing of (none of their tokens, or another DP group's)
        have no edge into it: they are verified at once, on no element [CP-1, DP-1]."""
        now = time.time()
        for state in self.incoming.values():
            if not state.waiting and not state.done:
                state.first_sent = state.received_at = now
                state.done = True
                self._event(
                    {
                        "ev": "result",
                        "request": state.request.request_id,
                        "ok": True,
                        "first_sent": now,
                        "received": now,
                        "verified": now,
                        "edge_bytes": {},
                        "elements": 0,
                        "checked_bytes": 0,
                    }
                )
                if self.out_plan is not None:
                    self.outbox.append(state.request.request_id)

    def _verify(self, state: Incoming) -> None:
        """Check every element of the stored request against the oracle [ORACLE-5]."""
        request = state.request
        verdict, checked = self.memory.oracle_verdict(request.request_id)
        if not verdict.ok:
            self._fail(state, self._with_clobbers(verdict.message, request.request_id))
            return
        state.done = True
        self._hold(request.request_id)
        self._event(
            {
                "ev": "result",
                "request": request.request_id,
                "ok": True,
                "first_sent": state.first_sent,
                "received": state.received_at,
                "verified": time.time(),
                "started": None if state.started == float("inf") else state.started,
                "ready": state.ready_at,
                "edge_bytes": {str(src): n for src, n in state.edge_bytes.items()},
                "elements": verdict.total,  # what the report says was verified
                "checked_bytes": checked,
            }
        )
        if self.out_plan is not None:
            self.outbox.append(request.request_id)
        self._maybe_die(sending=False)

    def _hold(self, request_id: str) -> None:
        """A verified request's KV is handed on and held while ``--hold`` more arrive; then
        its blocks go back to the pool [LIFE-7, LIFE-3]. A rank that forwards, or verifies
        at the end, holds everything."""
        if self.pool is None:
            return
        self.pool.deliver(request_id)
        if self.out_plan is not None or self.config.verify_after:
            return
        self.holding.append(request_id)
        while len(self.holding) > self.config.hold:
            oldest = self.holding.popleft()
            if self.recheck:  # was it still intact while it was in use?
                self._recheck(oldest)
            self.pool.release(oldest)

    def _recheck(self, request_id: str) -> None:
        """Verify a held request again; a late write into its reused blocks shows here."""
        verdict, _ = self.memory.oracle_verdict(request_id)
        if not verdict.ok:
            self.corrupted.append(
                {
                    "request": request_id,
                    "elements": verdict.mismatches,
                    "why": self._with_clobbers(verdict.message, request_id)[:600],
                }
            )

    def _abort(self, request_id: str) -> None:
        """Abort ``request_id`` in the pool, ask each source with a transfer still open to
        stop and acknowledge, and hand the blocks back (they are freed as each transfer
        quiesces) [LIFE-4]."""
        if self.pool is None or request_id not in self.pool.tables:
            return
        for key in self.pool.abort(request_id):
            src = self.pool.handles[key].source
            if src in self.dead_sources or (request_id, src) in self.awaiting_ack:
                continue
            self.awaiting_ack.add((request_id, src))
            self.book.inject("abort", f"{request_id} {src}->{self.who.rank}")
            dealer = next(d for d, s in self.dealers.items() if s == src)
            with suppress(zmq.ZMQError):
                dealer.send(messages.abort(request_id), zmq.NOBLOCK)
        self.pool.release(request_id)

    def _with_clobbers(self, message: str, request_id: str) -> str:
        """Name the stale writes that hit ``request_id``'s blocks (``--unsafe-reuse``)."""
        if self.pool is None:
            return message
        hits = [c for c in self.pool.clobbers if request_id in c.into.values()]
        if not hits:
            return message
        c = hits[0]
        blocks = [b for b, owner in c.into.items() if owner == request_id]
        return (
            f"{message}; block(s) {blocks} were overwritten by a late write of shard {c.key} "
            f"of request {c.of_request} after they were reused (--unsafe-reuse) [LIFE-3]"
        )

    def _fail(self, state: Incoming, reason: str) -> None:
        if state.done:
            return
        state.done = True
        rid = state.request.request_id
        self._abort(rid)
        self._event({"ev": "result", "request": rid, "ok": False, "reason": reason})
        if self.out_plan is not None:  # tell the next stage why it will not get this request
            why = f"it failed at stage {self.who.stage}: {reason}"[:MAX_REASON]
            for key, dst, _ in self._out_keys(state.request):
                self.skipped[dst][key] = why
        self._maybe_die(sending=False)

    def _close(self) -> None:
        for sock in (self.monitor, self.router, *self.dealers):
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
    plan for ``--transport gloo|nccl`` (:mod:`sim.p2p`).
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
