"""Clauses: the numbered rules of the spec, and the obligations each one imposes.

Every rule kvspec states is a :class:`Clause` with a stable id such as ``HEAD-2``.
Each spec module declares the clauses it implements in a module-level ``CLAUSES``
tuple, next to the code that implements them, and cites the ids in its docstrings.
:mod:`kvspec.core.clauses` collects them into the one registry from which the clause
table in ``docs/clauses.md`` is generated.

A clause's text is split into :class:`Obligation` s: the sentences an implementation
can violate, numbered ``HEAD-2.1``, ``HEAD-2.2``, ... in the order they are declared.
An obligation is *positive* (:func:`must`: the implementation produces or accepts
something) or *negative* (:func:`refuses`: it refuses an input just outside the
domain). A positive obligation declared with :func:`accepts` says an implementation
*accepts a valid input* (a dtype, a pair of layouts): breaking it is refusing, or crashing
on, what an engine starts with, so it is tier ``breaks`` rather than ``corrupts``
(:mod:`kvspec.conformance.tiers`). Numbers are stable: new obligations are appended, never
inserted. The conformance suite names, for every obligation, the checks that exercise it and the
one-bug implementations (mutants) those checks kill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

_ID = re.compile(r"^[A-Z]+-[0-9]+$")
_OBLIGATION_ID = re.compile(r"^([A-Z]+-[0-9]+)\.([0-9]+)$")
KINDS: tuple[str, ...] = ("positive", "negative")


@dataclass(frozen=True)
class Obligation:
    """One sentence of a clause that an implementation can violate, e.g. ``PAYLOAD-3.4``.

    ``kind`` is ``positive`` (something must be produced or accepted) or ``negative``
    (an input outside the domain must be refused).
    """

    id: str
    kind: str
    text: str
    accepts_valid: bool = False
    """A positive obligation that an implementation accepts a valid input (:func:`accepts`)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"obligation kind must be one of {KINDS}, got {self.kind!r}")
        if not self.text:
            raise ValueError("an obligation needs a text")
        if self.accepts_valid and self.kind != "positive":
            raise ValueError("only a positive obligation can be one of accepting a valid input")
        if self.id and not _OBLIGATION_ID.match(self.id):
            raise ValueError(f"obligation id must look like 'FAMILY-N.M', got {self.id!r}")

    @property
    def clause(self) -> str:
        """The id of the clause it belongs to: ``PAYLOAD-3`` for ``PAYLOAD-3.4``."""
        return self.id.rsplit(".", 1)[0]


def must(text: str) -> Obligation:
    """A positive obligation (numbered by the clause that holds it)."""
    return Obligation("", "positive", text)


def accepts(text: str) -> Obligation:
    """A positive obligation that a valid input is accepted (``text`` names it): breaking
    it refuses, or crashes on, a configuration the engine starts with (tier ``breaks``)."""
    return Obligation("", "positive", text, accepts_valid=True)


def refuses(text: str) -> Obligation:
    """A negative obligation: ``text`` names what must be refused."""
    return Obligation("", "negative", text)


@dataclass(frozen=True)
class Clause:
    """One rule: a stable id (``FAMILY-N``), a short title, the normative text and the
    obligations it splits into (numbered ``FAMILY-N.1``, ``.2``, ... here)."""

    id: str
    title: str
    text: str
    obligations: tuple[Obligation, ...] = field(default=())

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"clause id must look like 'FAMILY-N', got {self.id!r}")
        if not self.title or not self.text:
            raise ValueError(f"clause {self.id} needs a title and a text")
        numbered = tuple(replace(o, id=f"{self.id}.{i}") for i, o in enumerate(self.obligations, 1))
        object.__setattr__(self, "obligations", numbered)

    @property
    def family(self) -> str:
        """The family prefix of the id: ``HEAD`` for ``HEAD-2``."""
        return self.id.split("-", 1)[0]

    @property
    def number(self) -> int:
        return int(self.id.split("-", 1)[1])
