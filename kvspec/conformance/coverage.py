"""Which checks exercise each obligation, and which mutants they must kill.

Every obligation of every clause [``kvspec.core.clause.Obligation``] is covered by at least
one check (its ``covers``) and broken by at least one mutant of the corpus
(:mod:`kvspec.conformance.mutants`); ``kvspec clauses --coverage`` prints the table and
the project's tests refuse a gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.conformance.checks import all_checks
from kvspec.conformance.mutants import all_mutants
from kvspec.core.clause import Obligation
from kvspec.core.clauses import all_obligations


@dataclass(frozen=True)
class Coverage:
    """One obligation, the checks that exercise it and the mutants that break it."""

    obligation: Obligation
    checks: tuple[str, ...]
    mutants: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return bool(self.checks) and bool(self.mutants)


def coverage() -> list[Coverage]:
    """One row per obligation, in clause-table order."""
    checks: dict[str, list[str]] = {}
    for check in all_checks():
        for obligation in check.covers:
            checks.setdefault(obligation, []).append(check.id)
    mutants: dict[str, list[str]] = {}
    for mutant in all_mutants():
        for obligation in mutant.obligations:
            mutants.setdefault(obligation, []).append(mutant.name)
    return [
        Coverage(o, tuple(checks.get(oid, ())), tuple(mutants.get(oid, ())))
        for oid, o in all_obligations().items()
    ]


def gaps() -> list[Coverage]:
    """Obligations without a check or without a mutant."""
    return [row for row in coverage() if not row.complete]


def render_coverage(rows: list[Coverage] | None = None, *, verbose: bool = False) -> str:
    """The table of ``kvspec clauses --coverage``: obligation -> checks -> mutants."""
    rows = coverage() if rows is None else rows
    lines = [f"{'obligation':<13} {'kind':<4} {'checks':<44} mutants"]
    for row in rows:
        kind = "+" if row.obligation.kind == "positive" else "-"
        checks = ", ".join(row.checks) or "NO CHECK"
        mutants = ", ".join(row.mutants) or "NO MUTANT"
        lines.append(f"{row.obligation.id:<13} {kind:<4} {checks:<44} {mutants}")
        if verbose:
            lines.append(f"{'':<18} {row.obligation.text}")
    missing = [r for r in rows if not r.complete]
    all_checks = {c for r in rows for c in r.checks}
    all_mutants = {m for r in rows for m in r.mutants}
    lines += [
        "",
        f"{len(rows)} obligations, {len(all_checks)} checks, {len(all_mutants)} mutants; "
        + (
            "every obligation has a check and a mutant"
            if not missing
            else f"{len(missing)} obligation(s) lack a check or a mutant: "
            + ", ".join(r.obligation.id for r in missing)
        ),
    ]
    return "\n".join(lines)
