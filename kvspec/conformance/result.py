"""The verdict of one check (:class:`CheckResult`) and the verdicts a check can have: what
the runner produces, and what the report, the causes and the replay read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.conformance.checks import Check, Example

PASSED, FAILED, INCONCLUSIVE = "passed", "FAILED", "inconclusive"
NOT_PROVIDED, SKIPPED = "not provided", "skipped"
VERDICTS: tuple[str, ...] = (PASSED, FAILED, INCONCLUSIVE, NOT_PROVIDED, SKIPPED)


@dataclass
class CheckResult:
    """The verdict of one check: passed, FAILED, inconclusive, not provided or skipped."""

    check: Check
    verdict: str
    tried: int = 0
    outside_domain: int = 0
    vacuous: int = 0
    requested: int = 0
    reason: str = ""
    counterexample: Example | None = None
    seconds: float = 0.0
    tier: str | None = None
    """FAILED only: the consequence tier (:mod:`kvspec.conformance.tiers`)."""
    obligation: str | None = None
    """FAILED only: the violated obligation, when one is known."""
    reachable_in_serving: str | None = None
    """FAILED only: ``yes``, ``no`` or ``unknown`` (:func:`serving_reachability`)."""
    reachability_evidence: str = ""
    accepted_input: Any = None
    """FAILED refusal probes only: the input that was wrongly accepted (or crashed on),
    made from the counterexample (which stays what ``--replay`` takes)."""
    notes: tuple[str, ...] = ()
    """Quality notes, whatever the verdict: a refusal that named none of the offending
    values (``unclear``, :func:`~kvspec.conformance.checks.expectations.noting`)."""

    @property
    def effective(self) -> int:
        """Examples inside the adapter's domain that gave the check something to test."""
        return self.tried - self.outside_domain - self.vacuous

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check.id,
            "clause": self.check.clause,
            "obligations": list(self.check.covers),
            "title": self.check.title,
            "verdict": self.verdict,
            "examples_tried": self.tried,
            "effective_examples": self.effective,
            "examples_requested": self.requested,
            "outside_declared_domain": self.outside_domain,
            "vacuous_examples": self.vacuous,
            "reason": self.reason,
            "counterexample": self.counterexample,
            "seconds": round(self.seconds, 3),
            "tier": self.tier,
            "obligation": self.obligation,
            "reachable_in_serving": self.reachable_in_serving,
            "reachability_evidence": self.reachability_evidence,
            "accepted_input": self.accepted_input,
            "notes": list(self.notes),
        }
