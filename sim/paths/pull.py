"""``--transfer pull``: each receiver reads its descriptors from the senders' caches.

A pull connector never sees tensors. In a pull run every rank registers its paged
cache's memory as regions (:func:`kvspec.memory.descriptors.region_buffers`); for each
(request, chunk, source) a receiver computes the spec's descriptor list [DESC-1..3]
and sends it to the source as a *read*: ``[header, descriptors]``, the header a JSON
object ``{"read": key, "seq": n, "n": count}`` (with a CRC-32 of both frames when
checksums are on) and the descriptors ``count`` rows of five little-endian int64
(src region index, src offset, dst region index, dst offset, length). The source
checks the read came over a verified connection (:mod:`sim.net.auth`), names one of that
receiver's keys, and asks for exactly the spec's list for it — nothing more of its
cache is ever read — then answers ``[header, range 0, range 1, ...]``: each range the
raw bytes straight from cache memory (zero-copy on the CPU), the header an envelope
(:func:`sim.net.messages.read_envelope`: ``key``, ``seq``, ``t``) with ``ranges_crc`` and
``ranges_alg`` when checksums are on: the CRC of the ranges by the fastest algorithm
here (:func:`kvspec.transport.checksums.fastest`: CRC-32C [WIRE-7] where compiled code
computes it, else CRC-32 [WIRE-6]), checked by :func:`ranges_intact` as a write's are.
The receiver writes each range straight into its own cache and, once every source of
the request has answered, verifies every element against the oracle, as a push run does.

Every request is read by its own plan (:class:`sim.run.workload.PlanBook`): with token
shards or attention-DP groups an edge carries a token set [PLAN-6, DP-1], cut into
chunks of its own tokens as a push payload is, and each token is read from and written
to its position among each rank's own tokens (:func:`kvspec.memory.descriptors.share_positions`).

Faults strike answers exactly as they strike push payloads, and are booked the same
way (:mod:`sim.books.accounting`); a source ends each receiver's stream once it has
answered or skipped every key of that receiver. Reads are bounded
(:func:`sim.net.sizing.max_read_message`) and so are answers' frames.
"""

from __future__ import annotations

import warnings
from collections import defaultdict, deque
from typing import Any

import numpy as np
import torch
import zmq

from kvspec.memory.descriptors import (
    Descriptor,
    DescriptorPlan,
    judge_descriptors,
    plan_descriptors,
)
from kvspec.transport.checksums import checksum_of
from sim.net import messages
from sim.paths.datapath import Checked, Incoming, PathPorts
from sim.paths.regions import RegionPath, ranges_intact, read_head

__all__ = ["READ_WINDOW", "PullAgent", "ranges_intact"]

READ_WINDOW = 8
"""Reads a receiver keeps outstanding per source: memory and sockets stay bounded."""
ROW = 5 * 8
"""Bytes of one descriptor row on the wire."""


def _crc(frames: list[Any]) -> int:
    """CRC-32 of a read's key and descriptor rows, as if joined: a few hundred bytes, where
    the algorithm's speed does not matter [WIRE-6]."""
    return checksum_of("crc32", frames)


def _write(target: torch.Tensor, data: memoryview) -> None:
    """Write received bytes straight into cache memory (a read-only frame is never copied
    first on the CPU)."""
    if target.device.type == "cpu":
        target.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the frame is read-only; it is only read
        target.copy_(torch.frombuffer(data, dtype=torch.uint8))


class PullAgent(RegionPath):
    """The pull data path of one rank (:class:`sim.paths.datapath.DataPath`): it posts reads
    (as a receiver) and answers them (as a sender), given its rank's
    :class:`sim.paths.datapath.PathPorts`."""

    def __init__(self, ep: PathPorts) -> None:
        super().__init__(ep)
        # receiver side
        self.pending: dict[int, deque[tuple[str, str, int]]] = defaultdict(deque)
        self.outstanding: dict[int, dict[str, tuple[int, DescriptorPlan]]] = defaultdict(dict)
        self.read_seq: dict[int, int] = defaultdict(int)
        # sender side
        self.waiting_reads: dict[str, list[tuple[int, str, int, list[Descriptor]]]] = defaultdict(
            list
        )

    # -- set-up ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before the ready barrier: what a connector does at registration (nothing more
        for a pull: its lists are computed as its reads are posted)."""

    def start(self) -> None:
        """Register this rank's regions and lay out every read it will post."""
        self.register()
        for key, (request_id, chunk, src) in self.ep.inbound.owners():
            self.pending[src].append((key, request_id, chunk))

    def _plan(
        self, request_id: str, chunk: int, src: int, dst: int, *, as_sender: bool
    ) -> DescriptorPlan:
        """The spec's list for one (request, chunk, edge) [DESC-1..3]."""
        return plan_descriptors(*self.share(request_id, chunk, src, dst, as_sender=as_sender))

    # -- receiver: post reads, take answers --------------------------------------------------
    def progress(self) -> None:
        """Keep up to :data:`READ_WINDOW` reads outstanding on every source's connection."""
        ep = self.ep
        if not self.started or ep.view.in_plan is None:
            return
        for src, queue in self.pending.items():
            if ep.inbound.is_dead(src) or ep.inbound.has_ended(src):
                continue
            while queue and len(self.outstanding[src]) < READ_WINDOW:
                key, request_id, chunk = queue.popleft()
                state = ep.inbound.awaited(request_id)
                if state.done:
                    continue
                made = self._plan(request_id, chunk, src, ep.view.who.rank, as_sender=False)
                index = self.source_index[src]
                rows = torch.tensor(
                    [[index[a], b, self.own_index[c], d, n] for a, b, c, d, n in made.descriptors],
                    dtype=torch.int64,
                ).reshape(-1, 5)
                body = rows.numpy().astype("<i8").tobytes()
                seq = self.read_seq[src]
                self.read_seq[src] += 1
                head: dict[str, Any] = {"read": key, "seq": seq, "n": len(made.descriptors)}
                if ep.view.config.checksum:
                    head["crc"] = _crc([key.encode(), body])
                try:  # a DEALER whose source is gone would block: never wait for it
                    ep.inbound.dealer_of(src).send_multipart(
                        [messages.dump(head), body], flags=zmq.NOBLOCK
                    )
                except zmq.Again:
                    self.read_seq[src] -= 1
                    queue.appendleft((key, request_id, chunk))
                    break
                self.outstanding[src][key] = (seq, made)
                ep.view.stats["reads_posted"] += 1

    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """The read it answers, no longer outstanding, with the ranges' CRC."""
        _, made = self.outstanding[src].pop(key, (None, None))
        checked = super().check(state, src, key, head, frames)
        if checked.refusal is None:
            checked.data = (made, checked.data)
        return checked

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """Write the answer's ranges into the cache where its read said [DESC-1]."""
        ep = self.ep
        made, ranges = data
        if (
            made is None
            or len(ranges) != len(made.descriptors)
            or any(len(r) != d.length for r, d in zip(ranges, made.descriptors, strict=False))
        ):
            ep.inbound.fail(
                state, f"the answer to read {key} from source rank {src} does not fit it"
            )
            return None
        if ep.view.memory.device.type == "cpu":
            for d, data in zip(made.descriptors, ranges, strict=True):
                _write(self.buffers[d.dst_region][d.dst_offset : d.dst_offset + d.length], data)
        else:  # pragma: no cover - needs a GPU
            self._land_staged(made.descriptors, ranges)
        ep.view.stats["descriptors"] += len(made.descriptors)
        ep.view.stats["descriptor_bytes"] += made.share_bytes
        return int(made.share_bytes)

    def _land_staged(
        self, listed: tuple[Descriptor, ...], ranges: list[Any]
    ) -> None:  # pragma: no cover - needs a GPU
        """Land ranges in a device cache from a pinned staging slot, not from the pageable
        frames: one host copy into the slot, then device copies on the side stream that the
        compute stream waits for [sim.cache.staging]."""
        memory = self.ep.view.memory
        slot = memory.staging_slot(sum(d.length for d in listed))
        memory.copy_stream.wait_stream(torch.cuda.current_stream(memory.device))
        at = 0
        with torch.cuda.stream(memory.copy_stream):
            for d, data in zip(listed, ranges, strict=True):
                host = slot.view(at + d.length)[at:]
                host.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
                target = self.buffers[d.dst_region][d.dst_offset : d.dst_offset + d.length]
                target.copy_(host, non_blocking=True)
                at += d.length
            event = torch.cuda.Event()
            event.record(memory.copy_stream)
        torch.cuda.current_stream(memory.device).wait_event(event)
        slot.hold(event)

    # -- sender: answer reads ----------------------------------------------------------------
    def post(self, request_id: str) -> None:
        """``request_id`` is in this rank's cache (filled, or received and verified): answer
        the reads that wait for it."""
        self.ready_requests.add(request_id)
        for dst, key, _seq, listed in self.waiting_reads.pop(request_id, []):
            self._answer(dst, key, listed)

    def on_read(self, frames: list[bytes]) -> None:
        """A read on the sender's socket: from a verified receiver, for one of its keys,
        asking exactly the spec's list; anything else is refused and counted."""
        ep = self.ep
        read = read_head(ep, frames)
        if read is None:
            return
        (dst, head), body = read, frames[2]
        key, count, seq = head.get("read"), head.get("n"), head.get("seq")
        known = self.keys_of.get(key) if isinstance(key, str) else None
        if (
            known is None
            or not isinstance(key, str)  # known is found only for a str key
            or known[2] != dst
            or not isinstance(count, int)
            or not isinstance(seq, int)
            or len(body) != count * ROW
            or (ep.view.config.checksum and head.get("crc") != _crc([key.encode(), body]))
        ):
            ep.view.stats["reads_refused"] += 1
            return
        request_id, chunk, _ = known
        made = self._plan(request_id, chunk, ep.view.who.rank, dst, as_sender=True)
        target_names = list(made.target.regions())
        rows = torch.frombuffer(bytearray(body), dtype=torch.int64).reshape(-1, 5).tolist()
        try:
            listed = [Descriptor(self.names[a], b, target_names[c], d, n) for a, b, c, d, n in rows]
        except IndexError:
            ep.view.stats["reads_refused"] += 1
            return
        if not judge_descriptors(listed, made).ok:  # nothing beyond the share is ever read
            ep.view.stats["reads_refused"] += 1
            return
        if ep.out.is_skipped(dst, key):
            return  # its request failed here; the end-of-stream says why
        if request_id not in self.ready_requests:
            self.waiting_reads[request_id].append((dst, key, seq, listed))
            return
        self._answer(dst, key, listed)

    def _answer(self, dst: int, key: str, listed: list[Descriptor]) -> None:
        """Send the ranges' bytes straight from cache memory, with the run's faults applied
        and booked as for a push payload [sim.run.faults]."""
        ep = self.ep
        ep.out.mark_sent(dst, key)
        self.answered.add(key)
        ep.view.strike(True)
        ranges, slot = self._ranges(listed)
        ep.out.put_ranges(dst, key, ranges, slot, self.algorithm)

    def _ranges(self, listed: list[Descriptor]) -> tuple[list[Any], Any]:
        """The bytes of each range, and the staging slot holding them: views of cache
        memory on the CPU (no slot); from a device cache, one copy into a slot of the
        rank's pinned staging ring [sim.cache.staging] on its side stream, fenced by an event."""
        views = [self.buffers[d.src_region][d.src_offset : d.src_offset + d.length] for d in listed]
        if self.ep.view.memory.device.type == "cpu":
            # array.data is memoryview(array), in a form numpy's stubs type before 3.12
            return [v.numpy().data for v in views], None
        return self._stage_ranges(views)  # pragma: no cover - needs a GPU

    def _stage_ranges(self, views: list[torch.Tensor]) -> tuple[list[Any], Any]:  # pragma: no cover
        memory = self.ep.view.memory
        total = sum(v.numel() for v in views)
        slot = memory.staging_slot(total)
        memory.copy_stream.wait_stream(torch.cuda.current_stream(memory.device))
        out, at = [], 0
        with torch.cuda.stream(memory.copy_stream):
            for view in views:
                slot.view(at + view.numel())[at:].copy_(view, non_blocking=True)
                at += view.numel()
            event = torch.cuda.Event()
            event.record(memory.copy_stream)
        event.synchronize()
        slot.hold(event)
        at = 0
        for view in views:
            out.append(slot.view(at + view.numel())[at:].numpy().data)
            at += view.numel()
        return out, slot
