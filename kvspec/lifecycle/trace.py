"""Judging a recorded history: does a rank's trace of events obey every LIFE rule?

A trace is what one rank did, in order: plain event dicts as :mod:`kvspec.lifecycle.machine`
defines them. An implementation may also record what it *refused*, as
``{"ev": "refused", "event": {...}}``: the checker then confirms the refusal was due
(refusing a valid event is a violation too). :func:`check_trace` replays the trace
through the reference machine and names the first event the rules forbid.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.core.require import show
from kvspec.lifecycle.machine import Lifecycle, LifecycleError, LifecycleRefusal


@dataclass(frozen=True)
class TraceVerdict:
    """The verdict on one trace: ``ok``, or the first violation with where and why."""

    events: int
    index: int | None = None
    event: Mapping[str, Any] | None = None
    obligation: str | None = None
    message: str = ""
    machine: Lifecycle | None = None

    @property
    def ok(self) -> bool:
        return self.index is None

    def describe(self) -> str:
        if self.ok:
            return f"{self.events} events, every LIFE rule kept"
        shown = json.dumps(dict(self.event or {}), default=str, separators=(",", ":"))
        return f"event {self.index} {shown[:200]}: {self.message}"


def check_trace(events: Iterable[Mapping[str, Any]], *, num_blocks: int) -> TraceVerdict:
    """Replay ``events`` through the reference machine; the first violation, or ok."""
    machine = Lifecycle(num_blocks)
    count = 0
    for index, event in enumerate(events):
        count += 1
        if isinstance(event, Mapping) and event.get("ev") == "refused":
            attempted = event.get("event")
            try:
                machine.apply(attempted)  # type: ignore[arg-type]  # any value: apply refuses a non-event
            except (LifecycleRefusal, LifecycleError):
                continue  # rightly refused
            return TraceVerdict(
                count,
                index,
                event,
                "LIFE-2.1",
                f"refused {show(attempted, 120)}, which the rules allow",
                machine,
            )
        try:
            machine.apply(event)
        except LifecycleRefusal as refusal:
            return TraceVerdict(count, index, event, refusal.obligation, str(refusal), machine)
        except LifecycleError as error:
            return TraceVerdict(count, index, event, None, f"malformed event: {error}", machine)
    return TraceVerdict(count, machine=machine)
