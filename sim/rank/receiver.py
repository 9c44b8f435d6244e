"""The receiver role of a rank: what arrives from its sources, admitted, landed, verified.

It keeps every request it awaits (:class:`sim.paths.datapath.Incoming`: the keys still
missing, what has arrived, its accounts), the welcome of each source (:mod:`sim.net.auth`),
the sources' notices and end-of-streams, and the receiver's side of the lifecycle:
hold, re-check, abort and release [LIFE-1..7]. Every data path hands what arrives to
the one admission, :meth:`Receiver.admit`; once a request's bytes are all in the cache
it is verified, every element, against the oracle [ORACLE-5]. It is given the rank's
:class:`sim.rank.context.RankContext`, never the rank, and two hooks into its sender role
(``forward`` a verified request; ``skip`` a failed one).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import zmq

from kvspec.memory.paged import blocks_needed
from kvspec.naming.keys import recv_keys
from kvspec.topology.plan import TransferPlan
from kvspec.transport.streaming import group_sources, stream_chunk_id
from sim.net import messages
from sim.net.auth import RunSecret
from sim.paths.datapath import Incoming, Landing
from sim.rank.context import RankContext
from sim.run.workload import Request, edge_chunks

MAX_REASON = 300


class Receiver:
    """The receiving side of one rank (see the module)."""

    def __init__(
        self,
        ctx: RankContext,
        secret: RunSecret,
        forward: Callable[[str], None],
        skip: Callable[[Request, str], None],
    ) -> None:
        self.ctx, self.secret, self.forward, self.skip = ctx, secret, forward, skip
        self.incoming: dict[str, Incoming] = {}
        self.unverified: list[Incoming] = []
        self.key_owner: dict[str, tuple[str, int, int]] = {}  # key -> (request, chunk, src)
        self.key_group: dict[str, int] = {}  # streamed [STREAM-1]: key -> its layer group
        self.nonces: dict[int, str] = {}  # source rank -> the nonce of our hello
        self.welcomed: set[int] = set()  # sources whose welcome verified
        self.seen: set[str] = set()  # keys that arrived in any form
        self.max_seq: dict[int, int] = {}  # per source: the highest seq seen
        self.ended_sources: set[int] = set()
        self.dead_sources: set[int] = set()
        self.dealers: dict[zmq.Socket[Any], int] = {}
        # lifecycle [LIFE]: delivered requests held, aborts pending, re-checks
        self.holding: deque[str] = deque()  # delivered requests still held, oldest first
        self.awaiting_ack: set[tuple[str, int]] = set()  # (request, source) aborts pending
        self.restarted_from: set[int] = set()
        faults = ctx.config.faults
        self.recheck_held = ctx.config.unsafe_reuse or bool(
            faults.late or faults.abort or any(f.kind == "restart" for f in faults.ranks)
        )  # a held request is verified again before its blocks go back
        self.corrupted: list[dict[str, Any]] = []

    # -- the inbound port a data path receives through (sim.paths.datapath.Inbound) -----
    def awaited(self, request_id: str) -> Incoming:
        """What this receiver holds of ``request_id``."""
        return self.incoming[request_id]

    def owners(self) -> list[tuple[str, tuple[str, int, int]]]:
        """Every awaited key with its (request, chunk, source), in the order expected."""
        return list(self.key_owner.items())

    def owner(self, key: str) -> tuple[str, int, int]:
        """The (request, chunk, source) of an awaited key."""
        return self.key_owner[key]

    def group_of(self, key: str) -> int:
        """The layer group a streamed key carries [STREAM-1]."""
        return self.key_group[key]

    def is_dead(self, src: int) -> bool:
        """Whether source ``src`` is known dead."""
        return src in self.dead_sources

    def has_ended(self, src: int) -> bool:
        """Whether source ``src`` sent its end-of-stream."""
        return src in self.ended_sources

    def dealer_of(self, src: int) -> zmq.Socket[Any]:
        """The connection to source ``src``."""
        return next(d for d, s in self.dealers.items() if s == src)

    # -- what arrives ----------------------------------------------------------------
    def on_data(
        self,
        src: int,
        frames: list[Any],
        complete: Callable[[int, list[Any], float], None],
    ) -> None:
        """One message from source ``src``: its welcome, a notice, an end-of-stream, or a
        data message (``complete``: the data path's, which admits it)."""
        received_at = time.time()
        if src not in self.welcomed:
            self._on_welcome(src, frames)
            return
        if len(frames) == 1:
            try:
                message = messages.read_single(frames[0].buffer, limit=1 << 62)
            except messages.MessageError:  # garbage has no key: it is booked by its edge
                self.ctx.book.observe(
                    "garbage", self.ctx.edge_name(src, self.ctx.who.rank, self.ctx.who.stage - 1)
                )
                return
            if "end" in message:
                self._source_ended(src, message)
            else:
                self._on_notice(src, message)
            return
        complete(src, frames, received_at)

    def copy_kind(self, src: int, seq: int) -> str:
        """What a second copy of an admitted key is, on every path: ``late`` when its
        ``seq`` is below the highest its edge has seen (something sent after it arrived
        first), else ``dup`` [sim.books.accounting]."""
        return "late" if seq < self.max_seq.get(src, -1) else "dup"

    def admit(self, src: int, frames: list[Any], received_at: float, landing: Landing) -> None:
        """The one admission of a data message from ``src``, whatever its path: the
        envelope read and its key one ``src`` sends here (else counted and dropped); a
        second copy booked (:meth:`copy_kind`) and handed to the path, never landed; a
        reordered one booked; the path's integrity check, a refusal booked ``corrupt``
        and failing the request; a write the rules refuse, or for a request already
        ended, counted and not landed; then the path lands it, and the request's
        accounts are kept: when it was sent and begun, its edge's bytes, the shards
        arrived (``abort=P`` strikes by them), and once nothing more is awaited the path
        finishes it."""
        ctx = self.ctx
        read = self._expected(src, frames)
        if read is None:
            return
        head, (request_id, chunk, _) = read
        key = head["key"]
        state = self.incoming[request_id]
        if key in self.seen:  # a second copy: right after the first (dup) or later (late)
            ctx.book.observe(self.copy_kind(src, head["seq"]), key)
            landing.second_copy(key, head, frames)
            return
        self.seen.add(key)
        if head["seq"] < self.max_seq.get(src, -1):
            ctx.book.observe("reorder", key)
        else:
            self.max_seq[src] = head["seq"]
        state.waiting.discard(key)
        checked = landing.check(state, src, key, head, frames)
        if checked.refusal is not None:
            ctx.book.observe("corrupt", key)  # counted even when the request already failed
            self.fail(state, checked.refusal)
            return
        if not checked.lands:
            ctx.stats["writes_refused"] += 1  # a closed handle or a stale epoch
            return
        if state.done:
            ctx.stats["late_ignored"] += 1  # its request already failed for another reason
            return
        landed = landing.land(state, src, key, chunk, checked.data)
        if landed is None:
            return  # refused on landing: the request has failed
        state.first_sent = min(state.first_sent, head["t"])
        if isinstance(head.get("t0"), (int, float)):
            state.started = min(state.started, head["t0"])
        state.edge_bytes[src] += landed
        state.arrived += 1
        if state.abort_after is not None and state.arrived > state.abort_after and state.waiting:
            self.fail(state, f"aborted by the receiver after {state.arrived} shard(s) (abort)")
            return
        if not state.waiting:
            landing.finish(state, received_at)

    def expect_keys(self) -> None:
        """The keys this receiver waits for: one per (request, chunk, plan source) [KEY-4];
        of a hybrid, one per plan source (and stream layer group)."""
        assert self.ctx.in_plan is not None
        chunked = self.ctx.config.chunks > 1
        for request in self.ctx.workload.requests:
            waiting: set[str] = set()
            if self.ctx.config.content == "groups":
                self._expect_pairs(request, waiting)
                self._awaits(request, waiting)
                continue
            plan = self.ctx.in_plan.of(request)
            # An edge's payload is cut into chunks of its own tokens [CHUNK-1, SLICE-4].
            counts = {
                e.src: len(edge_chunks(e.token_count(request.seq_len), self.ctx.config.chunks))
                for e in plan.edges_to(self.ctx.who.rank)
            }
            if self.ctx.groups:
                self._expect_groups(request, waiting)
            for chunk_id in range(0 if self.ctx.groups else len(request.chunks)):
                for key, src in self._keys(plan, request, chunk_id, chunked=chunked):
                    if chunk_id >= counts[src]:
                        continue
                    waiting.add(key)
                    self.key_owner[key] = (request.request_id, chunk_id, src)
            self._awaits(request, waiting)

    def _awaits(self, request: Request, waiting: set[str]) -> None:
        self.incoming[request.request_id] = Incoming(
            request,
            waiting,
            keys={k: self.key_owner[k][2] for k in waiting},
            abort_after=self.ctx.faults.abort_point(request.request_id, len(waiting)),
        )

    def _expect_pairs(self, request: Request, waiting: set[str]) -> None:
        """A hybrid request's keys: one per source whose pieces come here (streamed, per
        stream layer group) [GROUP-3, STREAM-1.2]."""
        assert self.ctx.in_plan is not None
        for pk in self.ctx.in_plan.pair_keys(request):
            if pk.dst == self.ctx.who.rank:
                waiting.add(pk.key)
                self.key_owner[pk.key] = (request.request_id, 0, pk.src)
                if pk.stream is not None:
                    self.key_group[pk.key] = pk.stream

    def _keys(
        self, plan: TransferPlan, request: Request, chunk_id: int, *, chunked: bool
    ) -> tuple[tuple[str, int], ...]:
        """(key, source) of every source that sends this rank chunk ``chunk_id`` of
        ``request`` [KEY-4]."""
        return recv_keys(
            plan,
            request.request_id,
            self.ctx.who.rank,
            from_stage=self.ctx.who.stage - 1,
            to_stage=self.ctx.who.stage,
            chunk_id=chunk_id,
            chunked=chunked,
        )

    def _expect_groups(self, request: Request, waiting: set[str]) -> None:
        """A streamed request's keys: one per layer group and source carrying some of its
        layers [STREAM-1.2]."""
        assert self.ctx.in_plan is not None
        plan = self.ctx.in_plan.of(request)
        for g, group in enumerate(self.ctx.layer_groups):
            sources = group_sources(plan, self.ctx.who.rank, group)
            chunk_id = stream_chunk_id(0, g, self.ctx.groups)
            for key, src in self._keys(plan, request, chunk_id, chunked=True):
                if src in sources:
                    waiting.add(key)
                    self.key_owner[key] = (request.request_id, 0, src)
                    self.key_group[key] = g

    def source_died(self, tag: str) -> None:
        for src in self.ctx.sources:
            if self.ctx.peer(self.ctx.who.stage - 1, src).tag != tag:
                continue
            self.dead_sources.add(src)
            if src in self.ended_sources:
                continue
            for state in self.incoming.values():
                lost = sorted(k for k in state.waiting if self.key_owner[k][2] == src)
                if lost and not state.done:
                    self.fail(state, f"source rank {src} died; shard {lost[0]} never arrived")

    def waiting_summary(self) -> dict[str, list[str]]:
        return {
            rid: sorted(state.waiting)
            for rid, state in self.incoming.items()
            if not state.done and state.waiting
        }

    def _expected(
        self, src: int, frames: list[zmq.Frame]
    ) -> tuple[dict[str, Any], tuple[str, int, int]] | None:
        """The envelope of a data message from ``src`` and the (request, chunk, source) its
        key belongs to; ``None``, counted, when it is unreadable or not a key ``src`` sends
        here (push and pull alike)."""
        try:
            envelope = messages.read_envelope(frames[0].buffer)
        except messages.MessageError:
            self.ctx.stats["unreadable_envelopes"] += 1
            return None
        owner = self.key_owner.get(envelope["key"])
        if owner is None or owner[2] != src:
            self.ctx.stats["unexpected_keys"] += 1
            return None
        return envelope, owner

    def _on_notice(self, src: int, message: dict[str, Any]) -> None:
        """A sender's notice [LIFE]: an abort acknowledged, a send failed, a restart."""
        pool = self.ctx.memory.pool
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
            self.ctx.book.observe("fail-nth", key)
            state = self.incoming[owner[0]]
            state.waiting.discard(key)
            self.seen.add(key)
            if owner[0] not in pool.tables and not state.done:
                size = self.ctx.config.layout_of(self.ctx.who.stage)[1]
                pool.admit(
                    owner[0], blocks_needed(self.ctx.memory.held(state.request), size), state.keys
                )
            pool.fail(key)
            pool.quiesce(key)  # the sender says the failed send wrote nothing
            self.fail(state, f"the send of shard {key} failed at source rank {src}")
        elif "restart" in message:
            epoch = message["restart"]
            self.ctx.book.observe(
                "restart", self.ctx.edge_name(src, self.ctx.who.rank, self.ctx.who.stage - 1)
            )
            self.restarted_from.add(src)
            for key in pool.restart(src, epoch):
                state = self.incoming[pool.handles[key].request]
                self.fail(
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
        sender = self.ctx.peer(self.ctx.who.stage - 1, src).tag
        try:
            message = messages.read_handshake(frames[0].buffer) if len(frames) == 1 else {}
        except messages.MessageError:
            message = {}
        if message.get("welcome") == src and self.secret.verify(
            message.get("mac"), "welcome", sender, self.ctx.who.tag, self.nonces[src]
        ):
            self.welcomed.add(src)
        else:
            self.ctx.strangers["kv messages before the welcome"] += 1

    def _source_ended(self, src: int, message: dict[str, Any]) -> None:
        """End-of-stream: any key of ``src`` still missing will never come."""
        if src in self.ended_sources:
            return
        self.ended_sources.add(src)
        skipped = message.get("skipped", {})
        for key in message["end"]:
            owner = self.key_owner.get(key)
            if owner is not None and owner[2] == src and key not in self.seen:
                self.ctx.book.observe("drop", key)
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
            self.fail(state, reason)

    def _p2p_failure(self, src: int) -> str:
        """Why the tensor frames from ``src`` stopped coming over torch.distributed, if
        they did [sim.net.p2p]."""
        if self.ctx.carrier is None:
            return ""
        why = self.ctx.carrier.broken.get(self.ctx.peer(self.ctx.who.stage - 1, src).tag)
        return f"; its frames over {self.ctx.config.transport} failed: {why}" if why else ""

    def landed(self, state: Incoming, received_at: float) -> None:
        """Every byte of the request is in the cache: verify now, or (``verify_after``)
        once every request has landed."""
        state.received_at = received_at
        state.ready_at = time.time()
        if not self.ctx.config.verify_after:
            self._verify(state)
            return
        self.unverified.append(state)
        if all(s.done or s.received_at is not None for s in self.incoming.values()):
            for waiting in self.unverified:
                self._verify(waiting)
            self.unverified.clear()

    def receive_nothing(self) -> None:
        """Requests this rank holds nothing of (none of their tokens, or another DP group's)
        have no edge into it: they are verified at once, on no element [CP-1, DP-1]."""
        now = time.time()
        for state in self.incoming.values():
            if not state.waiting and not state.done:
                state.first_sent = state.received_at = now
                state.done = True
                self.ctx.event(
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
                if self.ctx.out_plan is not None:
                    self.forward(state.request.request_id)

    def _verify(self, state: Incoming) -> None:
        """Check every element of the stored request against the oracle [ORACLE-5]."""
        request = state.request
        verdict, checked = self.ctx.memory.oracle_verdict(request.request_id)
        if not verdict.ok:
            if self.ctx.config.faults.reuse:  # nothing else fails the oracle in such a run
                self.ctx.book.observe("reuse", request.request_id)
            self.fail(state, self.with_clobbers(verdict.message, request.request_id))
            return
        state.done = True
        self._hold(request.request_id)
        self.ctx.event(
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
                "group_bytes": {str(g): n for g, n in state.group_bytes.items()},
                "elements": verdict.total,  # what the report says was verified
                "checked_bytes": checked,
            }
        )
        if self.ctx.out_plan is not None:
            self.forward(request.request_id)
        self.ctx.strike(False)

    def _hold(self, request_id: str) -> None:
        """A verified request's KV is handed on and held while ``--hold`` more arrive; then
        its blocks go back to the pool [LIFE-7, LIFE-3]. A rank that forwards, or verifies
        at the end, holds everything."""
        if self.ctx.memory.pool is None:
            return
        self.ctx.memory.pool.deliver(request_id)
        if self.ctx.out_plan is not None or self.ctx.config.verify_after:
            return
        self.holding.append(request_id)
        while len(self.holding) > self.ctx.config.hold:
            oldest = self.holding.popleft()
            if self.recheck_held:  # was it still intact while it was in use?
                self.recheck(oldest)
            self.ctx.memory.pool.release(oldest)

    def recheck(self, request_id: str) -> None:
        """Verify a held request again; a late write into its reused blocks shows here."""
        verdict, _ = self.ctx.memory.oracle_verdict(request_id)
        if not verdict.ok:
            self.corrupted.append(
                {
                    "request": request_id,
                    "elements": verdict.mismatches,
                    "why": self.with_clobbers(verdict.message, request_id)[:600],
                }
            )

    def _abort(self, request_id: str) -> None:
        """Abort ``request_id`` in the pool, ask each source with a transfer still open to
        stop and acknowledge, and hand the blocks back (they are freed as each transfer
        quiesces) [LIFE-4]."""
        if self.ctx.memory.pool is None or request_id not in self.ctx.memory.pool.tables:
            return
        for key in self.ctx.memory.pool.abort(request_id):
            src = self.ctx.memory.pool.handles[key].source
            if src in self.dead_sources or (request_id, src) in self.awaiting_ack:
                continue
            self.awaiting_ack.add((request_id, src))
            self.ctx.book.inject("abort", f"{request_id} {src}->{self.ctx.who.rank}")
            dealer = next(d for d, s in self.dealers.items() if s == src)
            with suppress(zmq.ZMQError):
                dealer.send(messages.abort(request_id), zmq.NOBLOCK)
        self.ctx.memory.pool.release(request_id)

    def with_clobbers(self, message: str, request_id: str) -> str:
        """Name the stale writes that hit ``request_id``'s blocks (``--unsafe-reuse``)."""
        if self.ctx.memory.pool is None:
            return message
        hits = [c for c in self.ctx.memory.pool.clobbers if request_id in c.into.values()]
        if not hits:
            return message
        c = hits[0]
        blocks = [b for b, owner in c.into.items() if owner == request_id]
        return (
            f"{message}; block(s) {blocks} were overwritten by a late write of shard {c.key} "
            f"of request {c.of_request} after they were reused (--unsafe-reuse) [LIFE-3]"
        )

    def fail(self, state: Incoming, reason: str) -> None:
        if state.done:
            return
        state.done = True
        rid = state.request.request_id
        self._abort(rid)
        self.ctx.event({"ev": "result", "request": rid, "ok": False, "reason": reason})
        if self.ctx.out_plan is not None:  # tell the next stage why it will not get this request
            why = f"it failed at stage {self.ctx.who.stage}: {reason}"[:MAX_REASON]
            self.skip(state.request, why)
        self.ctx.strike(False)
