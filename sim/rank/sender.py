"""The sender role of a rank: what goes out on its KV socket, and the books of it.

It keeps each receiver's verified connection (the hello it answered with a welcome,
:mod:`sim.net.auth`), the sequence numbers of every edge, the keys sent and skipped (the
end-of-stream lists them), the run's wire faults — each applied in the one order push,
pull and write share and booked where injected (:mod:`sim.run.faults`,
:mod:`sim.books.accounting`) — and the sender's side of the lifecycle [LIFE-4, LIFE-6]: a
receiver's abort acknowledged after what was held of it is flushed, the epochs of a
restart. It is given the rank's :class:`sim.rank.context.RankContext`, never the rank; a
data path sends through :meth:`Sender.transmit` (a payload) or :meth:`Sender.put_ranges`
(byte ranges).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import zmq

from kvspec.lifecycle.machine import Lifecycle, LifecycleError, LifecycleRefusal
from kvspec.naming.keys import parse_key, send_keys
from kvspec.transport.checksums import checksum_of, fastest
from kvspec.transport.payload import Payload
from kvspec.transport.streaming import group_layers, stream_key
from kvspec.transport.wire import encode
from sim.cache.staging import Slot
from sim.net import messages
from sim.net.auth import RunSecret
from sim.rank.context import RankContext
from sim.run.workload import Request, edge_chunks

POLL_MS = 20
LATE_SPAN = 8
"""``late=P``: a late copy lands after 1..LATE_SPAN more messages on its edge."""


@dataclass
class LateCopy:
    """``late=P``: a copy of a sent message, held until ``span`` more messages went out."""

    key: str
    frames: list[Any]
    seq: int
    span: int
    after: int = 0
    """Messages of a higher ``seq`` sent since: with one, it lands late."""


class Sender:
    """The sending side of one rank (see the module)."""

    def __init__(self, ctx: RankContext, secret: RunSecret) -> None:
        self.ctx, self.secret = ctx, secret
        self.router: zmq.Socket[Any] | None = None
        self.unfinished = len(ctx.targets) > 0  # no end-of-stream sent yet
        self.outbox: list[str] = []  # request ids ready to send
        self.sent_keys: dict[int, list[str]] = defaultdict(list)
        self.skipped: dict[int, dict[str, str]] = defaultdict(dict)
        self.next_seq: Counter[int] = Counter()  # per target: the envelope's seq
        self.held: dict[int, list[tuple[str, list[Any], int]]] = defaultdict(list)  # reordered
        self.peers: dict[int, bytes] = {}  # target rank -> its verified connection
        # lifecycle [LIFE]: the sender's promises and epoch
        self.sends = Lifecycle(0)  # a sender's side of the rules: no send after an ack
        self.send_trace: list[dict[str, Any]] = []
        self.epoch = 0
        self.aborted_out: set[tuple[str, int]] = set()  # (request, target) told to stop
        self.late: dict[int, list[LateCopy]] = defaultdict(list)
        self.top_seq: dict[int, int] = {}  # per target: the highest seq put on the wire
        self.transmits = 0

    def progress(self) -> float:
        """The fraction of its keys this sender has sent (rank faults strike by it)."""
        ctx = self.ctx
        total = len(ctx.requests) * max(ctx.config.chunks, ctx.groups) * max(1, len(ctx.targets))
        return sum(len(k) for k in self.sent_keys.values()) / total

    def skip(self, request: Request, why: str) -> None:
        """``request`` will not be sent on: every key of it is skipped, with ``why``."""
        for key, dst, _ in self.out_keys(request):
            self.skipped[dst][key] = why

    # -- the outbound port a data path sends through (sim.paths.datapath.Outbound) ------
    def receivers(self) -> list[int]:
        """The receiver ranks with a verified connection."""
        return list(self.peers)

    def receiver_of(self, peer: bytes) -> int | None:
        """The receiver whose verified connection ``peer`` is, or None (a stranger)."""
        return next((dst for dst, known in self.peers.items() if known == peer), None)

    def is_skipped(self, dst: int, key: str) -> bool:
        """Whether ``key`` was skipped for receiver ``dst``."""
        return key in self.skipped[dst]

    def skip_key(self, dst: int, key: str, why: str) -> None:
        """Not send ``key`` to ``dst``; the end-of-stream says why."""
        self.skipped[dst][key] = why

    def mark_sent(self, dst: int, key: str) -> None:
        """``key`` went to ``dst`` (the end-of-stream lists it)."""
        self.sent_keys[dst].append(key)

    def unmark_sent(self, dst: int, key: str) -> None:
        """``key`` did not go to ``dst`` after all (its transfer failed)."""
        self.sent_keys[dst].remove(key)

    def aborted(self, request_id: str, dst: int) -> bool:
        """Whether receiver ``dst`` told this sender to stop sending ``request_id``."""
        return (request_id, dst) in self.aborted_out

    def reuse_early(self) -> None:
        """``--faults reuse=P``, drawn once per request this rank sends any of: its blocks
        are handed to another request before their transfer (:meth:`RankMemory.reuse`),
        booked by request id; the receivers' oracle observes it [LIFE-3, ORACLE-5]. A
        replica nobody reads is never drawn: its reuse would harm nothing."""
        ctx = self.ctx
        for request in ctx.workload.requests:
            if ctx.memory.held(request) and self.out_keys(request) and ctx.faults.hit("reuse"):
                ctx.memory.reuse(request)
                ctx.book.inject("reuse", request.request_id)

    def out_keys(self, request: Request) -> list[tuple[str, int, int]]:
        """(key, target rank, chunk id) of everything this sender sends of ``request``
        [KEY-4]: each edge's chunks of its own tokens; of a hybrid, each receiver's
        pieces (per stream layer group, streamed) [GROUP-3, STREAM-1.2]."""
        assert self.ctx.out_plan is not None
        if self.ctx.config.content == "groups":  # a pair's pieces per key [GROUP-3]
            return [
                (pk.key, pk.dst, 0)
                for pk in self.ctx.out_plan.pair_keys(request)
                if pk.src == self.ctx.who.rank
            ]
        plan = self.ctx.out_plan.of(request)
        if self.ctx.groups:  # one key per layer group and edge carrying some of it [STREAM-1.2]
            return [
                (
                    stream_key(
                        request.request_id,
                        self.ctx.who.stage,
                        0,
                        g,
                        self.ctx.groups,
                        self.ctx.who.rank,
                        e.dst,
                    ),
                    e.dst,
                    0,
                )
                for g, group in enumerate(self.ctx.layer_groups)
                for e in plan.edges_from(self.ctx.who.rank)
                if len(group_layers(e.layers, group))
            ]
        counts = {
            e.dst: len(edge_chunks(e.token_count(request.seq_len), self.ctx.config.chunks))
            for e in plan.edges_from(self.ctx.who.rank)
        }
        return [
            (key, dst, chunk_id)
            for chunk_id in range(len(request.chunks))
            for key, dst in self._send_keys(request.request_id, chunk_id)
            if chunk_id < counts[dst]
        ]

    def _send_keys(self, request_id: str, chunk_id: int) -> tuple[tuple[str, int], ...]:
        """(key, target rank) of every edge this sender sends one chunk on [KEY-4]."""
        assert self.ctx.out_plan is not None
        return send_keys(
            self.ctx.out_plan.of(self.ctx.requests[request_id]),
            request_id,
            self.ctx.who.rank,
            from_stage=self.ctx.who.stage,
            to_stage=self.ctx.who.stage + 1,
            chunk_id=chunk_id,
            chunked=self.ctx.config.chunks > 1,
        )

    def transmit(
        self,
        dst: int,
        key: str,
        payload: Payload,
        started: float | None = None,
        gathered: Slot | None = None,
    ) -> None:
        """Send one data message, with the run's faults applied and booked [sim.run.faults];
        frames in the ``gathered`` slot of the gather ring keep it in flight."""
        request = self.key_request(key)
        if (request, dst) in self.aborted_out:
            self.skipped[dst][key] = "a receiver of the request aborted it"
            return
        self.sent_keys[dst].append(key)
        self.ctx.strike(True)
        self.transmits += 1
        if self._fault_strikes("fail-nth", self.transmits):
            self.ctx.book.inject("fail-nth", key)
            self.put(dst, [messages.notice("failed", key)])
            return
        payload, slot = self.ctx.memory.host(payload)
        slot = slot or gathered
        # CRC-32C where compiled code computes it, else CRC-32 [WIRE-6, WIRE-7]
        wire = encode(payload, checksum=fastest() if self.ctx.config.checksum else False)
        if slot is not None and self.ctx.config.faults.any:  # pragma: no cover - needs a GPU
            # Faults keep frames back (reorder, late) or send them twice: they get their
            # own memory, so that the staging slot is reused only when the socket is done.
            wire, slot = [bytes(f) for f in wire], None
        seq = self.next_seq[dst]
        self.next_seq[dst] += 1
        head = messages.envelope(
            key,
            seq,
            time.time(),
            epoch=self.epoch,
            checksum=self.ctx.config.checksum,
            started=started,
        )
        if self._put_through_faults(dst, key, [head, *wire], seq, slot=slot, traced=True):
            self._maybe_restart()

    def put_ranges(
        self,
        dst: int,
        key: str,
        frames: list[Any],
        slot: Slot | None,
        algorithm: str,
        started: float | None = None,
    ) -> None:
        """Send byte ranges straight from cache memory (a pull answer, a write) as one data
        message: the next sequence number, an envelope whose ``ranges_crc`` covers the
        frames when the run checksums (``algorithm``), through the run's faults
        [sim.run.faults]; ``started``, when the sender began computing the request (a
        streamed run's [STREAM-1]). Frames in a staging ``slot`` are copied first when faults
        may keep them back."""
        if slot is not None and self.ctx.config.faults.any:  # pragma: no cover - needs a GPU
            frames, slot = [bytes(f) for f in frames], None  # faults keep frames back
        seq = self.next_seq[dst]
        self.next_seq[dst] += 1
        checksum = self.ctx.config.checksum
        head = messages.envelope(
            key,
            seq,
            time.time(),
            epoch=self.epoch,
            checksum=checksum,
            ranges_crc=checksum_of(algorithm, frames) if checksum else None,
            ranges_alg=algorithm if checksum else None,
            started=started,
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
        each booked, in the one order push, pull and write share [sim.run.faults]: garbage
        before it, drop, corrupt (the envelope stays readable), delay, reorder (held until
        something overtakes it), dup. ``traced`` sends it as a push does [LIFE-4]; True when
        it went out, False when it was dropped or held back."""
        if self.ctx.faults.hit("garbage"):
            self.put(dst, [self.ctx.faults.garbage()])
            self.ctx.book.inject(
                "garbage", self.ctx.edge_name(self.ctx.who.rank, dst, self.ctx.who.stage)
            )
        if self.ctx.faults.hit("drop"):
            self.ctx.book.inject("drop", key)
            return False
        if self.ctx.faults.hit("corrupt"):
            frames = self.ctx.faults.corrupt(frames, first=1)
            self.ctx.book.inject("corrupt", key)
        if self.ctx.config.faults.delay_s:
            time.sleep(self.ctx.config.faults.delay_s)
        if self.ctx.faults.hit("reorder"):
            self.held[dst].append((key, frames, seq))  # booked once something overtakes it
            return False
        if traced:
            self._send(dst, key, frames, seq, slot=slot)
        else:
            self.put(dst, frames, slot=slot)
        if self.ctx.faults.hit("dup"):
            self.put(dst, frames)
            self.ctx.book.inject("dup", key)
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
        ``slot`` keep it in flight until the socket is done with them [sim.cache.staging]."""
        self._record_send({"ev": "send", "request": self.key_request(key)})
        self.put(dst, frames, slot=slot)
        top = self.top_seq[dst] = max(self.top_seq.get(dst, -1), seq)
        waiting = []
        for copy in self.late.pop(dst, []):
            copy.after += seq > copy.seq  # only a later message overtakes it
            if copy.after < copy.span:
                waiting.append(copy)
            else:
                self.put(dst, copy.frames)
                self.ctx.book.inject("late", copy.key)
        if waiting:
            self.late[dst] = waiting
        if self.ctx.faults.hit("late"):  # it lands after 1..LATE_SPAN more messages on the edge
            span = self.ctx.faults.rng.randint(1, LATE_SPAN)
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
            self.put(dst, copy.frames)
            self.ctx.book.inject("late" if copy.after else "dup", copy.key)
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
            and f.applies_to(
                self.ctx.who.stage, self.ctx.config.last_stage, self.ctx.who.rank, sending=True
            )
            and f.nth == count
            for f in self.ctx.config.faults.ranks
        )

    def _maybe_restart(self) -> None:
        """``restart=R``: past its fraction of the work the sender comes back in a new
        epoch; what its old incarnation still held lands after the announcement, then it
        declares the old epoch quiet [LIFE-6]."""
        for fault in self.ctx.config.faults.ranks:
            if (
                fault.kind != "restart"
                or self.epoch > 0
                or not fault.applies_to(
                    self.ctx.who.stage, self.ctx.config.last_stage, self.ctx.who.rank, sending=True
                )
                or self.progress() < fault.fraction
            ):
                continue
            self.ctx.announce("restart")
            self.epoch += 1
            for dst in self.ctx.targets:
                self.put(dst, [messages.notice("restart", self.epoch)])
                self.ctx.book.inject(
                    "restart", self.ctx.edge_name(self.ctx.who.rank, dst, self.ctx.who.stage)
                )
            for dst in self.ctx.targets:  # the old epoch's leftovers, landing after the restart
                self._flush_late(dst)
                self.put(dst, [messages.notice("quiesced", self.epoch - 1)])

    def _release_held(self, dst: int, *, overtaken: bool) -> None:
        """Send the messages held back for ``dst``; a reorder happened if one overtook them."""
        for key, frames, seq in self.held.pop(dst, []):
            self._send(dst, key, frames, seq)
            if overtaken:
                self.ctx.book.inject("reorder", key)

    def put(self, dst: int, frames: list[Any], *, slot: Slot | None = None) -> None:
        """Queue frames for receiver ``dst``'s verified connection without blocking the loop
        (over gloo or NCCL the tensor frames then go, and are waited for [sim.net.p2p]);
        frames in a staging ``slot`` are tracked, the slot held until zmq lets them go."""
        assert self.router is not None
        bulk: list[Any] = []
        carrier, peer = self.ctx.carrier, self.ctx.peer(self.ctx.who.stage + 1, dst)
        if carrier is not None:  # the tensor frames go over torch.distributed [sim.net.p2p]
            parts = carrier.split(peer, frames)
            if parts is None:  # its pair failed: lost, and reported so by the end-of-stream
                self.ctx.stats["p2p_lost"] += 1
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
                self.ctx.stats["messages_sent"] += 1
                if carrier is not None and bulk:
                    carrier.send(peer, bulk)
                return
            except zmq.Again:  # the pipe is full: read what arrives so none fills both ways
                self.ctx.pump(POLL_MS)
                if self.ctx.stopping():
                    return
            except zmq.ZMQError as error:
                if error.errno == zmq.EHOSTUNREACH:
                    self.ctx.stats["unreachable"] += 1
                    return
                raise

    def on_router(self, frames: list[bytes], on_read: Callable[[list[bytes]], None]) -> None:
        """What reaches a sender's KV socket: a receiver's signed hello, an abort, a read
        (``on_read``: the data path's), or a stranger."""
        assert self.router is not None  # these frames came from it
        if len(frames) == 3:  # a read [sim.paths.pull]; a push or write path refuses it
            on_read(frames)
            return
        if len(frames) != 2:
            self.ctx.strangers["kv messages"] += 1
            return
        peer, body = frames
        verified = {route: dst for dst, route in self.peers.items()}
        if peer in verified:
            self._on_abort(verified[peer], body)
            return
        try:
            hello = messages.read_handshake(body)
        except messages.MessageError:
            self.ctx.strangers["kv messages"] += 1
            return
        dst = hello.get("hello")
        if dst not in self.ctx.targets:
            self.ctx.strangers["kv hellos refused"] += 1
            return
        receiver = self.ctx.peer(self.ctx.who.stage + 1, dst).tag
        if not self.secret.verify(
            hello["mac"], "hello", self.ctx.who.tag, receiver, hello["nonce"]
        ):
            self.ctx.strangers["kv hellos refused"] += 1
            return
        if dst in self.peers:
            if self.peers[dst] != peer:  # a replayed hello from another connection
                self.ctx.strangers["kv identities already taken"] += 1
            return
        self.peers[dst] = peer
        mac = self.secret.sign("welcome", self.ctx.who.tag, receiver, hello["nonce"])
        self.router.send_multipart([peer, messages.welcome(self.ctx.who.rank, mac)])

    def _on_abort(self, dst: int, body: bytes) -> None:
        """Receiver ``dst`` aborted a request: send nothing more of it, flush what was
        still held for it, then acknowledge — after which nothing of it is sent [LIFE-4]."""
        try:
            request = messages.read_abort(body)
        except messages.MessageError:
            return  # a repeated hello, say
        self.ctx.book.observe("abort", f"{request} {self.ctx.who.rank}->{dst}")
        # The request has failed: nothing more of it goes to any receiver once the abort
        # is acknowledged, so what is still held for each is flushed first [LIFE-4].
        for target in self.ctx.targets:
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
        self.put(dst, [messages.notice("ack", request)])

    def finish(self) -> None:
        """Sending is done: what is held back goes now, then each receiver's end-of-stream."""
        for dst in self.ctx.targets:
            self._release_held(dst, overtaken=False)  # nothing overtook them: in order
            self._flush_late(dst)
            self.put(dst, [messages.end_of_stream(self.sent_keys[dst], self.skipped[dst])])
        self.unfinished = False
        self.ctx.event({"ev": "sent", "stats": dict(self.ctx.stats)})
