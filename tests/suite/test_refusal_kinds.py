"""One refusal contract, judged by one piece of code (issue 43, item 1): an adapter that
refuses with each kind of exception, run through every refusal check of the suite.

The adapter is the reference with every capability wrapped so that each of its refusals
(a ``ValueError``) is raised again as another kind: the engine's own error type, declared
or not, or a ``ValueError`` whose message says nothing of what it refuses. Every refusal
check must then judge the same way: a declared type is a refusal, an undeclared one a
crash (``breaks``), a message that names no offending value an ``unclear`` note and
never a failure."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from kvspec.conformance.adapter import REFUSAL_TYPES
from kvspec.conformance.adapter.protocols import CAPABILITIES
from kvspec.conformance.checks import Check, all_checks
from kvspec.conformance.checks.expectations import UNCLEAR, names_value
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, run_check
from kvspec.core.clauses import all_obligations


class EngineConfigError(Exception):
    """An engine's own configuration error, not a ``ValueError`` (as many engines have)."""


def refusing_with(
    kind: type[Exception], message: Callable[[ValueError], str], declared: tuple[type, ...]
) -> ReferenceAdapter:
    """The reference adapter, each capability's refusals raised again as ``kind``."""

    def wrapped(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except ValueError as error:
                raise kind(message(error)) from error

        return call

    names = {m for methods in CAPABILITIES.values() for m in methods}
    body = {n: wrapped(getattr(ReferenceAdapter, n)) for n in names if hasattr(ReferenceAdapter, n)}
    cls = type(f"RefusesWith{kind.__name__}", (ReferenceAdapter,), body)
    adapter = cls()
    adapter.refusal_types = declared
    return adapter


LATER = ("LIFE",)
"""Families whose refusals come from an object a capability returns (the lifecycle
machine's own methods), not from the capability's call: the wrapper cannot reach them."""


def refusal_checks() -> list[Check]:
    """Every check of a negative obligation the adapter's declared types judge (not those
    the suite holds to one type whatever is declared: the wire decoder's ValueError)."""
    obligations = all_obligations()
    return [
        c
        for c in all_checks()
        if any(obligations[o].kind == "negative" for o in c.covers if o in obligations)
        and not set(c.covers) & set(REFUSAL_TYPES)
        and c.clause.split("-")[0] not in LATER
    ]


def run_all(adapter: ReferenceAdapter, **options: Any) -> dict[str, Any]:
    return {c.id: run_check(c, adapter, profile="quick", **options) for c in refusal_checks()}


def test_there_are_refusal_checks_of_many_families() -> None:
    families = {c.clause.split("-")[0] for c in refusal_checks()}
    assert len(refusal_checks()) >= 40 and len(families) >= 10, sorted(families)


@pytest.fixture(scope="module")
def on_the_reference() -> dict[str, Any]:
    return run_all(ReferenceAdapter())


def test_an_engine_error_type_declared_passes_every_refusal_check(
    on_the_reference: dict[str, Any],
) -> None:
    engine = refusing_with(EngineConfigError, str, (EngineConfigError,))
    results = run_all(engine)
    verdicts = {i: r.verdict for i, r in results.items()}
    assert verdicts == {i: r.verdict for i, r in on_the_reference.items()}
    assert PASSED in verdicts.values()
    assert all(r.verdict != FAILED for r in results.values()), {
        i: r.reason for i, r in results.items() if r.verdict == FAILED
    }


def test_the_same_type_undeclared_is_a_crash_in_every_refusal_check(
    on_the_reference: dict[str, Any],
) -> None:
    undeclared = refusing_with(EngineConfigError, str, (ValueError,))
    results = run_all(undeclared, shrink=False)
    ran = [i for i, r in on_the_reference.items() if r.verdict == PASSED]
    assert ran
    for check_id in ran:
        result = results[check_id]
        assert result.verdict == FAILED and result.tier == "breaks", (check_id, result.reason)
        assert "crashed instead of refusing" in result.reason
        assert "EngineConfigError" in result.reason


def test_a_message_that_names_nothing_is_an_unclear_note_never_a_failure(
    on_the_reference: dict[str, Any],
) -> None:
    vague = refusing_with(ValueError, lambda _: "bad configuration", (ValueError,))
    results = run_all(vague)
    assert {i: r.verdict for i, r in results.items()} == {
        i: r.verdict for i, r in on_the_reference.items()
    }
    noted = [i for i, r in results.items() if r.notes]
    assert len(noted) >= 10, noted  # every check that knows the offending values says so
    for check_id in noted:
        note = results[check_id].notes[0]
        assert note.startswith(f"{UNCLEAR}: refused with ValueError 'bad configuration'")
        assert "names none of the offending values" in note


def test_a_clause_tag_is_not_a_named_value() -> None:
    assert not names_value("page size not accepted [PAGED-2]", (2,))
    assert not names_value("refused [SLAYOUT-1.3, DESC-2]", (1, 3, 2))
    assert names_value("page size 2 not accepted [PAGED-2]", (2,))
    assert names_value("rank -1 is out of range [DP-1]", (-1,))
