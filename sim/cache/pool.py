"""A receiver's block pool, run by the lifecycle rules and written down as a trace.

Blocks are allocated to a request when its first shard arrives, from a LIFO free list
(the most recently freed block is reused first, as an engine's allocator does), and go
back after the request's KV has been handed on. One transfer handle is posted per shard
(key), in its source's current epoch. Every step is recorded as a
:mod:`kvspec.lifecycle` event; whether a block may go back is asked of kvspec's
reference machine [LIFE-3], never decided here.

``unsafe`` breaks the quiescence rule on purpose: blocks of aborted or restarted
transfers go back at once, and a write through a closed handle still lands at the
blocks the handle was posted with — as an RDMA write to a stale address would — so the
oracle can show the corruption the rules prevent. The trace checker then names the
rule that was broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec.lifecycle.machine import Lifecycle, LifecycleError, LifecycleRefusal
from kvspec.lifecycle.trace import TraceVerdict, check_trace

MAX_TRACE = 200_000
"""Events a rank keeps; a longer run checks the first ones and says so."""


@dataclass
class Handle:
    """What the pool knows of one posted shard: its request, blocks, source, epoch."""

    request: str
    blocks: tuple[int, ...]
    source: int
    epoch: int
    state: str = "in_flight"


@dataclass
class Clobber:
    """A write that landed in blocks its handle no longer owned (``unsafe`` only)."""

    key: str
    of_request: str
    blocks: tuple[int, ...]
    into: dict[int, str] = field(default_factory=dict)


class BlockPool:
    """Allocation, handles, release and free for one receiving rank [LIFE-1..7]."""

    def __init__(self, order: list[int], *, unsafe: bool = False) -> None:
        self.num_blocks = len(order)
        self.free: list[int] = list(reversed(order))  # pop() takes order[0] first
        self.unsafe = unsafe
        self.machine = Lifecycle(self.num_blocks)  # the rules, asked before every step
        self.trace: list[dict[str, Any]] = []
        self.truncated = False
        self.tables: dict[str, list[int]] = {}
        self.owner: dict[int, str] = {}
        self.handles: dict[str, Handle] = {}
        self.epochs: dict[int, int] = {}
        self.clobbers: list[Clobber] = []
        self.released: dict[str, list[int]] = {}  # request -> blocks waiting to be freed
        self.freed_once: set[int] = set()
        self.reused = 0  # allocations of a block that an earlier request had used

    # -- the record --------------------------------------------------------------------
    def _record(self, event: dict[str, Any], *, force: bool = False) -> bool:
        """Apply ``event`` to the rules' machine and record it; if the rules refuse it,
        record the refusal and say no — unless ``force`` or ``unsafe``, which do it anyway
        (the trace checker names the broken rule; after it, the machine's state is no
        guide, so an unsafe pool follows its own books)."""
        try:
            self.machine.apply(event)
        except (LifecycleRefusal, LifecycleError):
            if not (force or self.unsafe):
                self._keep({"ev": "refused", "event": event})
                return False
        self._keep(event)
        return True

    def _keep(self, event: dict[str, Any]) -> None:
        if len(self.trace) < MAX_TRACE:
            self.trace.append(event)
        else:
            self.truncated = True

    # -- requests ------------------------------------------------------------------------
    def admit(self, request: str, blocks_needed: int, keys: Mapping[str, int]) -> list[int]:
        """Allocate ``blocks_needed`` blocks and post one handle per key (key -> source)."""
        if len(self.free) < blocks_needed:
            raise RuntimeError(
                f"the block pool has {len(self.free)} free blocks; request {request} needs "
                f"{blocks_needed} (blocks are still held by unquiesced transfers or poisoned)"
            )
        blocks = [self.free.pop() for _ in range(blocks_needed)]
        self.reused += sum(b in self.freed_once for b in blocks)
        self._record({"ev": "alloc", "request": request, "blocks": blocks})
        self.tables[request] = blocks
        for b in blocks:
            self.owner[b] = request
        for key, source in sorted(keys.items()):
            epoch = self.epochs.setdefault(source, 0)
            self.handles[key] = Handle(request, tuple(blocks), source, epoch)
            self._record(
                {
                    "ev": "post",
                    "handle": key,
                    "request": request,
                    "peer": f"source {source}",
                    "epoch": epoch,
                    "blocks": blocks,
                }
            )
        return blocks

    def write(self, key: str, epoch: int) -> str:
        """Data for ``key`` arrived: ``"landed"`` (its handle is in flight, in its
        source's current epoch), ``"refused"`` (the rules forbid it) or, with ``unsafe``,
        ``"stale"``: a closed handle's write that lands anyway at the blocks it was posted
        with (see :attr:`clobbers`)."""
        handle = self.handles[key]
        event = {"ev": "write", "handle": key, "epoch": epoch, "blocks": list(handle.blocks)}
        stale = handle.state != "in_flight" or epoch != self.epochs.get(handle.source, epoch)
        if stale and self.unsafe:
            self._record(event, force=True)
            into = {b: self.owner.get(b) for b in handle.blocks}
            reused = {b: o for b, o in into.items() if o is not None and o != handle.request}
            if reused:  # its own blocks would get the same bytes again: harmless
                self.clobbers.append(Clobber(key, handle.request, handle.blocks, reused))
            return "stale"
        return "landed" if self._record(event) else "refused"

    def complete(self, key: str) -> None:
        handle = self.handles[key]
        if handle.state == "in_flight" and self._record({"ev": "complete", "handle": key}):
            handle.state = "completed"

    def fail(self, key: str, *, deadline: bool = False) -> None:
        handle = self.handles.get(key)
        if handle is None or handle.state != "in_flight":
            return
        if self._record({"ev": "deadline" if deadline else "fail", "handle": key}):
            handle.state = "failed"

    def abort(self, request: str) -> list[str]:
        """Abort ``request``: its in-flight handles are aborted; returns them (their
        senders must acknowledge before the blocks can go back) [LIFE-4]."""
        if request not in self.tables:
            return []
        aborted = [
            k for k, h in self.handles.items() if h.request == request and h.state == "in_flight"
        ]
        if self._record({"ev": "abort", "request": request}):
            for key in aborted:
                self.handles[key].state = "aborted"
        return aborted

    def quiesce(self, key: str) -> None:
        handle = self.handles.get(key)
        if handle is not None and handle.state in ("failed", "aborted"):
            if self._record({"ev": "quiesce", "handle": key}):
                handle.state = "quiesced"
            self.reclaim()

    def deliver(self, request: str) -> None:
        self._record({"ev": "deliver", "request": request})

    def release(self, request: str) -> None:
        """Hand back ``request``'s blocks; they return to the free list once every handle
        that could write them has quiesced [LIFE-3] (at once, when unsafe)."""
        if request not in self.tables or request in self.released:
            return
        if not self._record({"ev": "release", "request": request}):
            return
        self.released[request] = self.tables[request]
        self.reclaim()

    def reclaim(self) -> None:
        """Free every released block the rules let go (all of them, when unsafe)."""
        for request, blocks in list(self.released.items()):
            ready = [b for b in blocks if self.unsafe or self.machine.can_free(b)]
            if not ready:
                continue
            if self._record({"ev": "free", "blocks": ready}, force=self.unsafe):
                for b in ready:
                    self.owner.pop(b, None)
                    self.free.append(b)
                    self.freed_once.add(b)
                remaining = [b for b in blocks if b not in ready]
                if remaining:
                    self.released[request] = remaining
                else:
                    del self.released[request]

    def restart(self, source: int, epoch: int) -> list[str]:
        """Source ``source`` came back in ``epoch``: its handles of older epochs fail
        (they are not quiesced by the restart [LIFE-6]); returns them."""
        if not self._record({"ev": "peer_up", "peer": f"source {source}", "epoch": epoch}):
            return []
        self.epochs[source] = epoch
        failed = [
            k
            for k, h in self.handles.items()
            if h.source == source and h.epoch < epoch and h.state == "in_flight"
        ]
        for key in failed:
            self.fail(key)
        if self.unsafe:  # the restart taken as proof that the old process stopped
            for h in self.handles.values():
                if h.source == source and h.epoch < epoch and h.state in ("failed", "aborted"):
                    h.state = "quiesced"
        return failed

    def poison_unquiesced(self) -> int:
        """At the end: a transfer that never quiesced leaves its blocks poisoned [LIFE-5]."""
        for key, handle in self.handles.items():
            if handle.state == "in_flight":
                self.fail(key, deadline=True)
        doomed = sorted(
            {b for blocks in self.released.values() for b in blocks if not self.machine.can_free(b)}
        )
        if doomed:
            self._record({"ev": "poison", "blocks": doomed})
        return len(doomed)

    def verdict(self) -> TraceVerdict:
        return check_trace(self.trace, num_blocks=self.num_blocks)
