"""The conformance checks: one or more properties per clause, each over generated examples.

A :class:`Check` names the clause it verifies, the adapter capabilities it needs, a
Hypothesis strategy of plain-data (JSON-able) examples, pinned examples for known
bug classes, and a ``run`` that raises :class:`Violation` with a readable message
when the implementation breaks the rule. Examples are plain data so a shrunk
counterexample can be printed and replayed as is.

Check modules register themselves with :func:`check`; :func:`all_checks` imports
them all.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter

Example = dict[str, Any]

CHECK_MODULES: tuple[str, ...] = (
    "kvspec.conformance.checks.ownership",
    "kvspec.conformance.checks.routing",
    "kvspec.conformance.checks.rejection",
    "kvspec.conformance.checks.transfer",
    "kvspec.conformance.checks.layouts",
    "kvspec.conformance.checks.paged",
    "kvspec.conformance.checks.naming",
    "kvspec.conformance.checks.payloads",
)


class Violation(AssertionError):
    """The implementation broke the clause; the message says how, with the values."""


class OutsideDomain(Exception):
    """The example lies outside the adapter's declared domain (:meth:`Adapter.supports`)."""


@dataclass(frozen=True)
class Context:
    """What a check runs with: the adapter, its capabilities, and the tensor device."""

    adapter: Adapter
    device: str = "cpu"


@dataclass(frozen=True)
class Check:
    """One property of one clause."""

    clause: str
    slug: str
    title: str
    needs: tuple[str, ...]
    strategy: Callable[[Adapter], st.SearchStrategy[Example]]
    run: Callable[[Context, Example], None]
    examples: tuple[Example, ...] = field(default=())
    weight: float = 1.0
    """Fraction of the profile's ``max_examples`` this check draws (tensor checks use less)."""
    missing: Callable[[Adapter], str | None] | None = None
    """Says why the check does not apply to an adapter (beyond capabilities), or None."""

    @property
    def id(self) -> str:
        """Stable id: ``CLAUSE/slug``, e.g. ``PLAN-2/exact-cover``."""
        return f"{self.clause}/{self.slug}"


_REGISTRY: dict[str, Check] = {}
_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def check(
    clause: str,
    slug: str,
    title: str,
    *,
    needs: tuple[str, ...],
    strategy: Callable[[Adapter], st.SearchStrategy[Example]],
    examples: tuple[Example, ...] = (),
    weight: float = 1.0,
    missing: Callable[[Adapter], str | None] | None = None,
) -> Callable[[Callable[[Context, Example], None]], Callable[[Context, Example], None]]:
    """Register the decorated ``run(ctx, example)`` as the check ``clause/slug``."""

    def register(run: Callable[[Context, Example], None]) -> Callable[[Context, Example], None]:
        if not _SLUG.match(slug):
            raise ValueError(f"check slug must be lower-case words joined by '-', got {slug!r}")
        made = Check(clause, slug, title, needs, strategy, run, examples, weight, missing)
        if made.id in _REGISTRY:
            raise RuntimeError(f"check {made.id} is registered twice")
        _REGISTRY[made.id] = made
        return run

    return register


def all_checks() -> list[Check]:
    """Every registered check, in clause-table order."""
    from kvspec.clauses import all_clauses

    for name in CHECK_MODULES:
        importlib.import_module(name)
    order = {cid: i for i, cid in enumerate(all_clauses())}
    unknown = sorted(c.id for c in _REGISTRY.values() if c.clause not in order)
    if unknown:
        raise RuntimeError(f"checks name clauses that do not exist: {unknown}")
    return sorted(_REGISTRY.values(), key=lambda c: (order[c.clause], c.slug))


def expect(condition: bool, message: str) -> None:
    """Raise :class:`Violation` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Violation(message)


def fail(message: str) -> NoReturn:
    """Raise :class:`Violation` with ``message``."""
    raise Violation(message)


def within_domain(ctx: Context, case: Any) -> None:
    """Raise :class:`OutsideDomain` when the adapter declares ``case`` unsupported."""
    if not ctx.adapter.supports(case):
        raise OutsideDomain
