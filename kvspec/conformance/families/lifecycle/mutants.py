"""Lifecycle mutants [LIFE-1..7]: the 2026 wave of late-write and reuse bugs, one each.

Each is the reference state machine with one rule written the way the field wrote it
before the fix: a cancelled status taken for quiescence, a restarted peer taken for
proof that the old one stopped, blocks handed back at abort time, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.lifecycle.machine import QUIESCENT, Lifecycle


class _MachineAdapter(ReferenceAdapter):
    """A reference adapter whose lifecycle is its class's ``machine``."""

    machine: ClassVar[type[Lifecycle]]

    def lifecycle(self, num_blocks: int) -> Lifecycle:
        return self.machine(num_blocks)


class _RepostReplaces(Lifecycle):
    def _on_post(self, event: Mapping[str, Any]) -> None:
        self.handles.pop(event.get("handle"), None)  # type: ignore[arg-type]  # None: no such key
        super()._on_post(event)


@mutant("LIFE-1.1")
class RepostReplacesTheHandle(_MachineAdapter):
    """Posting a handle name again replaces the old handle instead of being refused."""

    machine = _RepostReplaces


class _EndsAgain(Lifecycle):
    def _end(self, event: Mapping[str, Any], to: str) -> None:
        _name, handle = self._handle(event)
        if handle.state == "completed" and to == "completed":
            return  # a second completion notification is harmless, surely
        super()._end(event, to)


@mutant("LIFE-1.2")
class SecondCompletionIgnored(_MachineAdapter):
    """A second completion of a completed handle is swallowed instead of refused."""

    machine = _EndsAgain


class _QuiesceAnything(Lifecycle):
    def _on_quiesce(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        if handle.state == "in_flight":
            handle.state = "quiesced"  # cancel-and-forget: the transfer is 'done'
            return
        super()._on_quiesce(event)


@mutant("LIFE-1.3")
class QuiescesAnInFlightHandle(_MachineAdapter):
    """Quiescing an in-flight handle is accepted, as if cancelling it stopped its writes."""

    machine = _QuiesceAnything


class _UnknownIgnored(Lifecycle):
    def apply(self, event: Mapping[str, Any]) -> None:
        if (
            isinstance(event, Mapping)
            and event.get("ev") != "post"
            and "handle" in event
            and event.get("handle") not in self.handles
        ):
            return  # a notification for a transfer we do not know: drop it quietly
        super().apply(event)


@mutant("LIFE-1.4")
class UnknownHandlesAreIgnored(_MachineAdapter):
    """Notifications for handles it never posted are accepted silently."""

    machine = _UnknownIgnored


class _DriftingHolding(Lifecycle):
    def _end(self, event: Mapping[str, Any], to: str) -> None:
        super()._end(event, to)
        if to == "completed":
            handle = self.handles[event["handle"]]
            for b in handle.blocks:
                if self.blocks[b] == "receiving":
                    self.blocks[b] = "holding"  # ignores the request's other handles


@mutant("LIFE-2.1")
class HoldingBeforeEveryHandleCompletes(_MachineAdapter):
    """A block counts as holding when one of its handles completes, though another is still
    writing it."""

    machine = _DriftingHolding


class _AllocReleased(Lifecycle):
    def _on_alloc(self, event: Mapping[str, Any]) -> None:
        for b in event.get("blocks", []):
            if isinstance(b, int) and 0 <= b < self.num_blocks and self.blocks[b] == "released":
                self.blocks[b], self.owner[b] = "free", None  # released means reusable
        super()._on_alloc(event)


@mutant("LIFE-2.2")
class AllocatesReleasedBlocks(_MachineAdapter):
    """Released blocks are handed out again before they were freed."""

    machine = _AllocReleased


class _AllocReopens(Lifecycle):
    def _on_alloc(self, event: Mapping[str, Any]) -> None:
        request = self.requests.get(event.get("request"))  # type: ignore[arg-type]  # None: no such key
        if request is not None and request.state != "open":
            request.state = "open"  # a retried request id: allocate for it again
        super()._on_alloc(event)


@mutant("LIFE-2.2")
class AllocReopensAClosedRequest(_MachineAdapter):
    """Allocating for a request that was delivered or aborted reopens it, as a retry that
    reuses the request id would, instead of refusing (the clause: alloc is for an open
    request)."""

    machine = _AllocReopens


class _PostForeign(Lifecycle):
    def _on_post(self, event: Mapping[str, Any]) -> None:
        name = event.get("request")
        for b in event.get("blocks", []):
            if isinstance(b, int) and 0 <= b < self.num_blocks and self.blocks[b] == "allocated":
                self.owner[b] = name  # whoever posts owns it
        super()._on_post(event)


@mutant("LIFE-2.3")
class PostsIntoAnotherRequestsBlocks(_MachineAdapter):
    """A handle may be posted into blocks allocated to another request."""

    machine = _PostForeign


class _WriteAnywhere(Lifecycle):
    def _on_write(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        narrowed = [b for b in event.get("blocks", []) if b in handle.blocks]
        super()._on_write({**event, "blocks": narrowed})


@mutant("LIFE-2.4")
class WritesOutsideTheHandle(_MachineAdapter):
    """A write is checked only for the blocks the handle has; the rest land unchecked."""

    machine = _WriteAnywhere


class _FreePoisoned(Lifecycle):
    def _on_free(self, event: Mapping[str, Any]) -> None:
        for b in event.get("blocks", []):
            if isinstance(b, int) and 0 <= b < self.num_blocks and self.blocks[b] == "poisoned":
                self.blocks[b] = "released"  # the pool takes everything back
        super()._on_free(event)


@mutant("LIFE-2.5")
class FreesPoisonedBlocks(_MachineAdapter):
    """Poisoned blocks return to the free pool when freed."""

    machine = _FreePoisoned


class _ReleaseOpen(Lifecycle):
    def _on_release(self, event: Mapping[str, Any]) -> None:
        request = self.requests.get(event.get("request"))  # type: ignore[arg-type]  # None: no such key
        if request is not None and request.state == "open":
            request.state = "failed"  # releasing an open request just drops it
        super()._on_release(event)


@mutant("LIFE-2.6")
class ReleasesAnOpenRequest(_MachineAdapter):
    """Releasing a request that is still open is accepted."""

    machine = _ReleaseOpen


class _AbortFrees(Lifecycle):
    def writers(self, block: int) -> list[str]:
        return [h for h in super().writers(block) if self.handles[h].state != "aborted"]


@mutant("LIFE-3.1")
class FreesAtAbort(_MachineAdapter):
    """Aborted handles are taken to have stopped: their blocks go back at abort time
    (the late-write corruption of vLLM #56104 and SGLang #35360)."""

    machine = _AbortFrees


class _FailedIsQuiet(Lifecycle):
    def writers(self, block: int) -> list[str]:
        return [
            h
            for h in super().writers(block)
            if not (self.handles[h].state == "failed" and not self.handles[h].deadline_passed)
        ]


@mutant("LIFE-3.2")
class FailedStatusIsQuiescence(_MachineAdapter):
    """A failed transfer status is taken for proof that nothing more lands (TRT-LLM:
    'TransferStatus::release() is not a quiescence proof')."""

    machine = _FailedIsQuiet


class _WriteAfterComplete(Lifecycle):
    def _on_write(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        if handle.state == "completed":
            return  # a late duplicate of a completed transfer: harmless, surely
        super()._on_write(event)


@mutant("LIFE-4.1")
class AcceptsWritesAfterCompletion(_MachineAdapter):
    """A write through a completed handle is accepted."""

    machine = _WriteAfterComplete


class _WriteAfterAbort(Lifecycle):
    def _on_write(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        if handle.state == "aborted":
            return  # the abort is still propagating
        super()._on_write(event)


@mutant("LIFE-4.2")
class AcceptsWritesAfterAbort(_MachineAdapter):
    """A write through an aborted handle still lands."""

    machine = _WriteAfterAbort


class _SendAfterAck(Lifecycle):
    def _on_send(self, event: Mapping[str, Any]) -> None:
        return  # the sender never looks at what it acknowledged


@mutant("LIFE-4.3")
class SendsAfterAcknowledgingAbort(_MachineAdapter):
    """A sender keeps sending a request whose abort it acknowledged (a producer's write
    landing after it retired, vLLM #55470)."""

    machine = _SendAfterAck


class _DeadlineLeavesRequest(Lifecycle):
    def _on_deadline(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        request = self.requests[handle.request]
        before = request.state
        super()._on_deadline(event)
        request.state = before  # the request waits on, as if the handle could recover


@mutant("LIFE-5.1")
class DeadlineDoesNotFailTheRequest(_MachineAdapter):
    """A handle past its deadline fails, but its request stays open."""

    machine = _DeadlineLeavesRequest


class _DeadlineQuiesces(Lifecycle):
    def writers(self, block: int) -> list[str]:
        return [h for h in super().writers(block) if not self.handles[h].deadline_passed]


@mutant("LIFE-5.2")
class DeadlineIsQuiescence(_MachineAdapter):
    """Blocks of a handle past its deadline go back to the pool: the deadline is taken
    for proof that the transfer stopped."""

    machine = _DeadlineQuiesces


class _StalePost(Lifecycle):
    def _on_post(self, event: Mapping[str, Any]) -> None:
        peer = event.get("peer")
        saved = self.epochs.get(peer)  # type: ignore[arg-type]  # None: no such key
        self.epochs.pop(peer, None)  # type: ignore[arg-type]  # None: no such key
        try:
            super()._on_post(event)
        finally:
            if saved is not None:
                self.epochs[peer] = max(saved, self.epochs.get(peer, saved))  # type: ignore[index, arg-type]  # a key: saved was under it


@mutant("LIFE-6.1")
class PostsInAStaleEpoch(_MachineAdapter):
    """A handle may be posted in any epoch of its peer, not only the current one."""

    machine = _StalePost


class _LaterEpochPost(Lifecycle):
    def _on_post(self, event: Mapping[str, Any]) -> None:
        peer, epoch = event.get("peer"), event.get("epoch")
        current = self.epochs.get(peer, 0)  # type: ignore[arg-type]  # None: no such key
        if isinstance(epoch, int) and epoch > current:
            self.epochs[peer] = epoch  # type: ignore[index]  # a newer epoch: the peer restarted
        super()._on_post(event)


@mutant("LIFE-6.1")
class AcceptsPostsFromALaterEpoch(_MachineAdapter):
    """Refuses a post in an older epoch but takes a later one as news that the peer
    restarted, before its peer_up was seen: the clause asks for the current epoch."""

    machine = _LaterEpochPost


class _OldEpochWrite(Lifecycle):
    def _on_write(self, event: Mapping[str, Any]) -> None:
        _name, handle = self._handle(event)
        if event.get("epoch") == handle.epoch:
            saved = self.epochs[handle.peer]
            self.epochs[handle.peer] = handle.epoch  # checks the handle's epoch only
            try:
                super()._on_write(event)
            finally:
                self.epochs[handle.peer] = saved
            return
        super()._on_write(event)


@mutant("LIFE-6.2")
class AcceptsWritesOfAnOldEpoch(_MachineAdapter):
    """A write is checked against its handle's epoch, not its peer's current one."""

    machine = _OldEpochWrite


class _EpochRepeats(Lifecycle):
    def _on_peer_up(self, event: Mapping[str, Any]) -> None:
        peer = event.get("peer")
        if self.epochs.get(peer) == event.get("epoch"):  # type: ignore[arg-type]  # None: no such key
            return  # the same peer again: nothing to do
        super()._on_peer_up(event)


@mutant("LIFE-6.3")
class PeerMayReturnInTheSameEpoch(_MachineAdapter):
    """A peer announcing its current epoch again is accepted as a restart."""

    machine = _EpochRepeats


class _RestartQuiesces(Lifecycle):
    def _on_peer_up(self, event: Mapping[str, Any]) -> None:
        super()._on_peer_up(event)
        for handle in self.handles.values():
            if handle.peer == event["peer"] and handle.state not in QUIESCENT:
                if handle.state == "in_flight":
                    handle.state = "failed"
                handle.state = "quiesced"  # a new process at that address: the old one is gone


@mutant("LIFE-6.4")
class RestartIsQuiescence(_MachineAdapter):
    """A replacement peer at the same address is taken as proof that the old one stopped
    writing (KVCR: 'a replacement peer at the same address does not prove that access
    has stopped')."""

    machine = _RestartQuiesces


class _DeliverEarly(Lifecycle):
    def _on_deliver(self, event: Mapping[str, Any]) -> None:
        name = event.get("request")
        request = self.requests.get(name)  # type: ignore[arg-type]  # None: no such key
        if (
            request is not None
            and request.state == "open"
            and any(self.handles[h].state == "completed" for h in request.handles)
        ):
            request.state = "delivered"  # enough of it arrived
            return
        super()._on_deliver(event)


@mutant("LIFE-7.1")
class DeliversBeforeEveryHandleCompletes(_MachineAdapter):
    """A request is delivered once one of its handles completed (the decode ran without
    KV, vLLM-Omni #6310 review)."""

    machine = _DeliverEarly


class _DeliverAborted(Lifecycle):
    def _on_deliver(self, event: Mapping[str, Any]) -> None:
        request = self.requests.get(event.get("request"))  # type: ignore[arg-type]  # None: no such key
        if request is not None and request.state == "aborted":
            request.state = "delivered"  # the data is all there anyway
            return
        super()._on_deliver(event)


@mutant("LIFE-7.2")
class DeliversAnAbortedRequest(_MachineAdapter):
    """An aborted request whose handles completed is delivered anyway (SGLang #30233:
    decode generating from an aborted prefill's KV)."""

    machine = _DeliverAborted


class _DeliverAgain(Lifecycle):
    def _on_deliver(self, event: Mapping[str, Any]) -> None:
        request = self.requests.get(event.get("request"))  # type: ignore[arg-type]  # None: no such key
        if request is not None and request.state == "delivered":
            return  # delivered already: a repeated notification is harmless
        super()._on_deliver(event)


@mutant("LIFE-7.2")
class DeliversAgain(_MachineAdapter):
    """A second delivery of a delivered request is taken as a repeated notification and
    accepted, so its KV is handed on twice (the clause: delivered only while open)."""

    machine = _DeliverAgain
