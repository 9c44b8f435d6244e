"""The conformance checks: one or more properties per clause, each over generated examples.

A :class:`Check` names the clause it verifies, the obligations of the clauses it
exercises (``covers``: ``PAYLOAD-3.2`` ...), the adapter capabilities it needs, a
Hypothesis strategy of plain-data (JSON-able) examples drawn inside the adapter's
domain, pinned examples for known bug classes, and a ``run`` that raises
:class:`Violation` with a readable message naming the obligation when the
implementation breaks it. Examples are plain data so a shrunk counterexample can be
printed and replayed as is.

Check modules (each family folder's ``checks.py`` and ``*_checks.py``,
:mod:`kvspec.conformance.families`) register themselves with :func:`check`;
:func:`all_checks` imports them all.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter, FullAdapter

Example = dict[str, Any]
E = TypeVar("E")
"""A check's own example type: what its strategy draws and its run takes (most are an
:data:`Example`; :func:`check` holds each check's two to one type)."""


class OutsideDomain(Exception):
    """The example lies outside the adapter's declared domain (:meth:`Adapter.supports`)."""


class Vacuous(Exception):
    """The example gave the check nothing to test (say, one shard has nothing to disagree
    with); it is not counted as an effective example."""


@dataclass(frozen=True)
class Context:
    """What a check runs with: the adapter, its capabilities, and the tensor device.

    ``adapter`` is typed as implementing every protocol (:class:`FullAdapter`): a check
    calls only the protocols its ``needs`` name, and the runner runs it only on an
    adapter found to implement them all."""

    adapter: FullAdapter
    device: str = "cpu"


@dataclass(frozen=True)
class Check:
    """One property of one clause."""

    clause: str
    slug: str
    title: str
    needs: tuple[str, ...]
    strategy: Callable[[Adapter], st.SearchStrategy[Any]]
    run: Callable[[Context, Any], None]
    examples: tuple[Any, ...] = field(default=())
    weight: float = 1.0
    """Fraction of the profile's ``max_examples`` this check draws (tensor checks use less)."""
    missing: Callable[[Adapter], str | None] | None = None
    """Says why the check does not apply to an adapter (beyond capabilities), or None."""
    covers: tuple[str, ...] = ()
    """The obligations (``PAYLOAD-3.2``, ...) the check exercises."""

    @property
    def id(self) -> str:
        """Stable id: ``CLAUSE/slug``, e.g. ``PLAN-2/exact-cover``."""
        return f"{self.clause}/{self.slug}"

    def matches(self, pattern: str) -> bool:
        """Whether ``pattern`` names this check: its id or a glob of ids
        (``PLAN-2/exact-cover``, ``PLAN-*``), its clause (``PLAN-2``), its family
        (``PLAN``) or an obligation it covers (``PAYLOAD-3.4``); what ``--clause`` and a
        skips file's lines take."""
        pattern = pattern.upper() if "/" not in pattern else pattern
        return (
            fnmatch.fnmatchcase(self.id, pattern)
            or self.clause == pattern
            or self.clause.split("-")[0] == pattern
            or fnmatch.fnmatchcase(self.clause, pattern)
            or pattern in self.covers
        )


_REGISTRY: dict[str, Check] = {}
_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def check(
    clause: str,
    slug: str,
    title: str,
    *,
    needs: tuple[str, ...],
    strategy: Callable[[Adapter], st.SearchStrategy[E]],
    examples: tuple[Any, ...] = (),  # not E: a literal's own inferred type would pin E
    weight: float = 1.0,
    missing: Callable[[Adapter], str | None] | None = None,
    covers: tuple[str, ...],
) -> Callable[[Callable[[Context, E], None]], Callable[[Context, E], None]]:
    """Register the decorated ``run(ctx, example)`` as the check ``clause/slug``, which
    exercises the obligations ``covers``."""

    def register(run: Callable[[Context, E], None]) -> Callable[[Context, E], None]:
        if not _SLUG.match(slug):
            raise ValueError(f"check slug must be lower-case words joined by '-', got {slug!r}")
        if not covers:
            raise ValueError(f"check {clause}/{slug} must name the obligations it covers")
        made = Check(
            clause, slug, title, needs, strategy, run, examples, weight, missing, tuple(covers)
        )
        if made.id in _REGISTRY:
            raise RuntimeError(f"check {made.id} is registered twice")
        _REGISTRY[made.id] = made
        return run

    return register


def all_checks() -> list[Check]:
    """Every registered check, in clause-table order."""
    from kvspec.conformance.families import modules
    from kvspec.core.clauses import all_clauses

    for name in modules("checks"):
        importlib.import_module(name)
    from kvspec.core.clauses import all_obligations

    order = {cid: i for i, cid in enumerate(all_clauses())}
    unknown = sorted(c.id for c in _REGISTRY.values() if c.clause not in order)
    if unknown:
        raise RuntimeError(f"checks name clauses that do not exist: {unknown}")
    obligations = all_obligations()
    strays = sorted(
        f"{c.id}: {o}" for c in _REGISTRY.values() for o in c.covers if o not in obligations
    )
    if strays:
        raise RuntimeError(f"checks cover obligations that do not exist: {strays}")
    return sorted(_REGISTRY.values(), key=lambda c: (order[c.clause], c.slug))


def vacuous() -> NoReturn:
    """End the example: it gave the check nothing to test (see :class:`Vacuous`)."""
    raise Vacuous


def within_domain(ctx: Context, case: Any) -> None:
    """Raise :class:`OutsideDomain` when ``case`` lies outside the adapter's declared domain
    (a pinned example may) or its :meth:`~kvspec.conformance.adapter.Adapter.supports`."""
    why = ctx.adapter.domain.outside(case)
    if why:
        raise OutsideDomain(why)
    if not ctx.adapter.supports(case):
        raise OutsideDomain("the adapter's supports() refuses it")
