"""The staging ring [sim.cache.staging]: slots reused in order, wrapping around, never while in
flight; back-pressure when every slot is; growth; pinning only where CUDA is."""

from __future__ import annotations

import pytest
import torch

from sim.cache.staging import RingBusy, StagingRing, pinning_available


class Fence:
    """A stand-in for a CUDA event or a zmq tracker: done when told."""

    def __init__(self, api: str = "query") -> None:
        self.passed = False
        self.api = api

    def query(self) -> bool:
        return self.passed


class Tracker:
    def __init__(self) -> None:
        self.done = False


def test_slots_are_handed_out_in_order_and_wrap_around() -> None:
    ring = StagingRing(3, 64, pin=False)
    got = [ring.acquire(16).index for _ in range(7)]
    assert got == [0, 1, 2, 0, 1, 2, 0]
    assert ring.allocations == 3, "no slot is allocated again for a message that fits"
    first = ring.slots[0].buffer.data_ptr()
    ring.acquire(16)
    ring.acquire(16)
    assert ring.acquire(64).buffer.data_ptr() == first, "the same memory, reused"


def test_a_slot_in_flight_is_not_reused_until_every_fence_passes() -> None:
    ring = StagingRing(2, 32, pin=False)
    a = ring.acquire(8)
    event, tracker = Fence(), Tracker()
    a.hold(event, tracker)
    ring.acquire(8)  # slot 1: free
    with pytest.raises(RingBusy, match=r"all 2 staging slots are in flight \(slot 0 is next\)"):
        ring.acquire(8)
    event.passed = True
    with pytest.raises(RingBusy):
        ring.acquire(8)  # the tracker still holds it
    tracker.done = True
    assert ring.acquire(8) is a and ring.in_flight == 0


def test_back_pressure_waits_and_serves_meanwhile() -> None:
    """With ``wait``, acquire polls until the slot's fences pass, calling wait between
    polls (a rank pumps its sockets there); a fence that never passes times out."""
    ring = StagingRing(1, 8, pin=False)
    slot = ring.acquire(8)
    fence = Fence()
    slot.hold(fence)
    calls = []

    def wait() -> None:
        calls.append(1)
        if len(calls) == 3:
            fence.passed = True

    assert ring.acquire(8, wait=wait) is slot
    assert len(calls) == 3 and ring.waits == 3
    slot.hold(Fence())
    with pytest.raises(RingBusy, match=r"stayed in flight for 0.05 s"):
        ring.acquire(8, wait=lambda: None, timeout=0.05)


def test_a_slot_grows_for_a_larger_message_once() -> None:
    ring = StagingRing(2, 16, pin=False)
    big = ring.acquire(100)
    assert big.buffer.numel() == 100 and big.view(40).numel() == 40
    ring.acquire(8)
    assert ring.acquire(100) is big and ring.allocations == 3


def test_pinning_only_with_cuda_and_bad_arguments_are_named() -> None:
    ring = StagingRing(1, 8)
    assert ring.pinned is pinning_available()
    assert ring.slots[0].buffer.is_pinned() is ring.pinned
    if not pinning_available():
        with pytest.raises(ValueError, match="pinned staging needs a CUDA device"):
            StagingRing(1, 8, pin=True)
    with pytest.raises(ValueError, match="at least one slot, got 0"):
        StagingRing(0, 8)
    with pytest.raises(TypeError, match=r"query\(\) .* or done .*; got object"):
        slot = StagingRing(1, 8, pin=False).acquire(1)
        slot.hold(object())
        _ = slot.in_flight


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: pinned memory and events need one"
)
def test_cuda_events_fence_pinned_slots() -> None:
    """On a GPU: slots are page-locked, and a copy's event keeps its slot in flight."""
    ring = StagingRing(2, 1 << 20)
    assert ring.pinned and ring.slots[0].buffer.is_pinned()
    source = torch.arange(1 << 18, dtype=torch.int32, device="cuda")
    slot = ring.acquire(source.nbytes)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        slot.view(source.nbytes).view(torch.int32).copy_(source, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    slot.hold(event)
    event.synchronize()
    assert not slot.in_flight
    assert torch.equal(slot.view(source.nbytes).view(torch.int32), source.cpu())
