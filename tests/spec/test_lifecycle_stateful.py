"""The lifecycle rules as a state machine under test [LIFE-1..7]: Hypothesis drives the
reference :class:`Lifecycle` with any sequence of events, valid or not, beside a model
written from the clause text alone, and after every step both must agree on what was
accepted, and the pool must keep the rules' safety promises.

The model is deliberately naive (sets and dicts, no shared code with the machine): it
says for each event whether the rules allow it, and what changes if they do."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvspec.lifecycle.machine import Lifecycle, LifecycleRefusal

BLOCKS = 4
REQUESTS = ("r0", "r1", "r2")
HANDLES = ("h0", "h1", "h2", "h3", "h4", "h5")
PEERS = ("p0", "p1")
ENDED = {"complete": "completed", "fail": "failed", "deadline": "failed"}


@dataclass
class ModelHandle:
    request: str
    peer: str
    epoch: int
    blocks: set[int]
    state: str = "in_flight"


@dataclass
class ModelRequest:
    state: str = "open"
    blocks: set[int] = field(default_factory=set)
    handles: list[str] = field(default_factory=list)


block_sets = st.sets(st.integers(0, BLOCKS - 1), min_size=1, max_size=BLOCKS).map(sorted)


def name_among(
    data: st.DataObject, likely: Iterable[str], pool: tuple[str, ...], label: str
) -> str:
    """Mostly one of ``likely`` (names the history already has), sometimes any of ``pool``."""
    known = sorted(likely)
    if known and data.draw(st.integers(0, 4), label=f"{label} known") > 0:
        return data.draw(st.sampled_from(known), label=label)
    return data.draw(st.sampled_from(pool), label=label)


def blocks_among(data: st.DataObject, likely: set[int]) -> list[int]:
    """Mostly a non-empty subset of ``likely`` (so deep states are reached), sometimes any
    blocks (so the refusals are tried too)."""
    if likely and data.draw(st.integers(0, 4), label="pick likely") > 0:
        chosen = data.draw(st.sets(st.sampled_from(sorted(likely)), min_size=1), label="blocks")
        return sorted(chosen)
    return data.draw(block_sets, label="blocks")


class LifecycleRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = Lifecycle(BLOCKS)
        self.block: dict[int, str] = dict.fromkeys(range(BLOCKS), "free")
        self.owner: dict[int, str | None] = dict.fromkeys(range(BLOCKS), None)
        self.handles: dict[str, ModelHandle] = {}
        self.requests: dict[str, ModelRequest] = {}
        self.epoch: dict[str, int] = {}
        self.acked: set[str] = set()
        self.delivered_whole: set[str] = set()

    # -- one step: the model's verdict against the machine's ----------------------------
    def step(self, event: dict, allowed: bool) -> bool:
        """Apply ``event``; the machine must accept it exactly when the model allows it,
        and a refusal must leave its state as it was."""
        before = self.machine.snapshot()
        try:
            self.machine.apply(event)
        except LifecycleRefusal as refusal:
            assert not allowed, f"{event} is allowed by the rules, refused: {refusal}"
            assert self.machine.snapshot() == before, f"refused {event} changed the state"
            assert refusal.obligation.startswith("LIFE-"), refusal
            return False
        assert allowed, f"{event} breaks a rule, accepted; state {before}"
        return True

    def unquiesced_writers(self, b: int) -> list[str]:
        return [
            h
            for h, v in self.handles.items()
            if b in v.blocks and v.state not in ("completed", "quiesced")
        ]

    # -- receiver events ------------------------------------------------------------------
    @rule(request=st.sampled_from(REQUESTS), data=st.data())
    def alloc(self, request: str, data: st.DataObject) -> None:
        blocks = blocks_among(data, {b for b, s in self.block.items() if s == "free"})
        r = self.requests.get(request, ModelRequest())
        allowed = r.state == "open" and all(self.block[b] == "free" for b in blocks)
        if self.step({"ev": "alloc", "request": request, "blocks": blocks}, allowed):
            self.requests[request] = r
            for b in blocks:
                self.block[b], self.owner[b] = "allocated", request
                r.blocks.add(b)

    @precondition(lambda self: any(r.blocks for r in self.requests.values()))
    @rule(
        peer=st.sampled_from(PEERS),
        stale=st.integers(0, 3).map(lambda n: n == 0),
        data=st.data(),
    )
    def post(self, peer: str, stale: bool, data: st.DataObject) -> None:
        handle = name_among(data, set(HANDLES) - set(self.handles), HANDLES, "handle")
        open_ = [r for r, v in self.requests.items() if v.state == "open" and v.blocks]
        request = name_among(data, open_, REQUESTS, "request")
        mine = self.requests[request].blocks if request in self.requests else set()
        blocks = blocks_among(data, mine)
        current = self.epoch.get(peer, 0)
        epoch = current + 1 if stale and peer in self.epoch else current
        r = self.requests.get(request)
        allowed = (
            handle not in self.handles
            and r is not None
            and r.state == "open"
            and all(
                self.owner[b] == request and self.block[b] in ("allocated", "receiving")
                for b in blocks
            )
            and (peer not in self.epoch or epoch == self.epoch[peer])
        )
        event = {
            "ev": "post",
            "handle": handle,
            "request": request,
            "peer": peer,
            "epoch": epoch,
            "blocks": blocks,
        }
        if self.step(event, allowed):
            assert r is not None
            self.epoch.setdefault(peer, epoch)
            self.handles[handle] = ModelHandle(request, peer, epoch, set(blocks))
            r.handles.append(handle)
            for b in blocks:
                self.block[b] = "receiving"

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), old_epoch=st.booleans())
    def write(self, data: st.DataObject, old_epoch: bool) -> None:
        handle = data.draw(st.sampled_from(sorted(self.handles)), label="handle")
        h = self.handles[handle]
        blocks = blocks_among(data, h.blocks)
        epoch = h.epoch - 1 if old_epoch and h.epoch > 0 else h.epoch
        allowed = (
            h.state == "in_flight"
            and epoch == h.epoch == self.epoch[h.peer]
            and set(blocks) <= h.blocks
        )
        self.step({"ev": "write", "handle": handle, "epoch": epoch, "blocks": blocks}, allowed)

    @rule(kind=st.sampled_from(sorted(ENDED)), data=st.data())
    def end(self, kind: str, data: st.DataObject) -> None:
        flying = [h for h, v in self.handles.items() if v.state == "in_flight"]
        handle = name_among(data, flying, HANDLES, "handle")
        h = self.handles.get(handle)
        allowed = h is not None and h.state == "in_flight"
        if self.step({"ev": kind, "handle": handle}, allowed):
            assert h is not None
            h.state = ENDED[kind]
            r = self.requests[h.request]
            if h.state == "failed" and r.state == "open":
                r.state = "failed"
            if h.state == "completed":
                for b in h.blocks:
                    writers = [x for x in r.handles if b in self.handles[x].blocks]
                    if self.block[b] == "receiving" and all(
                        self.handles[x].state == "completed" for x in writers
                    ):
                        self.block[b] = "holding"

    @rule(data=st.data())
    def quiesce(self, data: st.DataObject) -> None:
        ended = [h for h, v in self.handles.items() if v.state in ("failed", "aborted")]
        handle = name_among(data, ended, HANDLES, "handle")
        h = self.handles.get(handle)
        allowed = h is not None and h.state in ("failed", "aborted")
        if self.step({"ev": "quiesce", "handle": handle}, allowed):
            assert h is not None
            h.state = "quiesced"

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        ready = [r for r, v in self.requests.items() if v.state in ("open", "failed")]
        request = name_among(data, ready, REQUESTS, "request")
        r = self.requests.get(request)
        allowed = r is not None and r.state in ("open", "failed")
        if self.step({"ev": "abort", "request": request}, allowed):
            assert r is not None
            r.state = "aborted"
            for x in r.handles:
                if self.handles[x].state == "in_flight":
                    self.handles[x].state = "aborted"

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        ready = [r for r, v in self.requests.items() if v.state in ("open",)]
        request = name_among(data, ready, REQUESTS, "request")
        r = self.requests.get(request)
        allowed = (
            r is not None
            and r.state == "open"
            and bool(r.handles)
            and all(self.handles[x].state == "completed" for x in r.handles)
        )
        if self.step({"ev": "deliver", "request": request}, allowed):
            assert r is not None
            r.state = "delivered"
            self.delivered_whole.add(request)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ready = [
            r for r, v in self.requests.items() if v.state in ("delivered", "aborted", "failed")
        ]
        request = name_among(data, ready, REQUESTS, "request")
        r = self.requests.get(request)
        allowed = r is not None and r.state in ("delivered", "aborted", "failed")
        if self.step({"ev": "release", "request": request}, allowed):
            assert r is not None
            r.state = "released"
            for b in r.blocks:
                if self.block[b] != "poisoned":
                    self.block[b] = "released"

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        blocks = blocks_among(data, {b for b, s in self.block.items() if s == "released"})
        allowed = all(self.block[b] == "released" for b in blocks) and not any(
            self.unquiesced_writers(b) for b in blocks
        )
        if self.step({"ev": "free", "blocks": blocks}, allowed):
            for b in blocks:
                owner = self.owner[b]
                if owner is not None:
                    self.requests[owner].blocks.discard(b)
                self.block[b], self.owner[b] = "free", None
                for h in self.handles.values():
                    h.blocks.discard(b)

    @rule(data=st.data())
    def poison(self, data: st.DataObject) -> None:
        # a receiver poisons what it cannot wait for: mostly released blocks
        blocks = blocks_among(data, {b for b, s in self.block.items() if s == "released"})
        allowed = all(self.block[b] != "free" for b in blocks)
        if self.step({"ev": "poison", "blocks": blocks}, allowed):
            for b in blocks:
                self.block[b] = "poisoned"

    @rule(peer=st.sampled_from(PEERS), step=st.integers(-1, 2))
    def peer_up(self, peer: str, step: int) -> None:
        epoch = max(0, self.epoch.get(peer, 0) + step)
        allowed = peer not in self.epoch or epoch > self.epoch[peer]
        if self.step({"ev": "peer_up", "peer": peer, "epoch": epoch}, allowed):
            self.epoch[peer] = epoch

    # -- sender events ----------------------------------------------------------------------
    @rule(request=st.sampled_from(REQUESTS))
    def send(self, request: str) -> None:
        self.step({"ev": "send", "request": request}, request not in self.acked)

    @rule(request=st.sampled_from(REQUESTS))
    def abort_ack(self, request: str) -> None:
        if self.step({"ev": "abort_ack", "request": request}, True):
            self.acked.add(request)

    # -- what must hold after every step --------------------------------------------------
    @invariant()
    def the_pool_follows_every_event(self) -> None:
        """LIFE-2.1: every block, handle and request is in the state the events imply."""
        assert self.machine.snapshot() == {
            "blocks": {str(b): s for b, s in self.block.items()},
            "handles": {h: v.state for h, v in sorted(self.handles.items())},
            "requests": {r: v.state for r, v in sorted(self.requests.items())},
        }

    @invariant()
    def no_free_block_can_still_be_written(self) -> None:
        """LIFE-3: a block in the free pool has no handle that could still write it."""
        for b, state in self.block.items():
            if state == "free":
                assert not self.machine.writers(b), (b, self.machine.writers(b))

    @invariant()
    def delivered_kv_was_whole(self) -> None:
        """LIFE-7: a delivered request's handles all completed."""
        for name in self.delivered_whole:
            handles = self.requests[name].handles
            assert handles and all(self.handles[h].state == "completed" for h in handles)


TestLifecycleRules = LifecycleRules.TestCase
TestLifecycleRules.settings = settings(max_examples=200, stateful_step_count=100, deadline=None)
