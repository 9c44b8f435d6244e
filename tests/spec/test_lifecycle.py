"""The lifecycle rules' reference machine and trace checker [LIFE-1..7]."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.conformance.families.lifecycle.checks import HAZARDS, history
from kvspec.lifecycle.machine import (
    BLOCK_STATES,
    CLAUSES,
    EVENTS,
    Lifecycle,
    LifecycleError,
    LifecycleRefusal,
)
from kvspec.lifecycle.trace import check_trace


@st.composite
def histories(draw: st.DrawFn) -> dict:
    hazards = draw(st.lists(st.sampled_from(sorted(HAZARDS)), max_size=3))
    return history(hazards, lambda n: draw(st.integers(0, max(0, n - 1))), draw(st.integers(0, 25)))


def _state(machine: Lifecycle) -> tuple:
    return (
        machine.snapshot(),
        copy.deepcopy(machine.epochs),
        sorted(machine.acked),
        {h: sorted(v.blocks) for h, v in machine.handles.items()},
    )


@given(histories())
def test_a_refused_event_changes_nothing_and_the_pool_stays_consistent(example: dict) -> None:
    machine = Lifecycle(example["num_blocks"])
    for event in example["events"]:
        before = _state(machine)
        try:
            machine.apply(event)
        except LifecycleRefusal as refusal:
            assert _state(machine) == before, f"{event} was refused but changed the state"
            assert refusal.obligation.startswith("LIFE-")
            continue
        for block, state in enumerate(machine.blocks):
            assert state in BLOCK_STATES
            assert (machine.owner[block] is None) == (state == "free"), (block, state)
            if state == "free":
                assert not machine.writers(block), f"block {block} free with writers [LIFE-3]"


@given(histories())
def test_the_trace_checker_names_the_first_forbidden_event(example: dict) -> None:
    machine, first = Lifecycle(example["num_blocks"]), None
    accepted = []
    for index, event in enumerate(example["events"]):
        try:
            machine.apply(event)
            accepted.append(event)
        except LifecycleRefusal as refusal:
            if first is None:
                first = (index, refusal.obligation)
    verdict = check_trace(example["events"], num_blocks=example["num_blocks"])
    if first is None:
        assert verdict.ok, verdict.describe()
    else:
        assert (verdict.index, verdict.obligation) == first
    assert check_trace(accepted, num_blocks=example["num_blocks"]).ok


@given(histories())
def test_recorded_refusals_are_judged_too(example: dict) -> None:
    """A trace may record what it refused; refusing a valid event is a violation."""
    machine, trace = Lifecycle(example["num_blocks"]), []
    for event in example["events"]:
        try:
            machine.apply(event)
            trace.append(event)
        except LifecycleRefusal:
            trace.append({"ev": "refused", "event": event})
    assert check_trace(trace, num_blocks=example["num_blocks"]).ok
    valid = [i for i, e in enumerate(trace) if e.get("ev") != "refused"]
    if valid:
        i = valid[-1]
        wrong = [*trace[:i], {"ev": "refused", "event": trace[i]}, *trace[i + 1 :]]
        verdict = check_trace(wrong, num_blocks=example["num_blocks"])
        assert not verdict.ok and "which the rules allow" in verdict.message


@pytest.mark.parametrize("obligation", sorted(HAZARDS))
def test_each_hazard_is_refused_for_its_reason(obligation: str) -> None:
    """The pinned hazard of every obligation ends in a refusal that names it (or, for
    the positive LIFE-5.1, a state in which the request has failed)."""
    example = history([obligation], lambda n: 0, 0)
    verdict = check_trace(example["events"], num_blocks=example["num_blocks"])
    if obligation == "LIFE-5.1":
        assert verdict.machine is not None
        assert "failed" in verdict.machine.snapshot()["requests"].values()
        return
    assert verdict.obligation == obligation, verdict.describe()


def test_the_late_write_race_is_caught() -> None:
    """vLLM #56104 in six events: an aborted transfer's blocks reused, then it writes."""
    trace = [
        {"ev": "alloc", "request": "a", "blocks": [0, 1]},
        {"ev": "post", "handle": "h", "request": "a", "peer": "p", "epoch": 0, "blocks": [0, 1]},
        {"ev": "abort", "request": "a"},
        {"ev": "release", "request": "a"},
        {"ev": "free", "blocks": [0, 1]},
        {"ev": "alloc", "request": "b", "blocks": [0, 1]},
    ]
    verdict = check_trace(trace, num_blocks=2)
    assert (verdict.index, verdict.obligation) == (4, "LIFE-3.1")
    assert "h aborted" in verdict.message
    safe = [*trace[:4], {"ev": "quiesce", "handle": "h"}, *trace[4:]]
    assert check_trace(safe, num_blocks=2).ok


def test_every_obligation_has_a_hazard_or_is_positive() -> None:
    obligations = {o.id: o for c in CLAUSES for o in c.obligations}
    assert {o for o, v in obligations.items() if v.kind == "negative"} <= set(HAZARDS)


@pytest.mark.parametrize(
    "event",
    [
        None,
        [],
        {"ev": "explode"},
        {"ev": "alloc", "request": "a"},
        {"ev": "alloc", "request": "", "blocks": [0]},
        {"ev": "alloc", "request": "a", "blocks": [99]},
        {"ev": "alloc", "request": "a", "blocks": [0, 0]},
        {"ev": "alloc", "request": "a", "blocks": [True]},
        {"ev": "alloc", "request": ["deep"], "blocks": [0]},
        {"ev": "peer_up", "peer": "p", "epoch": -1},
        {"ev": "peer_up", "peer": "p", "epoch": 10**30},
    ],
)
def test_malformed_events_are_refused_as_errors(event) -> None:
    with pytest.raises(LifecycleError):
        Lifecycle(4).apply(event)


def test_every_event_kind_is_known_to_the_machine() -> None:
    assert all(hasattr(Lifecycle, f"_on_{kind}") for kind in EVENTS)
