"""One simulated rank: it keeps a paged cache, sends KV along its plan's edges and verifies
what it receives, every element, against the coordinate-hash oracle.

A rank of stage 0 fills its cache from the oracle and sends; a rank of the last
stage receives; a rank in between does both (it forwards what it verified). Every
rule comes from :mod:`kvspec`: the plans, keys, ports, payloads, wire format, paged
layouts and the oracle. This module only moves bytes and keeps the books.

Sockets: a sender binds a ZMQ ROUTER on its KV port; each receiver connects one
DEALER per plan source (identity = its stage-local rank) and says hello. Data
messages are ``[envelope, *wire frames]`` sent zero-copy; the last message to each
receiver is an end-of-stream listing every key meant for it, so a lost shard is
reported as lost at once instead of by a timeout. Control events go to the parent
over a DEALER (see :mod:`sim.cluster`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import zmq

from kvspec.chunks import reassemble
from kvspec.keys import recv_keys, send_keys
from kvspec.kv import RequestKV
from kvspec.oracle import oracle_kv, oracle_scales, verify
from kvspec.ownership import rank_ownership
from kvspec.paged import (
    PagedCache,
    blocks_of,
    empty_model_cache,
    gather_request,
    scatter_request,
)
from kvspec.payload import (
    Chunk,
    Payload,
    merge_payloads,
    merge_to_request_kv,
    payload_from_shipment,
)
from kvspec.plan import TransferPlan, plan_transfer
from kvspec.reshard import send
from kvspec.wire import WireError, decode, encode
from sim import messages
from sim.config import SimConfig
from sim.endpoints import RankId, kv_endpoint
from sim.faults import FaultInjector
from sim.workload import Request, Workload

POLL_MS = 20
HELLO_TIMEOUT_S = 30.0


def device_for(config: SimConfig, who: RankId) -> torch.device:
    """``cuda:(rank % device_count)`` for ``--device cuda``, else the CPU."""
    if config.device == "cuda":
        return torch.device("cuda", who.rank % torch.cuda.device_count())
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


class Killed(Exception):
    pass


class Rank:
    """The event loop of one rank; :meth:`run` returns when the parent says stop."""

    def __init__(
        self, config: SimConfig, who: RankId, control: str, context: zmq.Context, in_process: bool
    ) -> None:
        self.config, self.who, self.context = config, who, context
        self.control_endpoint = control
        self.in_process = in_process
        self.model = config.model
        self.workload = Workload(config, who.replica)
        self.requests = {r.request_id: r for r in self.workload.requests}
        self.stage_layout = config.stages[who.stage]
        self.owner = rank_ownership(self.stage_layout, self.model, who.rank)
        self.device = device_for(config, who)
        self.in_plan = self._plan(who.stage - 1) if who.stage > 0 else None
        self.out_plan = self._plan(who.stage) if who.stage < config.last_stage else None
        self.targets = self.out_plan.targets_of(who.rank) if self.out_plan else ()
        self.sources = self.in_plan.sources_of(who.rank) if self.in_plan else ()
        self.faults = FaultInjector(config.faults, config.seed, who.replica, who.stage, who.rank)
        self.stats: Counter[str] = Counter()
        self.fault_log: dict[str, list[str]] = defaultdict(list)
        self.incoming: dict[str, Incoming] = {}
        self.unverified: list[Incoming] = []
        self.key_owner: dict[str, tuple[str, int, int]] = {}  # key -> (request, chunk, src)
        self.outbox: list[str] = []  # request ids ready to send
        self.sent_keys: dict[int, list[str]] = defaultdict(list)
        self.skipped: dict[int, dict[str, str]] = defaultdict(dict)
        self.held: list[tuple[int, str, list[Any]]] = []  # reordered messages
        self.stopping = False
        self.ended_sources: set[int] = set()
        self.dead_sources: set[int] = set()
        self.unfinished_senders = len(self.targets) > 0

    # -- setup -----------------------------------------------------------------------
    def _plan(self, stage: int) -> TransferPlan:
        c = self.config
        return plan_transfer(c.stages[stage], c.stages[stage + 1], c.model, policy=c.policy)

    def _make_cache(self) -> tuple[PagedCache, dict[str, list[int]]]:
        layout, block_size = self.config.layout_of(self.who.stage)
        num_blocks, tables = self.workload.block_table(self.who.stage, self.who.rank)
        scales = oracle_scales(
            self.model, layers=self.owner.layers, seed=self.config.seed, device=self.device
        )
        cache = empty_model_cache(
            layout,
            self.model,
            num_blocks=num_blocks,
            block_size=block_size,
            layers=len(self.owner.layers),
            heads=len(self.owner.heads),
            scales=scales,
            device=self.device,
        )
        return cache, tables

    def _fill_from_oracle(self) -> None:
        """Stage 0: every request's KV, as this rank holds it, from the oracle [ORACLE-4]."""
        for request in self.workload.requests:
            kv = oracle_kv(
                self.model,
                request.request_id,
                tokens=request.seq_len,
                layers=self.owner.layers,
                heads=self.owner.heads,
                seed=self.config.seed,
                device=self.device,
            )
            scatter_request(kv, self.cache, self.tables[request.request_id])

    def _open_sockets(self) -> None:
        self.control = self.context.socket(zmq.DEALER)
        self.control.setsockopt(zmq.IDENTITY, self.who.tag.encode())
        self.control.setsockopt(zmq.LINGER, 2000)
        self.control.connect(self.control_endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.router = None
        if self.targets:
            self.router = self.context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.setsockopt(zmq.SNDHWM, 256)
            endpoint = kv_endpoint(self.config, self.who, bind=True)
            try:
                self.router.bind(endpoint)
            except zmq.ZMQError as error:
                raise RuntimeError(
                    f"{self.who.name} cannot bind its KV port {endpoint}: {error}; another "
                    "program holds it — choose another --base-port (or --base-port auto)"
                ) from None
            self.poller.register(self.router, zmq.POLLIN)
        self.dealers: dict[zmq.Socket, int] = {}
        for src in self.sources:
            sender = RankId(self.who.replica, self.who.stage - 1, src)
            dealer = self.context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, str(self.who.rank).encode())
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 0)
            dealer.connect(kv_endpoint(self.config, sender))
            dealer.send(messages.hello(self.who.rank))
            self.dealers[dealer] = src
            self.poller.register(dealer, zmq.POLLIN)

    def _expect_keys(self) -> None:
        """The keys this receiver waits for: one per (request, chunk, plan source) [KEY-4]."""
        assert self.in_plan is not None
        chunked = self.config.chunks > 1
        for request in self.workload.requests:
            waiting = set()
            for chunk_id in range(len(request.chunks)):
                for key, src in recv_keys(
                    self.in_plan,
                    request.request_id,
                    self.who.rank,
                    from_stage=self.who.stage - 1,
                    to_stage=self.who.stage,
                    chunk_id=chunk_id,
                    chunked=chunked,
                ):
                    waiting.add(key)
                    self.key_owner[key] = (request.request_id, chunk_id, src)
            self.incoming[request.request_id] = Incoming(request, waiting)

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.cache, self.tables = self._make_cache()
            if self.who.stage == 0:
                self._fill_from_oracle()
                self.outbox = [r.request_id for r in self.workload.requests]
            if self.in_plan is not None:
                self._expect_keys()
            self._open_sockets()
            self._await_hellos()
            self._event({"ev": "ready", "sends": bool(self.targets)})
            self._await_go()
            self.started = time.time()
            while not self.stopping:
                self._step()
        except Killed:
            return  # a simulated crash: no goodbye, sockets dropped
        except Exception:
            self._event({"ev": "error", "traceback": traceback.format_exc()})
            self._await_stop()
        finally:
            self._close()

    def _await_hellos(self) -> None:
        """A sender is ready once every receiver of its plan has connected and said hello."""
        if self.router is None:
            return
        missing = set(self.targets)
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while missing:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.who.name}: receivers {sorted(missing)} never connected to "
                    f"{kv_endpoint(self.config, self.who)}"
                )
            if self.router.poll(POLL_MS):
                frames = self.router.recv_multipart()
                if len(frames) == 2:
                    try:
                        message = messages.read_single(frames[1])
                    except messages.MessageError:
                        continue
                    missing.discard(message.get("hello", -1))

    def _await_go(self) -> None:
        while True:
            command = messages.load(self.control.recv())
            if command.get("cmd") == "go":
                return
            if command.get("cmd") == "stop":
                self.stopping = True
                return

    def _await_stop(self) -> None:
        while not self.stopping:
            if self.control.poll(200):
                self._on_control(messages.load(self.control.recv()))

    def _step(self) -> None:
        self._read_incoming(0 if self.outbox else POLL_MS)
        if self.outbox:
            self._send_request(self.outbox.pop(0))
        elif self.unfinished_senders and self._nothing_left_to_forward():
            self._finish_sending()

    # -- control ---------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> None:
        self.control.send(messages.dump({**event, "rank": self.who.tag}))

    def _on_control(self, command: dict[str, Any]) -> None:
        if command.get("cmd") == "stop":
            self.stopping = True
        elif command.get("cmd") == "dead":
            for tag in command.get("ranks", []):
                self._source_died(tag)
        elif command.get("cmd") == "pending":
            self._event({"ev": "pending", "waiting": self._waiting_summary()})
        elif command.get("cmd") == "report":
            self._event({"ev": "stats", "stats": dict(self.stats)})

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
        request = self.requests[request_id]
        kv = gather_request(self.cache, self.tables[request_id], request.seq_len)
        _, block_size = self.config.layout_of(self.who.stage)
        for chunk_id, tokens in enumerate(request.chunks):
            part = RequestKV(kv.data[:, :, tokens.start : tokens.stop], kv.scales)
            keys = {dst: key for key, dst in self._send_keys(request_id, chunk_id)}
            blocks = blocks_of(self.tables[request_id], block_size, tokens)
            for shipment in send(self.out_plan, self.who.rank, part, slicing=self.config.slicing):
                payload = payload_from_shipment(
                    self.out_plan,
                    shipment,
                    request_id,
                    block_size=block_size,
                    block_ids=blocks,
                    chunk=Chunk(chunk_id, tokens.start, chunk_id == len(request.chunks) - 1),
                )
                self._transmit(shipment.edge.dst, keys[shipment.edge.dst], self._host(payload))

    def _send_keys(self, request_id: str, chunk_id: int) -> tuple[tuple[str, int], ...]:
        """(key, target rank) of every edge this sender sends one chunk on [KEY-4]."""
        assert self.out_plan is not None
        return send_keys(
            self.out_plan,
            request_id,
            self.who.rank,
            from_stage=self.who.stage,
            to_stage=self.who.stage + 1,
            chunk_id=chunk_id,
            chunked=self.config.chunks > 1,
        )

    def _host(self, payload: Payload) -> Payload:
        """The payload in host memory: staged through pinned buffers from a device cache.

        Each tensor is copied once, asynchronously, into page-locked memory; the wire
        then sends that memory without another copy [WIRE-5].
        """
        if self.device.type == "cpu":
            return payload

        def stage(values: tuple[torch.Tensor | None, ...] | None):
            if values is None:
                return None
            out = []
            for t in values:
                if t is None:
                    out.append(None)
                    continue
                pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                pinned.copy_(t, non_blocking=True)
                out.append(pinned)
            return tuple(out)

        staged = replace(
            payload,
            key_cache=stage(payload.key_cache),
            value_cache=stage(payload.value_cache),
            key_scale=stage(payload.key_scale),
            value_scale=stage(payload.value_scale),
        )
        torch.cuda.current_stream(self.device).synchronize()
        return staged

    def _transmit(self, dst: int, key: str, payload: Payload) -> None:
        """Send one data message, with the run's faults applied [sim.faults]."""
        self.sent_keys[dst].append(key)
        self._maybe_die(sending=True)
        wire = encode(payload, checksum=self.config.checksum)
        head = messages.envelope(key, time.time(), checksum=self.config.checksum)
        frames: list[Any] = [head, *wire]
        if self.faults.hit("garbage"):
            self._put(dst, [self.faults.garbage()])
            self.fault_log["garbage"].append(key)
        if self.faults.hit("drop"):
            self.fault_log["drop"].append(key)
            return
        if self.faults.hit("corrupt"):
            frames = self.faults.corrupt(frames)
            self.fault_log["corrupt"].append(key)
        if self.config.faults.delay_s:
            time.sleep(self.config.faults.delay_s)
        if self.faults.hit("reorder"):
            self.held.append((dst, key, frames))
            self.fault_log["reorder"].append(key)
            return
        self._put(dst, frames)
        if self.faults.hit("dup"):
            self._put(dst, frames)
            self.fault_log["dup"].append(key)
        for held in self.held:
            self._put(held[0], held[2])
        self.held.clear()

    def _put(self, dst: int, frames: list[Any]) -> None:
        """Queue frames for receiver ``dst`` without blocking the loop on a full pipe."""
        assert self.router is not None
        message = [str(dst).encode(), *frames]
        while True:
            try:
                self.router.send_multipart(message, copy=False, flags=zmq.NOBLOCK)
                self.stats["messages_sent"] += 1
                return
            except zmq.Again:  # the pipe is full: read what arrives so none fills both ways
                self._read_incoming(POLL_MS)
            except zmq.ZMQError as error:
                if error.errno == zmq.EHOSTUNREACH:
                    self.stats["unreachable"] += 1
                    return
                raise

    def _read_incoming(self, timeout_ms: int) -> None:
        """Handle whatever arrives within ``timeout_ms``: commands and data."""
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.control:
                self._on_control(messages.load(sock.recv()))
            elif sock is self.router:
                sock.recv_multipart()  # late hellos: nothing to do
            else:
                self._on_data(self.dealers[sock], sock.recv_multipart(copy=False))

    def _nothing_left_to_forward(self) -> bool:
        if self.who.stage == 0:
            return True
        return all(state.done for state in self.incoming.values())

    def _finish_sending(self) -> None:
        for held in self.held:
            self._put(held[0], held[2])
        self.held.clear()
        for dst in self.targets:
            self._put(dst, [messages.end_of_stream(self.sent_keys[dst], self.skipped[dst])])
        self.unfinished_senders = False
        self._event({"ev": "sent", "stats": dict(self.stats), "faults": dict(self.fault_log)})

    def _maybe_die(self, *, sending: bool) -> None:
        """Apply a ``kill``/``hang`` fault once this rank has done its fraction of work."""
        for fault in self.config.faults.ranks:
            if not fault.applies_to(
                self.who.stage, self.config.last_stage, self.who.rank, sending=sending
            ):
                continue
            done = self._progress(sending)
            if done < fault.fraction:
                continue
            if fault.kind == "hang":
                while True:  # unresponsive until the run's deadline kills it
                    time.sleep(1)
            if self.in_process:
                raise Killed
            os.kill(os.getpid(), signal.SIGKILL)

    def _progress(self, sending: bool) -> float:
        if sending:
            total = len(self.requests) * self.config.chunks * max(1, len(self.targets))
            return sum(len(k) for k in self.sent_keys.values()) / total
        finished = sum(s.done for s in self.incoming.values())
        return finished / max(1, len(self.incoming))

    # -- receiving -------------------------------------------------------------------
    def _on_data(self, src: int, frames: list[zmq.Frame]) -> None:
        received_at = time.time()
        if len(frames) == 1:
            try:
                message = messages.read_single(frames[0].buffer)
            except messages.MessageError as error:
                self._refused(src, f"unreadable one-frame message: {error}")
                return
            if "end" in message:
                self._source_ended(src, message)
            return
        try:
            envelope = messages.read_envelope(frames[0].buffer)
        except messages.MessageError as error:
            self._refused(src, f"unreadable envelope: {error}")
            return
        key = envelope["key"]
        owner = self.key_owner.get(key)
        if owner is None or owner[2] != src:
            self._refused(src, f"key {key!r} is not one this rank expects from source {src}")
            return
        request_id, chunk_id, _ = owner
        state = self.incoming[request_id]
        if key not in state.waiting:
            self.stats["duplicates_ignored"] += 1
            return
        state.waiting.discard(key)
        try:
            payload = decode([f.buffer for f in frames[1:]])
        except WireError as error:
            self.stats["codec_refusals"] += 1  # counted even when the request already failed
            self._fail(state, f"shard {key} from source rank {src} refused by the codec: {error}")
            return
        if state.done:
            self.stats["late_ignored"] += 1  # its request already failed for another reason
            return
        if payload.request_id != request_id or payload.chunk.chunk_id != chunk_id:
            self._fail(
                state,
                f"shard {key} from source rank {src} holds request {payload.request_id!r} chunk "
                f"{payload.chunk.chunk_id}, not what its key names",
            )
            return
        state.first_sent = min(state.first_sent, envelope["t"])
        state.edge_bytes[src] += sum(
            t.numel() * t.element_size()
            for t in (*payload.key_cache, *payload.value_cache)
            if t is not None
        )
        state.chunks[chunk_id].append((src, payload))
        if not state.waiting:
            self._complete(state, received_at)

    def _refused(self, src: int, why: str) -> None:
        self.stats["garbage_refused"] += 1
        self.fault_log["refused"].append(f"from source {src}: {why}"[:200])

    def _source_ended(self, src: int, message: dict[str, Any]) -> None:
        """End-of-stream: any key of ``src`` still missing will never come."""
        self.ended_sources.add(src)
        skipped = message.get("skipped", {})
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
                    "lost or unreadable on the way)"
                )
            else:
                reason = f"source rank {src} never sent shard {lost[0]}"
            self._fail(state, reason)

    def _complete(self, state: Incoming, received_at: float) -> None:
        """Merge, reassemble and scatter into the cache [PAYLOAD-3, CHUNK-2, PAGED-4]; then
        verify every element now, or once every request has arrived (``verify_after``)."""
        assert self.in_plan is not None
        request = state.request
        try:
            if len(state.chunks) == 1:  # one chunk: straight to the shard, one copy fewer
                kv = merge_to_request_kv(self.in_plan, self.who.rank, state.chunks[0])
            else:
                merged = [
                    merge_payloads(self.in_plan, self.who.rank, pairs)
                    for pairs in state.chunks.values()
                ]
                kv = reassemble(merged).to_request_kv()
            kv = kv.to(self.device)
            scatter_request(kv, self.cache, self.tables[request.request_id])
        except ValueError as error:
            self._fail(state, f"refused on assembly: {error}")
            return
        state.received_at = received_at
        state.chunks.clear()  # the frames can go: the cache holds the request now
        if not self.config.verify_after:
            self._verify(state)
            return
        self.unverified.append(state)
        if all(s.done or s.received_at is not None for s in self.incoming.values()):
            for waiting in self.unverified:
                self._verify(waiting)
            self.unverified.clear()

    def _verify(self, state: Incoming) -> None:
        """Check every element of the stored request against the oracle [ORACLE-5]."""
        request = state.request
        stored = gather_request(self.cache, self.tables[request.request_id], request.seq_len)
        verdict = verify(
            stored,
            self.model,
            request.request_id,
            tokens=request.seq_len,
            layers=self.owner.layers,
            heads=self.owner.heads,
            seed=self.config.seed,
        )
        if not verdict.ok:
            self._fail(state, verdict.message)
            return
        state.done = True
        self._event(
            {
                "ev": "result",
                "request": request.request_id,
                "ok": True,
                "first_sent": state.first_sent,
                "received": state.received_at,
                "verified": time.time(),
                "edge_bytes": {str(src): n for src, n in state.edge_bytes.items()},
            }
        )
        if self.out_plan is not None:
            self.outbox.append(request.request_id)
        self._maybe_die(sending=False)

    def _fail(self, state: Incoming, reason: str) -> None:
        if state.done:
            return
        state.done = True
        rid = state.request.request_id
        self._event({"ev": "result", "request": rid, "ok": False, "reason": reason})
        if self.out_plan is not None:  # tell the next stage why it will not get this request
            for chunk_id in range(len(state.request.chunks)):
                for key, dst in self._send_keys(rid, chunk_id):
                    self.skipped[dst][key] = f"it failed at stage {self.who.stage}: {reason}"
        self._maybe_die(sending=False)

    def _close(self) -> None:
        for sock in [getattr(self, "control", None), getattr(self, "router", None)]:
            if sock is not None:
                sock.close(linger=0 if sock is not getattr(self, "control", None) else 1000)
        for dealer in getattr(self, "dealers", {}):
            dealer.close(linger=0)


def run_ranks(
    config_json: dict[str, Any], tags: list[tuple[int, int, int]], control: str, in_process: bool
) -> None:
    """Host ``tags`` (replica, stage, rank) in this process, one thread each."""
    config = SimConfig.from_dict(config_json)
    torch.set_num_threads(1)
    context = zmq.Context.instance()
    ranks = [Rank(config, RankId(*tag), control, context, in_process) for tag in tags]
    threads = [threading.Thread(target=r.run, name=r.who.tag, daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
