"""How a check judges what an implementation did: a violation with its message and tier
(:func:`expect`, :func:`fail`), and what counts as a refusal rather than a crash
(:func:`refused`, :func:`expect_refused`, :func:`changed_values`). Every check module
states its verdicts through these, so every failure reads the same way.

The refusal contract, judged here and nowhere else: a refusal is an exception of one of
the judged adapter's declared ``refusal_types`` (``ValueError`` by default; kvspec's own
errors are ``ValueError`` too); any other exception is a crash, tier ``breaks``. Whether
the refusal's message names the offending value is judged apart from that: a refusal
that names none of them still counts as a refusal, and the check carries an ``unclear``
note saying which (:func:`noting`), never a failure. A value counts as named when it
appears as a value, not inside a clause id (``[PAGED-2]`` does not name 2)."""

from __future__ import annotations

import contextvars
import json
import math
import re
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields, is_dataclass
from typing import NoReturn

from kvspec.conformance.adapter import REFUSAL_TYPES, Adapter
from kvspec.conformance.tiers import BREAKS
from kvspec.conformance.violation import Violation


def expect(condition: bool, message: str, *, tier: str | None = None) -> None:
    """Raise :class:`Violation` with ``message`` (and ``tier``) unless ``condition`` holds."""
    if not condition:
        raise Violation(message, tier)


def fail(message: str, *, tier: str | None = None) -> NoReturn:
    """Raise :class:`Violation` with ``message`` (and ``tier``, when observed)."""
    raise Violation(message, tier)


_ADAPTER: contextvars.ContextVar[Adapter | None] = contextvars.ContextVar(
    "kvspec_conformance_adapter", default=None
)
"""The adapter the running check judges (set by the runner): its ``refusal_types``."""


@contextmanager
def judging(adapter: Adapter) -> Iterator[None]:
    """Run checks against ``adapter``: :func:`refused` and :func:`expect_refused` accept
    only its declared ``refusal_types`` as refusals."""
    token = _ADAPTER.set(adapter)
    try:
        yield
    finally:
        _ADAPTER.reset(token)


_NOTES: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "kvspec_conformance_notes", default=None
)
"""The quality notes of the running check (set by the runner), by what they are about:
one note per unclear refusal message, however many inputs it refused."""

UNCLEAR = "unclear"
"""The note a refusal gets when its message names none of the offending values."""


@contextmanager
def noting() -> Iterator[dict[str, str]]:
    """Collect the quality notes of the checks run inside: the first note about each
    thing (an unclear message), in the order found."""
    notes: dict[str, str] = {}
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


Judged = tuple[str | None, tuple[object, ...]]
"""One refusal probe as the judge saw it: (its obligation, the values it must name)."""

_JUDGED: contextvars.ContextVar[list[Judged] | None] = contextvars.ContextVar(
    "kvspec_conformance_judged", default=None
)


@contextmanager
def recording() -> Iterator[list[Judged]]:
    """Record every refusal probe judged inside (:func:`expect_refused`, :func:`refused`):
    its obligation and the offending values it was given to be named, so a test can
    walk every probe of every check and find those judged by exception type alone."""
    judged: list[Judged] = []
    token = _JUDGED.set(judged)
    try:
        yield judged
    finally:
        _JUDGED.reset(token)


def _record(obligation: str | None, values: tuple[object, ...]) -> None:
    judged = _JUDGED.get()
    if judged is not None:
        judged.append((obligation, values))


def _note(about: str, text: str) -> None:
    notes = _NOTES.get()
    if notes is not None:
        notes.setdefault(about, text)


def refusal_types(obligation: str | None = None) -> tuple[type[BaseException], ...]:
    """What counts as a refusal of ``obligation``: the one type the suite holds it to
    (:data:`~kvspec.conformance.adapter.REFUSAL_TYPES`, e.g. ``ValueError`` for
    WIRE-4.1), else the judged adapter's ``refusal_types`` (``ValueError`` without one)."""
    if obligation is not None and obligation in REFUSAL_TYPES:
        return (REFUSAL_TYPES[obligation],)
    adapter = _ADAPTER.get()
    declared = tuple(adapter.refusal_types) if adapter is not None else ()
    return declared or (ValueError,)


def crash_report(error: BaseException) -> str:
    """What was raised, for a report: type, message and the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


CLAUSE_ID = re.compile(r"(?<![\w.-])[A-Z][A-Z0-9]*-[0-9]+(?:\.[0-9]+)*(?![\w-])")
"""An obligation or clause id as a message cites it (``PAGED-2``, ``SLAYOUT-1.3``):
its digits are the rule's number, not a value the message names."""


def names_value(message: str, values: Iterable[object]) -> bool:
    """Whether ``message`` names one of ``values``: its ``repr`` or its ``str``, as a whole
    token where it begins or ends with a word character (``16`` is named by "stage 16",
    not by "160" or "16.5"); the empty string only by its repr (``''``). A clause id in
    the message (``[PAGED-2]``) names nothing."""
    message = CLAUSE_ID.sub(" ", message)
    for value in values:
        texts = {repr(value)} | ({str(value)} if str(value) else set())
        if isinstance(value, str) and not value:
            texts = {"''", '""'}
        for text in texts:
            pattern = re.escape(text)
            if text[0].isalnum() or text[0] == "_":
                pattern = r"(?<![\w.])" + pattern
            if text[-1].isalnum() or text[-1] == "_":
                pattern += r"(?!\w|\.[0-9])"
            if re.search(pattern, message):
                return True
    return False


def _refusal_problem(
    error: BaseException, obligation: str | None, naming: tuple[object, ...]
) -> str | None:
    """Why ``error`` is not a refusal (of ``obligation``), or None. A refusal whose
    message names none of ``naming`` is a refusal still, noted ``unclear``."""
    kinds = refusal_types(obligation)
    if not isinstance(error, kinds):
        declared = ", ".join(k.__name__ for k in kinds)
        raised = crash_report(error)
        return f"crashed instead of refusing: it raised {raised} (refusals: {declared})"
    if naming and not names_value(str(error), naming):
        listed = ", ".join(_brief(v, 60) for v in naming)
        cited = f" [{obligation}]" if obligation else ""
        _note(
            f"{type(error).__name__}: {error}",
            f"{UNCLEAR}: refused with {type(error).__name__} {_brief(str(error), 80)}, which "
            f"names none of the offending values ({listed}){cited}",
        )
    return None


REFUSED = object()
"""What :func:`unless_refused` gives for a call that refused."""


def unless_refused(
    call: Callable[[], object], *, obligation: str | None = None, what: str = "the input"
) -> object:
    """``call()``'s value, or :data:`REFUSED` when it refuses: for checks where refusing
    is allowed but not required (a key or a port the adapter may decline to make). A
    crash is judged as by :func:`refused`: :class:`Violation`, tier ``breaks``."""
    try:
        return call()
    except Exception as error:
        problem = _refusal_problem(error, obligation, ())
        if problem:
            cited = f" [{obligation}]" if obligation else ""
            raise Violation(f"{what} {problem}{cited}", BREAKS) from error
        return REFUSED


def refused(
    call: Callable[[], object],
    *,
    obligation: str | None = None,
    what: str = "the input",
    naming: Iterable[object] = (),
) -> bool:
    """Whether ``call()`` refuses: True when it raises one of the judged adapter's
    ``refusal_types``, False when it returns. Any other exception is not a refusal but a
    crash: :class:`Violation`, tier ``breaks``, saying what was raised. A refusal whose
    message names none of ``naming`` is noted ``unclear`` (:func:`noting`)."""
    values = tuple(naming)
    _record(obligation, values)
    try:
        call()
    except Exception as error:
        problem = _refusal_problem(error, obligation, values)
        if problem:
            cited = f" [{obligation}]" if obligation else ""
            raise Violation(f"{what} {problem}{cited}", BREAKS) from error
        return True
    return False


def changed_values(before: object, after: object) -> tuple[object, ...]:
    """The values of ``after`` that differ from ``before``'s, leaf by leaf: what a refusal
    probe made from a valid input changed, so the values its refusal should name. Dicts
    and lists of one length are compared item by item; a changed list also counts as
    itself (and, when its length changed, as its length and each of its leaves); a key
    ``before`` lacks, as each of its leaves. A value of another type is changed though it
    compares equal (``True`` for ``1``, ``1.0`` for ``1``: a probe of "not an integer")."""
    if _same(before, after):
        return ()
    if isinstance(after, dict):
        was = before if isinstance(before, dict) else {}
        found: list[object] = []
        for key, value in after.items():
            found += changed_values(was[key], value) if key in was else _leaves(value)
        return tuple(found)
    if isinstance(after, (list, tuple)):
        if isinstance(before, (list, tuple)) and len(before) == len(after):
            inner = [v for b, a in zip(before, after, strict=True) for v in changed_values(b, a)]
            return (after, *inner)
        return (after, len(after), *_leaves(after)[1:])
    return (after,)


def _same(before: object, after: object) -> bool:
    """Equal, and of one type leaf by leaf (``True == 1`` in Python, not here)."""
    if type(before) is not type(after):
        return False
    if isinstance(before, dict) and isinstance(after, dict):
        return before.keys() == after.keys() and all(_same(before[k], after[k]) for k in before)
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        return len(before) == len(after) and all(map(_same, before, after))
    return before == after


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [value, *(leaf for v in value for leaf in _leaves(v))]
    return [value]


def plain(value: object) -> object:
    """``value`` as JSON data (what a report shows): anything JSON cannot hold by repr."""
    return json.loads(json.dumps(value, default=repr))


def expect_refused(
    obligation: str,
    what: str,
    call: Callable[[], object],
    *,
    naming: Iterable[object] = (),
    accepted: object = None,
    accepted_tier: str | None = None,
) -> None:
    """Raise :class:`Violation` unless ``call()`` refuses ``what`` [``obligation``].

    A refusal is one of the judged adapter's ``refusal_types`` (the one type
    :data:`~kvspec.conformance.adapter.REFUSAL_TYPES` holds ``obligation`` to, if any);
    one whose message names none of ``naming``, the offending values, is noted
    ``unclear`` (:func:`noting`) and passes. Call sites that know the values
    pass them (key and port fields, layout names, page sizes, block ids, a marker's
    target rank, a short region, a policy name, and the values a configuration variant
    changed: :func:`changed_values`). Where a call site passes none the exception's type
    alone decides: a damaged or inconsistent tensor, message or set of shipments, chunks
    or payloads (what is "offending" is a relation between parts, not one value: RESHARD-3,
    DTYPE-3, PAYLOAD-1/3, CHUNK-1/2, WIRE-*, LAYOUT-1.3/3/4/6/7, ORACLE-4/5/6, SLAYOUT-1,
    WINDOW-2.3, a scatter's PAGED-3/4), a lifecycle event (LIFE), and an invalid
    configuration drawn whole rather than made from a valid one: no ``unclear`` note.
    Accepting ``what`` is a violation of ``obligation`` (its tier derived from it, a
    negative obligation: ``accepts-invalid``); raising anything else is tier ``breaks``
    ("crashed instead of refusing", with the exception's type, message and innermost
    frame).

    ``accepted`` is the input handed over, as data (the arguments, the configuration):
    the violation carries it, so the report shows the input that was wrongly accepted
    rather than only the valid example it was made from. ``accepted_tier`` is the tier of
    its going through where the check observed more than the obligation says (``differs``:
    a replica's identical bytes, from an engine whose replicas all write); None derives it
    from ``obligation``."""
    values = tuple(naming)
    _record(obligation, values)
    given = None if accepted is None else plain(accepted)
    try:
        got = call()
    except Exception as error:
        problem = _refusal_problem(error, obligation, values)
        if problem:
            raise Violation(f"{what} {problem} [{obligation}]", BREAKS, given) from error
        return
    shown = "" if got is None else f" (it returned {_brief(got)})"
    raise Violation(
        f"{what} was accepted{shown}; it must be refused [{obligation}]", accepted_tier, given
    )


def _brief(value: object, limit: int = 160) -> str:
    """``value`` in a line: a tensor by its dtype and shape (its values when there are a
    few), a dataclass or container by its parts — never a tensor's dump."""
    text = _shown(value, depth=0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: object, *, depth: int) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type):
        shape = [int(n) for n in value.shape]
        dtype = str(value.dtype).removeprefix("torch.")
        values = ""
        if math.prod(shape) <= 4:
            with suppress(Exception):  # some dtypes (fp8) have no Python values
                listed = value.flatten().tolist()  # type: ignore[attr-defined]  # a tensor's, or raises
                values = " [" + ", ".join(f"{v:.4g}" for v in listed) + "]"
        return f"{dtype} tensor {shape}{values}"
    if depth < 3:
        inner = depth + 1
        if is_dataclass(value) and not isinstance(value, type):
            parts = ", ".join(
                f"{f.name}={_shown(getattr(value, f.name), depth=inner)}"
                for f in fields(value)
                if f.repr
            )
            return f"{type(value).__name__}({parts})"
        if isinstance(value, dict):
            shown = [f"{k!r}: {_shown(v, depth=inner)}" for k, v in list(value.items())[:3]]
            return "{" + _joined(shown, len(value)) + "}"
        if isinstance(value, (list, tuple)):
            shown = [_shown(v, depth=inner) for v in value[:3]]
            ends = "[]" if isinstance(value, list) else "()"
            return ends[0] + _joined(shown, len(value)) + ends[1]
    return repr(value)


def _joined(shown: list[str], count: int) -> str:
    return ", ".join(shown if count <= len(shown) else [*shown, f"... {count} in all"])
