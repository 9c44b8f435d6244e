"""``--transfer pull``: each receiver reads its descriptors from the senders' caches.

A pull connector never sees tensors. In a pull run every rank registers its paged
cache's memory as regions (:func:`kvspec.memory.descriptors.region_buffers`); for each
(request, chunk, source) a receiver computes the spec's descriptor list [DESC-1..3]
and sends it to the source as a *read*: ``[header, descriptors]``, the header a JSON
object ``{"read": key, "seq": n, "n": count}`` (with a CRC-32 of both frames when
checksums are on) and the descriptors ``count`` rows of five little-endian int64
(src region index, src offset, dst region index, dst offset, length). The source
checks the read came over a verified connection (:mod:`sim.auth`), names one of that
receiver's keys, and asks for exactly the spec's list for it — nothing more of its
cache is ever read — then answers ``[header, range 0, range 1, ...]``: each range the
raw bytes straight from cache memory (zero-copy on the CPU), the header an envelope
(:func:`sim.messages.read_envelope`: ``key``, ``seq``, ``t``) with ``ranges_crc`` and
``ranges_alg`` when checksums are on: the CRC of the ranges by the fastest algorithm
here (:func:`kvspec.transport.checksums.fastest`: CRC-32C [WIRE-7] where compiled code
computes it, else CRC-32 [WIRE-6]), checked by :func:`ranges_intact` as a write's are.
The receiver writes each range straight into its own cache and, once every source of
the request has answered, verifies every element against the oracle, as a push run does.

Every request is read by its own plan (:class:`sim.workload.PlanBook`): with token
shards or attention-DP groups an edge carries a token set [PLAN-6, DP-1], cut into
chunks of its own tokens as a push payload is, and each token is read from and written
to its position among each rank's own tokens (:func:`kvspec.memory.descriptors.share_positions`).

Faults strike answers exactly as they strike push payloads, and are booked the same
way (:mod:`sim.accounting`); a source ends each receiver's stream once it has
answered or skipped every key of that receiver. Reads are bounded
(:func:`sim.sizing.max_read_message`) and so are answers' frames.
"""

from __future__ import annotations

import warnings
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zmq

from kvspec.memory.descriptors import (
    Descriptor,
    DescriptorPlan,
    RegisteredCache,
    judge_descriptors,
    plan_descriptors,
    region_buffers,
    share_positions,
)
from kvspec.memory.paged import blocks_needed
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.tokens import Tokens
from kvspec.transport.checksums import ALGORITHMS, checksum_of, fastest
from sim import messages
from sim.workload import edge_chunks

if TYPE_CHECKING:
    from sim.rank import Incoming, Rank

READ_WINDOW = 8
"""Reads a receiver keeps outstanding per source: memory and sockets stay bounded."""
ROW = 5 * 8
"""Bytes of one descriptor row on the wire."""


def _crc(frames: list[Any]) -> int:
    """CRC-32 of a read's key and descriptor rows, as if joined: a few hundred bytes, where
    the algorithm's speed does not matter [WIRE-6]."""
    return checksum_of("crc32", frames)


def ranges_intact(head: dict[str, Any], ranges: list[Any], *, required: bool) -> bool:
    """Whether the ranges of a pull answer or a write match the envelope's ``ranges_crc``,
    by the algorithm ``ranges_alg`` names (``crc32`` when absent; one outside
    :data:`~kvspec.transport.checksums.ALGORITHMS` is refused) — CRC-32 [WIRE-6] or
    CRC-32C [WIRE-7] over the received frames in place, before a byte lands. Checked when
    ``required`` (the run uses checksums) or whenever the envelope carries one; with
    neither, nothing to check."""
    if not required and "ranges_crc" not in head:
        return True
    algorithm = head.get("ranges_alg", "crc32")
    if algorithm not in ALGORITHMS:
        return False
    return head.get("ranges_crc") == checksum_of(algorithm, ranges)


def _write(target: torch.Tensor, data: memoryview) -> None:
    """Write received bytes straight into cache memory (a read-only frame is never copied
    first on the CPU)."""
    if target.device.type == "cpu":
        target.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the frame is read-only; it is only read
        target.copy_(torch.frombuffer(data, dtype=torch.uint8))


def registered_cache(rank: Rank, stage: int, who: int) -> RegisteredCache:
    """The registration of rank ``who`` of ``stage`` in this run: every rank computes the
    same, from the configuration and the workload [DESC-2]."""
    config, model = rank.config, rank.config.model
    layout, block_size = config.layout_of(stage)
    num_blocks, _ = rank.workload.block_table(stage, who)
    owner = rank_ownership(config.stages[stage], model, who)
    return RegisteredCache(
        layout,
        len(owner.layers),
        num_blocks,
        block_size,
        len(owner.heads),
        model.head_dim,
        model.dtype,
        tensors_per_layer=model.kv_tensors,
    )


def _pick(tokens: Tokens, positions: range) -> Tokens:
    """The tokens at ``positions`` of ``tokens``' ascending order."""
    out, before = [], 0
    for r in tokens.ranges:
        start, stop = max(positions.start - before, 0), min(positions.stop - before, len(r))
        if start < stop:
            out.append(range(r.start + start, r.start + stop))
        before += len(r)
    return Tokens.of(out)


class PullAgent:
    """The pull side of one rank: it posts reads (as a receiver) and answers them (as a
    sender). :class:`sim.rank.Rank` hands it what arrives and asks it when it is done."""

    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self.started = False
        self.algorithm = fastest()  # of answers' ranges [WIRE-6, WIRE-7]
        # receiver side
        self.pending: dict[int, deque[tuple[str, str, int]]] = defaultdict(deque)
        self.outstanding: dict[int, dict[str, tuple[int, DescriptorPlan]]] = defaultdict(dict)
        self.read_seq: dict[int, int] = defaultdict(int)
        # sender side
        self.ready_requests: set[str] = set()
        self.waiting_reads: dict[str, list[tuple[int, str, int, list[Descriptor]]]] = defaultdict(
            list
        )
        self.keys_of: dict[str, tuple[str, int, int]] = {}  # key -> (request, chunk, dst)
        self.answered: set[str] = set()
        self._tables: dict[tuple[int, int], dict[str, list[int]]] = {}
        self._registered: dict[tuple[int, int], RegisteredCache] = {}

    # -- set-up ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before the ready barrier: what a connector does at registration (nothing more
        for a pull: its lists are computed as its reads are posted)."""

    def start(self) -> None:
        """Register this rank's regions and lay out every read it will post."""
        rank = self.rank
        self.own = RegisteredCache.of(rank.cache, head_dim=rank.model.head_dim)
        self.buffers = region_buffers(rank.cache)
        self.names = list(self.own.regions())
        if rank.out_plan is not None:
            for request in rank.workload.requests:
                for key, dst, chunk in rank._out_keys(request):
                    self.keys_of[key] = (request.request_id, chunk, dst)
        if rank.in_plan is not None:
            for key, (request_id, chunk, src) in rank.key_owner.items():
                self.pending[src].append((key, request_id, chunk))
            self.sources = {src: self._peer(rank.who.stage - 1, src) for src in rank.sources}
            self.source_index = {
                src: {name: i for i, name in enumerate(cache.regions())}
                for src, cache in self.sources.items()
            }
            self.dealer_of = {src: sock for sock, src in rank.dealers.items()}
        self.own_index = {name: i for i, name in enumerate(self.names)}
        self.started = True

    def _peer(self, stage: int, who: int) -> RegisteredCache:
        if (stage, who) not in self._registered:
            self._registered[(stage, who)] = registered_cache(self.rank, stage, who)
        return self._registered[(stage, who)]

    def _table(self, stage: int, who: int) -> dict[str, list[int]]:
        if (stage, who) not in self._tables:
            self._tables[(stage, who)] = self.rank.workload.block_table(stage, who)[1]
        return self._tables[(stage, who)]

    def _plan(
        self, request_id: str, chunk: int, src: int, dst: int, *, as_sender: bool
    ) -> DescriptorPlan:
        """The spec's list for one (request, chunk, edge) [DESC-1..3]: the chunk is a piece
        of the edge's own tokens, as a push payload's is [CHUNK-1, PLAN-6]."""
        rank = self.rank
        request = rank.requests[request_id]
        book = rank.out_plan if as_sender else rank.in_plan
        assert book is not None
        plan = book.of(request)
        if as_sender:
            stage = rank.who.stage
            source, source_ids = self.own, rank.tables[request_id]
            target = self._peer(stage + 1, dst)
            target_ids = self._table(stage + 1, dst)[request_id]
        else:
            stage = rank.who.stage - 1
            source = self.sources[src]
            source_ids = self._table(stage, src)[request_id]
            target, target_ids = self.own, rank.tables[request_id]
        edge = plan.edge(src, dst)
        carried = Tokens.span(0, request.seq_len) if edge.tokens is None else edge.tokens
        part = edge_chunks(len(carried), rank.config.chunks)[chunk]
        tokens = _pick(carried, part)
        # A chunk's descriptors address each side's blocks up to its last slot [PAGED-3].
        share = share_positions(plan, edge, tokens)
        need_src = blocks_needed(share.source_slots, source.block_size)
        need_dst = blocks_needed(share.target_slots, target.block_size)
        return plan_descriptors(
            plan, edge, source, source_ids[:need_src], target, target_ids[:need_dst], tokens
        )

    # -- receiver: post reads, take answers --------------------------------------------------
    def post_reads(self) -> None:
        """Keep up to :data:`READ_WINDOW` reads outstanding on every source's connection."""
        if not self.started or self.rank.in_plan is None:
            return
        for src, queue in self.pending.items():
            if src in self.rank.dead_sources or src in self.rank.ended_sources:
                continue
            while queue and len(self.outstanding[src]) < READ_WINDOW:
                key, request_id, chunk = queue.popleft()
                state = self.rank.incoming[request_id]
                if state.done:
                    continue
                made = self._plan(request_id, chunk, src, self.rank.who.rank, as_sender=False)
                index = self.source_index[src]
                rows = torch.tensor(
                    [[index[a], b, self.own_index[c], d, n] for a, b, c, d, n in made.descriptors],
                    dtype=torch.int64,
                ).reshape(-1, 5)
                body = rows.numpy().astype("<i8").tobytes()
                seq = self.read_seq[src]
                self.read_seq[src] += 1
                head: dict[str, Any] = {"read": key, "seq": seq, "n": len(made.descriptors)}
                if self.rank.config.checksum:
                    head["crc"] = _crc([key.encode(), body])
                try:  # a DEALER whose source is gone would block: never wait for it
                    self.dealer_of[src].send_multipart(
                        [messages.dump(head), body], flags=zmq.NOBLOCK
                    )
                except zmq.Again:
                    self.read_seq[src] -= 1
                    queue.appendleft((key, request_id, chunk))
                    break
                self.outstanding[src][key] = (seq, made)
                self.rank.stats["reads_posted"] += 1

    def on_answer(self, src: int, frames: list[zmq.Frame], received_at: float) -> None:
        """An answer from ``src``: check it, write its ranges into the cache [DESC-1]."""
        rank = self.rank
        read = rank.admit_answer(src, frames)
        if read is None:
            return
        head, owner = read
        key = head["key"]
        request_id, _, _ = owner
        state = rank.incoming[request_id]
        _, made = self.outstanding[src].pop(key, (None, None))
        ranges = [f.buffer for f in frames[1:]]
        if not ranges_intact(head, ranges, required=rank.config.checksum):
            rank.book.observe("corrupt", key)
            rank._fail(state, f"the ranges of {key} from source rank {src} fail their CRC")
            return
        if state.done:
            rank.stats["late_ignored"] += 1
            return
        if (
            made is None
            or len(ranges) != len(made.descriptors)
            or any(len(r) != d.length for r, d in zip(ranges, made.descriptors, strict=False))
        ):
            rank._fail(state, f"the answer to read {key} from source rank {src} does not fit it")
            return
        if rank.device.type == "cpu":
            for d, data in zip(made.descriptors, ranges, strict=True):
                _write(self.buffers[d.dst_region][d.dst_offset : d.dst_offset + d.length], data)
        else:  # pragma: no cover - needs a GPU
            self._land_staged(made.descriptors, ranges)
        rank.stats["descriptors"] += len(made.descriptors)
        rank.stats["descriptor_bytes"] += made.share_bytes
        state.first_sent = min(state.first_sent, head["t"])
        state.edge_bytes[src] += made.share_bytes
        if not state.waiting:
            self._landed(state, received_at)

    def _land_staged(
        self, listed: tuple[Descriptor, ...], ranges: list[Any]
    ) -> None:  # pragma: no cover - needs a GPU
        """Land ranges in a device cache from a pinned staging slot, not from the pageable
        frames: one host copy into the slot, then device copies on the side stream that the
        compute stream waits for [sim.staging]."""
        rank = self.rank
        assert rank.staging is not None
        slot = rank.staging.acquire(sum(d.length for d in listed), wait=lambda: rank._pump(20))
        rank.copy_stream.wait_stream(torch.cuda.current_stream(rank.device))
        at = 0
        with torch.cuda.stream(rank.copy_stream):
            for d, data in zip(listed, ranges, strict=True):
                host = slot.view(at + d.length)[at:]
                host.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
                target = self.buffers[d.dst_region][d.dst_offset : d.dst_offset + d.length]
                target.copy_(host, non_blocking=True)
                at += d.length
            event = torch.cuda.Event()
            event.record(rank.copy_stream)
        torch.cuda.current_stream(rank.device).wait_event(event)
        slot.hold(event)

    def _landed(self, state: Incoming, received_at: float) -> None:
        """Every range of the request is in the cache: verify now, or once all have landed."""
        self.rank.stats["requests_pulled"] += 1
        self.rank.landed(state, received_at)

    # -- sender: answer reads ----------------------------------------------------------------
    def ready(self, request_id: str) -> None:
        """``request_id`` is in this rank's cache (filled, or received and verified): answer
        the reads that wait for it."""
        self.ready_requests.add(request_id)
        for dst, key, _seq, listed in self.waiting_reads.pop(request_id, []):
            self._answer(dst, key, listed)

    def on_read(self, frames: list[bytes]) -> None:
        """A read on the sender's socket: from a verified receiver, for one of its keys,
        asking exactly the spec's list; anything else is refused and counted."""
        rank = self.rank
        peer, head_frame, body = frames
        dst = next((d for d, p in rank.peers.items() if p == peer), None)
        if dst is None:
            rank.strangers["kv reads refused"] += 1
            return
        try:
            head = messages.load(head_frame, limit=messages.MAX_ENVELOPE)
        except messages.MessageError:
            rank.strangers["kv reads refused"] += 1
            return
        key, count, seq = head.get("read"), head.get("n"), head.get("seq")
        known = self.keys_of.get(key) if isinstance(key, str) else None
        if (
            known is None
            or not isinstance(key, str)  # known is found only for a str key
            or known[2] != dst
            or not isinstance(count, int)
            or not isinstance(seq, int)
            or len(body) != count * ROW
            or (rank.config.checksum and head.get("crc") != _crc([key.encode(), body]))
        ):
            rank.stats["reads_refused"] += 1
            return
        request_id, chunk, _ = known
        made = self._plan(request_id, chunk, rank.who.rank, dst, as_sender=True)
        target_names = list(made.target.regions())
        rows = torch.frombuffer(bytearray(body), dtype=torch.int64).reshape(-1, 5).tolist()
        try:
            listed = [Descriptor(self.names[a], b, target_names[c], d, n) for a, b, c, d, n in rows]
        except IndexError:
            rank.stats["reads_refused"] += 1
            return
        if not judge_descriptors(listed, made).ok:  # nothing beyond the share is ever read
            rank.stats["reads_refused"] += 1
            return
        if key in rank.skipped[dst]:
            return  # its request failed here; the end-of-stream says why
        if request_id not in self.ready_requests:
            self.waiting_reads[request_id].append((dst, key, seq, listed))
            return
        self._answer(dst, key, listed)

    def _answer(self, dst: int, key: str, listed: list[Descriptor]) -> None:
        """Send the ranges' bytes straight from cache memory, with the run's faults applied
        and booked as for a push payload [sim.faults]."""
        rank = self.rank
        rank.sent_keys[dst].append(key)
        self.answered.add(key)
        rank._maybe_die(sending=True)
        ranges, slot = self._ranges(listed)
        rank.put_ranges(dst, key, ranges, slot, self.algorithm)

    def _ranges(self, listed: list[Descriptor]) -> tuple[list[Any], Any]:
        """The bytes of each range, and the staging slot holding them: views of cache
        memory on the CPU (no slot); from a device cache, one copy into a slot of the
        rank's pinned staging ring [sim.staging] on its side stream, fenced by an event."""
        views = [self.buffers[d.src_region][d.src_offset : d.src_offset + d.length] for d in listed]
        if self.rank.device.type == "cpu":
            # array.data is memoryview(array), in a form numpy's stubs type before 3.12
            return [v.numpy().data for v in views], None
        return self._stage_ranges(views)  # pragma: no cover - needs a GPU

    def _stage_ranges(self, views: list[torch.Tensor]) -> tuple[list[Any], Any]:  # pragma: no cover
        rank = self.rank
        assert rank.staging is not None
        total = sum(v.numel() for v in views)
        slot = rank.staging.acquire(total, wait=lambda: rank._pump(20))
        rank.copy_stream.wait_stream(torch.cuda.current_stream(rank.device))
        out, at = [], 0
        with torch.cuda.stream(rank.copy_stream):
            for view in views:
                slot.view(at + view.numel())[at:].copy_(view, non_blocking=True)
                at += view.numel()
            event = torch.cuda.Event()
            event.record(rank.copy_stream)
        event.synchronize()
        slot.hold(event)
        at = 0
        for view in views:
            out.append(slot.view(at + view.numel())[at:].numpy().data)
            at += view.numel()
        return out, slot

    def all_served(self) -> bool:
        """Whether every key of every receiver was answered (or skipped): the streams end."""
        rank = self.rank
        return all(
            key in self.answered or key in rank.skipped[dst]
            for key, (_, _, dst) in self.keys_of.items()
        )
