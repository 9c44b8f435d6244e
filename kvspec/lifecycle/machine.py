"""When memory may be touched: transfers, blocks, aborts, deadlines and peer epochs [LIFE].

The data rules say which bytes go where; these say *when*. Every 2026 silent-corruption
fix in the field is one of them: a transfer still writing into a block after its request
was aborted and the block reused; KV released before the abort was acknowledged; a
producer's write landing after it retired; a replacement peer at the same address taken
as proof that the old one stopped.

The model. A receiver owns a pool of ``num_blocks`` blocks. A request allocates blocks;
a *transfer handle* (one posted read or write, e.g. one NIXL handle or one shard) may
write into some of them while it is *in flight*. A handle ends **completed** (the
transport's proof that its writes landed: quiescent), **failed** (an error or a passed
deadline) or **aborted** (its request was aborted); failed and aborted handles may
still write until they are **quiesced** (the peer acknowledged, or the transport
proved it stopped). A block returns to the free pool only when no unquiesced handle
could write it; otherwise it waits, or is **poisoned** (never used again).

Blocks move ``free -> allocated -> receiving -> holding -> released -> free``, or to
``poisoned`` from anywhere but free. A request is ``open``, then ``delivered`` (its KV
handed on), ``aborted`` or ``failed``, then ``released``.

Events are plain dicts (``{"ev": "alloc", "request": "r1", "blocks": [0, 1]}``): see
:data:`EVENTS`. :class:`Lifecycle` applies one event at a time and refuses, with
:class:`LifecycleRefusal` naming the obligation, any event the rules forbid — so it is
both the reference state machine and, through :func:`kvspec.lifecycle.trace.check_trace`,
the judge of a recorded history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import show

CLAUSES = (
    Clause(
        "LIFE-1",
        "A transfer handle is posted once and ends once",
        "A handle is posted once, into blocks of its request, from one peer in that peer's "
        "current epoch; it is then in flight. Only an in-flight handle completes, fails or "
        "is aborted; only a failed or aborted handle is quiesced (a completed one already "
        "is). Events naming an unknown handle are refused.",
        obligations=(
            refuses("a handle posted twice"),
            refuses("a handle completed, failed or aborted when it is not in flight"),
            refuses("quiescing a handle that is in flight or already quiesced"),
            refuses("an event naming a handle that was never posted"),
        ),
    ),
    Clause(
        "LIFE-2",
        "Blocks move free, allocated, receiving, holding, released, free; or poisoned",
        "alloc takes only free blocks, for an open request; post only blocks allocated to "
        "its request; a write lands only in its handle's blocks; release hands back the "
        "blocks of a delivered, aborted or failed request; free returns only released "
        "blocks; poison takes any block that is not free and nothing ever takes a poisoned "
        "block back.",
        obligations=(
            must("the pool follows every event: the state of each block and handle agrees"),
            refuses(
                "allocating a block that is not free (allocated, released or poisoned), "
                "or for a request that is not open"
            ),
            refuses("posting into blocks not allocated to the handle's request"),
            refuses("a write into blocks outside its handle"),
            refuses("freeing a block that is not released (poisoned blocks included)"),
            refuses("releasing a request that is still open"),
        ),
    ),
    Clause(
        "LIFE-3",
        "Quiescence before reuse",
        "A block returns to the free pool only after every handle that could write it has "
        "quiesced (completed, or failed or aborted and then quiesced). Until then it stays "
        "released, or it is poisoned. A transfer status such as 'released' or 'cancelled' "
        "is not quiescence.",
        obligations=(
            refuses("freeing a block an aborted handle could still write"),
            refuses("freeing a block a failed handle could still write"),
        ),
    ),
    Clause(
        "LIFE-4",
        "Abort, then acknowledge; nothing lands after either end says it is over",
        "A receiver that aborts a request aborts its in-flight handles and keeps their "
        "blocks until each handle quiesces (its sender acknowledged the abort). A write "
        "lands only through an in-flight handle: after completion, abort, failure or "
        "quiescence it is refused. A sender that acknowledged an abort sends nothing more "
        "for that request.",
        obligations=(
            refuses("a write through a completed handle"),
            refuses("a write through an aborted, failed or quiesced handle"),
            refuses("a send for a request after its abort was acknowledged"),
        ),
    ),
    Clause(
        "LIFE-5",
        "A deadline fails a handle; it does not quiesce it",
        "When a handle's deadline passes it fails and its request fails. Its blocks are "
        "freed only once it quiesces; a receiver that cannot wait poisons them.",
        obligations=(
            must("a handle past its deadline fails, and so does its request"),
            refuses("freeing the blocks of a handle whose deadline passed, before it quiesced"),
        ),
    ),
    Clause(
        "LIFE-6",
        "Peer epochs",
        "Every peer has an epoch; a restarted peer comes back with a higher one. A handle "
        "is posted and written in its peer's current epoch; a write of an older epoch is "
        "refused. A peer's restart is not quiescence: the old epoch's handles keep their "
        "blocks until they quiesce.",
        obligations=(
            refuses("posting a handle in an epoch other than its peer's current one"),
            refuses("a write carrying an older epoch than its peer's current one"),
            refuses("a peer coming back with an epoch that is not higher"),
            refuses("freeing blocks of an old epoch's unquiesced handle after its peer restarted"),
        ),
    ),
    Clause(
        "LIFE-7",
        "KV is handed on only when it is whole",
        "A request is delivered (its KV used, e.g. by decode) only while it is open, when it "
        "has at least one handle and every handle completed.",
        obligations=(
            refuses("delivering a request with a handle in flight, failed or aborted"),
            refuses("delivering a request that is not open: aborted, failed or already delivered"),
        ),
    ),
)

BLOCK_STATES: tuple[str, ...] = (
    "free",
    "allocated",
    "receiving",
    "holding",
    "released",
    "poisoned",
)
HANDLE_STATES: tuple[str, ...] = ("in_flight", "completed", "failed", "aborted", "quiesced")
REQUEST_STATES: tuple[str, ...] = ("open", "delivered", "aborted", "failed", "released")
QUIESCENT: frozenset[str] = frozenset({"completed", "quiesced"})

EVENTS: dict[str, tuple[str, ...]] = {
    "alloc": ("request", "blocks"),
    "post": ("handle", "request", "peer", "epoch", "blocks"),
    "write": ("handle", "epoch", "blocks"),
    "complete": ("handle",),
    "fail": ("handle",),
    "deadline": ("handle",),
    "abort": ("request",),
    "quiesce": ("handle",),
    "deliver": ("request",),
    "release": ("request",),
    "free": ("blocks",),
    "poison": ("blocks",),
    "peer_up": ("peer", "epoch"),
    "send": ("request",),
    "abort_ack": ("request",),
}
"""Every event kind and its required fields (beyond ``ev``); ``reason`` may ride along.

Receiver side: ``alloc post write complete fail deadline abort quiesce deliver release
free poison peer_up``; sender side: ``send`` (it puts data on the wire for a request)
and ``abort_ack`` (it promises to send nothing more for that request)."""


class LifecycleError(ValueError):
    """A malformed event (unknown kind, missing or ill-typed field)."""


class LifecycleRefusal(ValueError):
    """An event the rules forbid in the current state; ``obligation`` names the rule."""

    def __init__(self, obligation: str, message: str) -> None:
        super().__init__(f"{message} [{obligation}]")
        self.obligation = obligation


@dataclass
class Handle:
    request: str
    peer: str
    epoch: int
    blocks: frozenset[int]
    state: str = "in_flight"
    deadline_passed: bool = False


@dataclass
class Request:
    state: str = "open"
    blocks: set[int] = field(default_factory=set)
    handles: list[str] = field(default_factory=list)


def _ids(event: Mapping[str, Any], name: str) -> str:
    value = event.get(name)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise LifecycleError(f"{event.get('ev')}: {name} must be a short string, got {show(value)}")
    return value


def _int(event: Mapping[str, Any], name: str) -> int:
    value = event.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise LifecycleError(
            f"{event.get('ev')}: {name} must be an integer >= 0, got {show(value)}"
        )
    return value


class Lifecycle:
    """The reference state machine of one rank's transfers and block pool [LIFE-1..7]."""

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise LifecycleError(f"num_blocks must be an integer >= 0, got {show(num_blocks)}")
        self.num_blocks = num_blocks
        self.blocks: list[str] = ["free"] * num_blocks
        self.owner: list[str | None] = [None] * num_blocks
        self.handles: dict[str, Handle] = {}
        self.requests: dict[str, Request] = {}
        self.epochs: dict[str, int] = {}
        self.acked: set[str] = set()

    # -- reading the state ----------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, str]]:
        """Every block, handle and request with its state: what conformance compares."""
        return {
            "blocks": {str(b): s for b, s in enumerate(self.blocks)},
            "handles": {h: v.state for h, v in sorted(self.handles.items())},
            "requests": {r: v.state for r, v in sorted(self.requests.items())},
        }

    def free_blocks(self) -> list[int]:
        return [b for b, s in enumerate(self.blocks) if s == "free"]

    def writers(self, block: int) -> list[str]:
        """Handles that could still write ``block``: posted into it and not quiesced."""
        return sorted(
            h for h, v in self.handles.items() if block in v.blocks and v.state not in QUIESCENT
        )

    def can_free(self, block: int) -> bool:
        """Whether ``free`` of ``block`` would be accepted now [LIFE-3]."""
        return self.blocks[block] == "released" and not self.writers(block)

    # -- applying events --------------------------------------------------------------------
    def apply(self, event: Mapping[str, Any]) -> None:
        """Apply one event; refuse (and change nothing) if the rules forbid it."""
        if not isinstance(event, Mapping):
            raise LifecycleError(f"an event is a dict, got {show(event)}")
        kind = event.get("ev")
        if not isinstance(kind, str) or kind not in EVENTS:
            raise LifecycleError(f"unknown event {show(kind)}; known: {', '.join(EVENTS)}")
        missing = [name for name in EVENTS[kind] if name not in event]
        if missing:
            raise LifecycleError(f"{kind}: missing {', '.join(missing)}")
        getattr(self, f"_on_{kind}")(event)

    def _blocks(self, event: Mapping[str, Any]) -> list[int]:
        values = event.get("blocks")
        if not isinstance(values, list | tuple) or len(values) > self.num_blocks + 1:
            raise LifecycleError(f"{event['ev']}: blocks must be a list, got {show(values)}")
        out = []
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LifecycleError(f"{event['ev']}: block ids are integers, got {show(value)}")
            if not 0 <= value < self.num_blocks:
                raise LifecycleError(
                    f"{event['ev']}: block {value} is outside the pool 0..{self.num_blocks - 1}"
                )
            out.append(value)
        if len(set(out)) != len(out):
            raise LifecycleError(f"{event['ev']}: blocks {out} list a block twice")
        return out

    def _handle(self, event: Mapping[str, Any]) -> tuple[str, Handle]:
        name = _ids(event, "handle")
        if name not in self.handles:
            raise LifecycleRefusal("LIFE-1.4", f"{event['ev']} of handle {name!r}, never posted")
        return name, self.handles[name]

    def _request(self, event: Mapping[str, Any], *, create: bool = False) -> tuple[str, Request]:
        name = _ids(event, "request")
        if name not in self.requests:
            if not create:
                raise LifecycleRefusal(
                    "LIFE-2.6", f"{event['ev']} of request {name!r}, which allocated nothing"
                )
            return name, Request()
        return name, self.requests[name]

    def _on_alloc(self, event: Mapping[str, Any]) -> None:
        name, request = self._request(event, create=True)
        blocks = self._blocks(event)
        if request.state != "open":
            raise LifecycleRefusal(
                "LIFE-2.2", f"alloc for request {name!r}, which is {request.state}, not open"
            )
        taken = [b for b in blocks if self.blocks[b] != "free"]
        if taken:
            states = ", ".join(f"{b} {self.blocks[b]}" for b in taken)
            raise LifecycleRefusal("LIFE-2.2", f"alloc for {name!r} of blocks not free: {states}")
        self.requests[name] = request
        for b in blocks:
            self.blocks[b], self.owner[b] = "allocated", name
            request.blocks.add(b)

    def _on_post(self, event: Mapping[str, Any]) -> None:
        handle = _ids(event, "handle")
        peer = _ids(event, "peer")
        epoch = _int(event, "epoch")
        blocks = self._blocks(event)
        if handle in self.handles:
            raise LifecycleRefusal("LIFE-1.1", f"handle {handle!r} is posted twice")
        name, request = self._request(event)
        if request.state != "open":
            raise LifecycleRefusal(
                "LIFE-2.3", f"post of {handle!r} for request {name!r}, which is {request.state}"
            )
        foreign = [
            b
            for b in blocks
            if self.owner[b] != name or self.blocks[b] not in ("allocated", "receiving")
        ]
        if foreign:
            raise LifecycleRefusal(
                "LIFE-2.3",
                f"post of {handle!r} into blocks {foreign}, not allocated to request {name!r}",
            )
        current = self.epochs.setdefault(peer, epoch)
        if epoch != current:
            raise LifecycleRefusal(
                "LIFE-6.1",
                f"post of {handle!r} in epoch {epoch} of peer {peer!r}, whose epoch is {current}",
            )
        self.handles[handle] = Handle(name, peer, epoch, frozenset(blocks))
        request.handles.append(handle)
        for b in blocks:
            self.blocks[b] = "receiving"

    def _on_write(self, event: Mapping[str, Any]) -> None:
        name, handle = self._handle(event)
        epoch = _int(event, "epoch")
        blocks = self._blocks(event)
        if handle.state == "completed":
            raise LifecycleRefusal("LIFE-4.1", f"a write through {name!r}, already completed")
        if handle.state != "in_flight":
            raise LifecycleRefusal("LIFE-4.2", f"a write through {name!r}, {handle.state}")
        current = self.epochs[handle.peer]
        if epoch != handle.epoch or epoch != current:
            raise LifecycleRefusal(
                "LIFE-6.2",
                f"a write through {name!r} in epoch {epoch}; its peer {handle.peer!r} is in "
                f"epoch {current} and the handle was posted in {handle.epoch}",
            )
        outside = sorted(set(blocks) - handle.blocks)
        if outside:
            raise LifecycleRefusal(
                "LIFE-2.4", f"a write through {name!r} into blocks {outside} outside the handle"
            )

    def _end(self, event: Mapping[str, Any], to: str) -> None:
        name, handle = self._handle(event)
        if handle.state != "in_flight":
            raise LifecycleRefusal(
                "LIFE-1.2", f"{event['ev']} of handle {name!r}, which is {handle.state}"
            )
        handle.state = to
        handle.deadline_passed = event["ev"] == "deadline"
        request = self.requests[handle.request]
        if to == "failed" and request.state == "open":
            request.state = "failed"
        if to == "completed":
            for b in handle.blocks:
                if self.blocks[b] == "receiving" and all(
                    self.handles[h].state == "completed"
                    for h in request.handles
                    if b in self.handles[h].blocks
                ):
                    self.blocks[b] = "holding"

    def _on_complete(self, event: Mapping[str, Any]) -> None:
        self._end(event, "completed")

    def _on_fail(self, event: Mapping[str, Any]) -> None:
        self._end(event, "failed")

    def _on_deadline(self, event: Mapping[str, Any]) -> None:
        self._end(event, "failed")  # a passed deadline is a failure, not quiescence [LIFE-5]

    def _on_abort(self, event: Mapping[str, Any]) -> None:
        name, request = self._request(event)
        if request.state not in ("open", "failed"):
            raise LifecycleRefusal(
                "LIFE-2.6", f"abort of request {name!r}, which is {request.state}"
            )
        request.state = "aborted"
        for h in request.handles:
            if self.handles[h].state == "in_flight":
                self.handles[h].state = "aborted"

    def _on_quiesce(self, event: Mapping[str, Any]) -> None:
        name, handle = self._handle(event)
        if handle.state not in ("failed", "aborted"):
            raise LifecycleRefusal(
                "LIFE-1.3", f"quiesce of handle {name!r}, which is {handle.state}"
            )
        handle.state = "quiesced"

    def _on_deliver(self, event: Mapping[str, Any]) -> None:
        name, request = self._request(event)
        if request.state != "open":
            raise LifecycleRefusal(
                "LIFE-7.2", f"deliver of request {name!r}, which is {request.state}"
            )
        unfinished = [h for h in request.handles if self.handles[h].state != "completed"]
        if not request.handles or unfinished:
            states = ", ".join(f"{h} {self.handles[h].state}" for h in unfinished) or "no handle"
            raise LifecycleRefusal(
                "LIFE-7.1", f"deliver of request {name!r} before every handle completed: {states}"
            )
        request.state = "delivered"

    def _on_release(self, event: Mapping[str, Any]) -> None:
        name, request = self._request(event)
        if request.state not in ("delivered", "aborted", "failed"):
            raise LifecycleRefusal(
                "LIFE-2.6", f"release of request {name!r}, which is {request.state}"
            )
        request.state = "released"
        for b in request.blocks:
            if self.blocks[b] != "poisoned":
                self.blocks[b] = "released"

    def _on_free(self, event: Mapping[str, Any]) -> None:
        blocks = self._blocks(event)
        for b in blocks:
            if self.blocks[b] != "released":
                raise LifecycleRefusal(
                    "LIFE-2.5", f"free of block {b}, which is {self.blocks[b]}, not released"
                )
        for b in blocks:
            writers = self.writers(b)
            if writers:
                raise LifecycleRefusal(*_why_not_quiescent(self, b, writers))
        for b in blocks:
            owner = self.owner[b]
            if owner is not None:
                self.requests[owner].blocks.discard(b)
            self.blocks[b], self.owner[b] = "free", None
            for handle in self.handles.values():  # quiesced: they will never write it
                if b in handle.blocks:
                    handle.blocks = handle.blocks - {b}

    def _on_poison(self, event: Mapping[str, Any]) -> None:
        blocks = self._blocks(event)
        for b in blocks:
            if self.blocks[b] == "free":
                raise LifecycleRefusal("LIFE-2.5", f"poison of block {b}, which is free")
        for b in blocks:
            self.blocks[b] = "poisoned"

    def _on_peer_up(self, event: Mapping[str, Any]) -> None:
        peer, epoch = _ids(event, "peer"), _int(event, "epoch")
        current = self.epochs.get(peer)
        if current is not None and epoch <= current:
            raise LifecycleRefusal(
                "LIFE-6.3", f"peer {peer!r} back in epoch {epoch}, not above its epoch {current}"
            )
        self.epochs[peer] = epoch  # the old epoch's handles keep their state [LIFE-6.4]

    def _on_send(self, event: Mapping[str, Any]) -> None:
        name = _ids(event, "request")
        if name in self.acked:
            raise LifecycleRefusal(
                "LIFE-4.3", f"a send for request {name!r} after its abort was acknowledged"
            )

    def _on_abort_ack(self, event: Mapping[str, Any]) -> None:
        self.acked.add(_ids(event, "request"))

    def apply_all(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.apply(event)


def _why_not_quiescent(machine: Lifecycle, block: int, writers: list[str]) -> tuple[str, str]:
    """The obligation a premature free breaks, by why its writers are not quiescent."""
    handles = [machine.handles[h] for h in writers]
    old_epoch = [
        h for h, v in zip(writers, handles, strict=True) if v.epoch < machine.epochs[v.peer]
    ]
    states = ", ".join(f"{h} {v.state}" for h, v in zip(writers, handles, strict=True))
    message = f"free of block {block} while handles could still write it: {states}"
    if old_epoch:
        return "LIFE-6.4", message + f" (peer restarted; {old_epoch} never quiesced)"
    if any(v.state == "aborted" for v in handles):
        return "LIFE-3.1", message
    if any(v.deadline_passed for v in handles):
        return "LIFE-5.2", message + " (a passed deadline is not quiescence)"
    return "LIFE-3.2", message
