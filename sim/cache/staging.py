"""A ring of reusable host staging buffers, page-locked where CUDA is available.

A rank on a GPU moves every byte between device memory and the socket through host
memory. Allocating a pinned buffer per tensor (``torch.empty(..., pin_memory=True)``)
costs a ``cudaHostAlloc`` each time, slower than the copy it serves; copying from
pageable memory makes the driver stage through its own pinned bounce buffer, one more
copy. A :class:`StagingRing` allocates ``slots`` buffers once and hands them out in
order, wrapping around. A slot handed out is *in flight* until every fence it was
given is done — a ``torch.cuda.Event`` recorded after the copy (``query()``), a pyzmq
``MessageTracker`` of the frames that reference it (``done``), or anything with either —
and is only reused after that. When the next slot is still in flight the ring applies
back-pressure: :meth:`StagingRing.acquire` waits (calling ``wait`` between polls, so a
rank keeps serving its sockets) or, without ``wait``, raises :class:`RingBusy`.

Without CUDA, pinning is unavailable and pointless: the ring holds plain memory and
works the same, which is how its logic is tested on a CPU machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class RingBusy(RuntimeError):
    """Every slot of the ring is in flight and the caller asked not to wait."""


def _done(fence: Any) -> bool:
    """Whether one fence has passed: a CUDA event's ``query()``, a pyzmq tracker's ``done``."""
    if hasattr(fence, "query"):
        return bool(fence.query())
    if hasattr(fence, "done"):
        return bool(fence.done)
    raise TypeError(
        f"a fence has query() (torch.cuda.Event) or done (zmq.MessageTracker); got "
        f"{type(fence).__name__}"
    )


def pinning_available() -> bool:
    """Whether page-locked host memory can be had: only with a CUDA device."""
    return torch.cuda.is_available()


@dataclass
class Slot:
    """One staging buffer: ``buffer`` (a flat uint8 host tensor) and the fences that keep
    it in flight."""

    index: int
    buffer: torch.Tensor
    fences: list[Any] = field(default_factory=list)
    uses: int = 0

    def hold(self, *fences: Any) -> None:
        """Keep this slot in flight until every one of ``fences`` is done."""
        self.fences.extend(fences)

    @property
    def in_flight(self) -> bool:
        self.fences = [f for f in self.fences if not _done(f)]
        return bool(self.fences)

    def view(self, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of the buffer."""
        return self.buffer[:nbytes]


class StagingRing:
    """``slots`` reusable host buffers of at least ``slot_bytes`` each, handed out in
    order; pinned when ``pin`` (default: when CUDA is available)."""

    def __init__(self, slots: int, slot_bytes: int, *, pin: bool | None = None) -> None:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"a staging ring needs at least one slot, got {slots!r}")
        if not isinstance(slot_bytes, int) or slot_bytes < 0:
            raise ValueError(f"slot_bytes must be an integer >= 0, got {slot_bytes!r}")
        self.pinned = pinning_available() if pin is None else pin
        if self.pinned and not pinning_available():
            raise ValueError("pinned staging needs a CUDA device; this machine has none")
        self.slots = [Slot(i, self._alloc(slot_bytes)) for i in range(slots)]
        self.next = 0
        self.allocations = slots
        self.waits = 0

    def _alloc(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)

    def reserve(self, nbytes: int) -> None:
        """Grow every slot to at least ``nbytes`` now and touch its pages, off the data
        path — as a connector registers (and so pins and faults in) its buffers at
        start-up. A slot grown on the data path instead is fresh memory whose first
        write page-faults per 4 KiB page inside the transfer."""
        for slot in self.slots:
            if slot.buffer.numel() < nbytes:
                slot.buffer = self._alloc(nbytes)
                self.allocations += 1
            slot.buffer[:nbytes].zero_()

    def acquire(
        self,
        nbytes: int,
        *,
        wait: Callable[[], None] | None = None,
        timeout: float = 60.0,
    ) -> Slot:
        """The next slot in ring order, with at least ``nbytes`` (it grows once if
        smaller). While it is in flight: call ``wait`` and poll again (back-pressure),
        up to ``timeout`` seconds; without ``wait``, raise :class:`RingBusy` at once."""
        slot = self.slots[self.next]
        deadline = time.monotonic() + timeout
        while slot.in_flight:
            if wait is None:
                raise RingBusy(
                    f"all {len(self.slots)} staging slots are in flight (slot {slot.index} is "
                    "next); wait for a transfer to finish"
                )
            if time.monotonic() > deadline:
                raise RingBusy(
                    f"staging slot {slot.index} stayed in flight for {timeout:g} s: a copy or "
                    "a send never completed"
                )
            self.waits += 1
            wait()
        if slot.buffer.numel() < nbytes:
            slot.buffer = self._alloc(nbytes)  # grows to the largest message seen
            self.allocations += 1
        slot.uses += 1
        self.next = (self.next + 1) % len(self.slots)
        return slot

    @property
    def in_flight(self) -> int:
        """How many slots are in flight now."""
        return sum(s.in_flight for s in self.slots)
