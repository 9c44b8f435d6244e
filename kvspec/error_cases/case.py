"""An invalid input as data: what must be refused, by which clause, with which message.

An :class:`ErrorCase` names an operation of
:data:`~kvspec.error_cases.operations.OPERATIONS` and its arguments as plain data (so it
can be exported as a golden vector and replayed through any adapter), the clause that
refuses it, and a regular expression the reference's message must match: the offending
values are part of every pattern. Each family's cases are in its folder
(``kvspec/conformance/families/<family>/errors.py``); the golden ``errors`` vectors export
them in the order :data:`kvspec.conformance.vectors.errors.EXPORT_ORDER` declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.error_cases.operations import OPERATIONS


@dataclass(frozen=True)
class ErrorCase:
    """One invalid input: ``OPERATIONS[op](args)`` must raise ``ValueError`` matching ``match``."""

    id: str
    clause: str
    op: str
    args: dict[str, Any] = field(hash=False)
    match: str

    def run_reference(self) -> object:
        """Run the reference operation (it is expected to raise)."""
        return OPERATIONS[self.op](self.args)
