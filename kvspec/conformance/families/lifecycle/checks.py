"""Checks of the lifecycle rules [LIFE-1..7]: event histories driven through the
implementation's state machine and the reference, step by step.

Each example is ``{"num_blocks": n, "events": [...]}``: a random walk of mostly valid
events (requests allocated, handles posted, writes, completions, failures, deadlines,
aborts and acknowledgements, releases, frees, peer restarts) followed by a *hazard*
aimed at one obligation — a free while an aborted handle could still write, a write of
an old epoch, a send after acknowledging an abort, ... Every event goes to both
machines: the implementation must refuse exactly what the reference refuses, and after
every event its blocks, handles and requests must be in the reference's states.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import fail, refused
from kvspec.lifecycle.machine import Lifecycle, LifecycleError, LifecycleRefusal

POOL = 12
Pick = Callable[[int], int]
"""``pick(n)``: a choice in ``0..n-1`` (drawn by Hypothesis, or 0 for a pinned example)."""


class Script:
    """An event history under construction, tracked by the reference machine so that
    every next event can be chosen to make sense (or, for a hazard, to break a rule)."""

    def __init__(self, num_blocks: int = POOL) -> None:
        self.machine = Lifecycle(num_blocks)
        self.events: list[dict[str, Any]] = []
        self.count = 0

    def do(self, **event: Any) -> bool:
        """Append ``event``; whether the reference accepted it."""
        self.events.append(event)
        try:
            self.machine.apply(event)
        except (LifecycleRefusal, LifecycleError):
            return False
        return True

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def epoch(self, peer: str) -> int:
        return self.machine.epochs.get(peer, 0)

    def request(self, pick: Pick, *, size: int = 2) -> tuple[str, list[int]]:
        """A new request holding up to ``size`` free blocks (freeing released ones first)."""
        free = self.machine.free_blocks()
        if len(free) < size:
            self.recycle()
            free = self.machine.free_blocks()
        name = self.fresh("r")
        blocks = free[: max(1, min(size, len(free)))] if free else []
        if len(free) > size:
            start = pick(len(free) - size + 1)
            blocks = free[start : start + size]
        self.do(ev="alloc", request=name, blocks=blocks)
        return name, blocks

    def post(self, request: str, blocks: list[int], peer: str = "p0") -> str:
        handle = self.fresh("h")
        self.do(
            ev="post",
            handle=handle,
            request=request,
            peer=peer,
            epoch=self.epoch(peer),
            blocks=blocks,
        )
        return handle

    def write(self, handle: str, blocks: list[int], epoch: int | None = None) -> None:
        known = self.machine.handles.get(handle)
        self.do(
            ev="write",
            handle=handle,
            epoch=known.epoch if epoch is None and known else (epoch or 0),
            blocks=blocks,
        )

    def recycle(self) -> None:
        """Quiesce, release and free whatever can be, to make room in the pool."""
        m = self.machine
        for name, request in list(m.requests.items()):
            if request.state in ("aborted", "failed"):
                for h in request.handles:
                    if m.handles[h].state in ("failed", "aborted"):
                        self.do(ev="quiesce", handle=h)
            if request.state in ("delivered", "aborted", "failed"):
                self.do(ev="release", request=name)
        ready = [b for b in range(m.num_blocks) if m.can_free(b)]
        if ready:
            self.do(ev="free", blocks=ready)


def random_walk(script: Script, pick: Pick, steps: int) -> None:
    """Mostly valid traffic: requests come and go, transfers end every way there is."""
    m = script.machine
    for _ in range(steps):
        move = pick(8)
        open_requests = [r for r, v in m.requests.items() if v.state == "open"]
        in_flight = [h for h, v in m.handles.items() if v.state == "in_flight"]
        if move == 0 or not open_requests:
            request, blocks = script.request(pick, size=1 + pick(2))
            for peer in ("p0", "p1")[: 1 + pick(2)]:
                script.post(request, blocks, peer)
        elif move == 1 and in_flight:
            h = in_flight[pick(len(in_flight))]
            script.write(h, sorted(m.handles[h].blocks))
        elif move == 2 and in_flight:
            h = in_flight[pick(len(in_flight))]
            script.do(ev=("complete", "complete", "fail", "deadline")[pick(4)], handle=h)
        elif move == 3:
            request = open_requests[pick(len(open_requests))]
            if all(m.handles[h].state == "completed" for h in m.requests[request].handles):
                script.do(ev="deliver", request=request)
            else:
                script.do(ev="abort", request=request)
                script.do(ev="send", request=request)
                script.do(ev="abort_ack", request=request)
        elif move == 4:
            script.recycle()
        elif move == 5:
            peer = ("p0", "p1")[pick(2)]
            script.do(ev="peer_up", peer=peer, epoch=script.epoch(peer) + 1)
        elif move == 6:
            script.do(ev="send", request=open_requests[pick(len(open_requests))])
        elif move == 7:
            held = [b for b, s in enumerate(m.blocks) if s == "released"]
            if held and pick(3) == 0:
                script.do(ev="poison", blocks=[held[pick(len(held))]])


# -- hazards: each builds what it needs, then attempts one forbidden event ----------------


def _posted(script: Script, pick: Pick, peer: str = "p0") -> tuple[str, list[int], str]:
    request, blocks = script.request(pick)
    return request, blocks, script.post(request, blocks, peer)


def _post_twice(s: Script, pick: Pick) -> None:
    request, blocks, handle = _posted(s, pick)
    s.do(ev="post", handle=handle, request=request, peer="p0", epoch=s.epoch("p0"), blocks=blocks)


def _end_twice(s: Script, pick: Pick) -> None:
    _, _, handle = _posted(s, pick)
    first, second = [("complete", "complete"), ("fail", "complete"), ("complete", "fail")][pick(3)]
    s.do(ev=first, handle=handle)
    s.do(ev=second, handle=handle)


def _quiesce_in_flight(s: Script, pick: Pick) -> None:
    _, _, handle = _posted(s, pick)
    if pick(2):
        s.do(ev="complete", handle=handle)  # completed: already quiescent
    s.do(ev="quiesce", handle=handle)


def _unknown_handle(s: Script, pick: Pick) -> None:
    kind = ("complete", "fail", "deadline", "quiesce")[pick(4)]
    s.do(ev=kind, handle=s.fresh("ghost"))


def _alloc_taken(s: Script, pick: Pick) -> None:
    request, blocks, handle = _posted(s, pick)
    how = pick(4)
    if how == 3:  # free blocks, but for a request already delivered
        s.do(ev="complete", handle=handle)
        s.do(ev="deliver", request=request)
        s.do(ev="alloc", request=request, blocks=s.machine.free_blocks()[:1])
        return
    if how >= 1:
        s.do(ev="abort", request=request)
        s.do(ev="release", request=request)
    if how == 2:
        s.do(ev="poison", blocks=blocks[:1])
    s.do(ev="alloc", request=s.fresh("r"), blocks=blocks[:1])


def _post_foreign(s: Script, pick: Pick) -> None:
    _first, blocks = s.request(pick)
    second, _ = s.request(pick)
    s.do(
        ev="post",
        handle=s.fresh("h"),
        request=second,
        peer="p0",
        epoch=s.epoch("p0"),
        blocks=blocks,
    )


def _write_outside(s: Script, pick: Pick) -> None:
    request, blocks = s.request(pick, size=2)
    handle = s.post(request, blocks[:1])
    s.write(handle, blocks)


def _free_unreleased(s: Script, pick: Pick) -> None:
    request, blocks, handle = _posted(s, pick)
    if pick(2):
        s.do(ev="complete", handle=handle)
        s.do(ev="deliver", request=request)
        s.do(ev="release", request=request)
        s.do(ev="poison", blocks=blocks[:1])
    s.do(ev="free", blocks=blocks[:1])


def _release_open(s: Script, pick: Pick) -> None:
    request, _, _ = _posted(s, pick)
    s.do(ev="release", request=request)


def _free_after(end: str) -> Callable[[Script, Pick], None]:
    def hazard(s: Script, pick: Pick) -> None:
        request, blocks, handle = _posted(s, pick)
        if end == "abort":
            s.do(ev="abort", request=request)
        else:
            s.do(ev=end, handle=handle)
        s.do(ev="release", request=request)
        s.do(ev="free", blocks=blocks)

    return hazard


def _write_after(end: str) -> Callable[[Script, Pick], None]:
    def hazard(s: Script, pick: Pick) -> None:
        request, blocks, handle = _posted(s, pick)
        if end == "abort":
            s.do(ev="abort", request=request)
        elif end == "quiesce":
            s.do(ev="fail", handle=handle)
            s.do(ev="quiesce", handle=handle)
        else:
            s.do(ev=end, handle=handle)
        s.write(handle, blocks)

    return hazard


def _send_after_ack(s: Script, pick: Pick) -> None:
    request = s.fresh("r")
    s.do(ev="send", request=request)
    s.do(ev="abort_ack", request=request)
    s.do(ev="send", request=request)


def _deadline(s: Script, pick: Pick) -> None:
    request, _blocks, handle = _posted(s, pick)
    s.do(ev="deadline", handle=handle)
    if pick(2):
        s.do(ev="deliver", request=request)


def _stale_post(s: Script, pick: Pick) -> None:
    """A post in an epoch of its peer that is not the current one: an older one, or one
    the peer has not announced yet."""
    request, blocks = s.request(pick)
    old = s.epoch("p1")
    s.do(ev="peer_up", peer="p1", epoch=old + 1)
    epoch = old if not pick(2) else old + 2 + pick(2)
    s.do(ev="post", handle=s.fresh("h"), request=request, peer="p1", epoch=epoch, blocks=blocks)


def _old_epoch_write(s: Script, pick: Pick) -> None:
    _request, blocks, handle = _posted(s, pick, peer="p1")
    epoch = s.epoch("p1")
    s.do(ev="peer_up", peer="p1", epoch=epoch + 1 + pick(3))
    s.write(handle, blocks, epoch=epoch)


def _epoch_not_higher(s: Script, pick: Pick) -> None:
    epoch = s.epoch("p1") + 1 + pick(3)
    s.do(ev="peer_up", peer="p1", epoch=epoch)
    s.do(ev="peer_up", peer="p1", epoch=epoch - pick(2))


def _free_after_restart(s: Script, pick: Pick) -> None:
    request, blocks, handle = _posted(s, pick, peer="p1")
    s.do(ev="peer_up", peer="p1", epoch=s.epoch("p1") + 1)
    if pick(2):
        s.do(ev="abort", request=request)
    else:
        s.do(ev="fail", handle=handle)
    s.do(ev="release", request=request)
    s.do(ev="free", blocks=blocks)


def _deliver_unfinished(s: Script, pick: Pick) -> None:
    request, blocks, handle = _posted(s, pick)
    other = s.post(request, blocks, "p1")
    s.do(ev="complete", handle=handle)
    if pick(2):
        s.do(ev="fail", handle=other)
    s.do(ev="deliver", request=request)


def _deliver_aborted(s: Script, pick: Pick) -> None:
    """A delivery of a request that is no longer open: aborted, or delivered already."""
    request, _, handle = _posted(s, pick)
    s.do(ev="complete", handle=handle)
    s.do(ev="deliver" if pick(2) else "abort", request=request)
    s.do(ev="deliver", request=request)


HAZARDS: dict[str, Callable[[Script, Pick], None]] = {
    "LIFE-1.1": _post_twice,
    "LIFE-1.2": _end_twice,
    "LIFE-1.3": _quiesce_in_flight,
    "LIFE-1.4": _unknown_handle,
    "LIFE-2.2": _alloc_taken,
    "LIFE-2.3": _post_foreign,
    "LIFE-2.4": _write_outside,
    "LIFE-2.5": _free_unreleased,
    "LIFE-2.6": _release_open,
    "LIFE-3.1": _free_after("abort"),
    "LIFE-3.2": _free_after("fail"),
    "LIFE-4.1": _write_after("complete"),
    "LIFE-4.2": _write_after("abort"),
    "LIFE-4.3": _send_after_ack,
    "LIFE-5.1": _deadline,
    "LIFE-5.2": _free_after("deadline"),
    "LIFE-6.1": _stale_post,
    "LIFE-6.2": _old_epoch_write,
    "LIFE-6.3": _epoch_not_higher,
    "LIFE-6.4": _free_after_restart,
    "LIFE-7.1": _deliver_unfinished,
    "LIFE-7.2": _deliver_aborted,
}
"""The obligation each hazard aims at (LIFE-2.1, the agreement itself, is every step)."""


def history(hazards: list[str], pick: Pick, steps: int) -> Example:
    """A random walk of ``steps`` moves, then the hazards, in order."""
    script = Script()
    random_walk(script, pick, steps)
    for obligation in hazards:
        HAZARDS[obligation](script, pick)
    return {"num_blocks": script.machine.num_blocks, "events": script.events}


def _histories(obligations: tuple[str, ...]) -> Callable[[Any], st.SearchStrategy[Example]]:
    @st.composite
    def examples(draw: st.DrawFn) -> Example:
        chosen = draw(st.lists(st.sampled_from(obligations), min_size=1, max_size=2))
        steps = draw(st.integers(0, 10))
        return history(chosen, lambda n: draw(st.integers(0, max(0, n - 1))), steps)

    return lambda adapter: examples()


def _pins(obligations: tuple[str, ...]) -> tuple[Example, ...]:
    """Each hazard with every choice made the same way, first, second or third (as far as
    each choice goes): a hazard's every variant runs on every run, whatever the draw."""
    pins: list[Example] = []
    for obligation in obligations:
        for k in range(3):

            def pick(n: int, k: int = k) -> int:
                return min(k, max(0, n - 1))

            pin = history([obligation], pick, 0)
            if pin not in pins:
                pins.append(pin)
    return tuple(pins)


def _event(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))[:200]


def drive(ctx: Context, example: Example) -> None:
    """Every event to the implementation and the reference: the same refusals, and the
    same blocks, handles and requests after each step [LIFE-2.1]."""
    reference = Lifecycle(example["num_blocks"])
    machine = ctx.adapter.lifecycle(example["num_blocks"])
    for index, event in enumerate(example["events"]):
        why: str | None = None
        try:
            reference.apply(event)
        except (LifecycleRefusal, LifecycleError) as refusal:
            why = str(refusal)

        def apply(event: Mapping[str, Any] = event) -> None:
            machine.apply(event)

        if refused(apply) != (why is not None):
            if why is not None:
                fail(f"event {index} {_event(event)} was accepted; the rules refuse it: {why}")
            fail(
                f"event {index} {_event(event)} was refused, but the rules allow it: "
                "an implementation that refuses valid traffic stalls it [LIFE-2.1]"
            )
        want, got = reference.snapshot(), machine.snapshot()
        if got != want:
            differ = [
                f"{part} {key}: {got.get(part, {}).get(key)} (want {value})"
                for part, values in want.items()
                for key, value in values.items()
                if got.get(part, {}).get(key) != value
            ]
            obligation = "LIFE-5.1" if event.get("ev") == "deadline" else "LIFE-2.1"
            fail(
                f"after event {index} {_event(event)} the state differs: "
                + "; ".join(differ[:6])
                + f" [{obligation}]"
            )


def _lifecycle_check(clause: str, slug: str, title: str, obligations: tuple[str, ...]) -> None:
    aimed = tuple(o for o in obligations if o in HAZARDS) or tuple(HAZARDS)
    check(
        clause,
        slug,
        title,
        needs=("lifecycle",),
        strategy=_histories(aimed),
        examples=_pins(aimed),
        covers=obligations,
    )(drive)


_lifecycle_check(
    "LIFE-1",
    "handles-end-once",
    "a handle is posted once, ends once, is quiesced only after failing or aborting",
    ("LIFE-1.1", "LIFE-1.2", "LIFE-1.3", "LIFE-1.4"),
)
_lifecycle_check(
    "LIFE-2",
    "block-states",
    "blocks and handles follow every event; no block taken, posted, written or freed "
    "against its state",
    ("LIFE-2.1", "LIFE-2.2", "LIFE-2.3", "LIFE-2.4", "LIFE-2.5", "LIFE-2.6"),
)
_lifecycle_check(
    "LIFE-3",
    "quiescence-before-reuse",
    "no block returns to the pool while an aborted or failed handle could write it",
    ("LIFE-3.1", "LIFE-3.2"),
)
_lifecycle_check(
    "LIFE-4",
    "nothing-after-the-end",
    "no write through a completed, aborted or quiesced handle; no send after an abort ack",
    ("LIFE-4.1", "LIFE-4.2", "LIFE-4.3"),
)
_lifecycle_check(
    "LIFE-5",
    "deadline-is-not-quiescence",
    "a passed deadline fails the handle and its request, and frees nothing",
    ("LIFE-5.1", "LIFE-5.2"),
)
_lifecycle_check(
    "LIFE-6",
    "peer-epochs",
    "posts and writes in the peer's current epoch; epochs only rise; a restart quiesces nothing",
    ("LIFE-6.1", "LIFE-6.2", "LIFE-6.3", "LIFE-6.4"),
)
_lifecycle_check(
    "LIFE-7",
    "deliver-only-whole",
    "a request is delivered only while open and when every handle completed",
    ("LIFE-7.1", "LIFE-7.2"),
)
