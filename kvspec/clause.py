"""Clauses: the numbered rules of the spec.

Every rule kvspec states is a :class:`Clause` with a stable id such as ``HEAD-2``.
Each spec module declares the clauses it implements in a module-level ``CLAUSES``
tuple, next to the code that implements them, and cites the ids in its docstrings.
:mod:`kvspec.clauses` collects them into the one registry from which the clause
table in ``docs/clauses.md`` is generated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = re.compile(r"^[A-Z]+-[0-9]+$")


@dataclass(frozen=True)
class Clause:
    """One rule: a stable id (``FAMILY-N``), a short title and the normative text."""

    id: str
    title: str
    text: str

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"clause id must look like 'FAMILY-N', got {self.id!r}")
        if not self.title or not self.text:
            raise ValueError(f"clause {self.id} needs a title and a text")

    @property
    def family(self) -> str:
        """The family prefix of the id: ``HEAD`` for ``HEAD-2``."""
        return self.id.split("-", 1)[0]

    @property
    def number(self) -> int:
        return int(self.id.split("-", 1)[1])
