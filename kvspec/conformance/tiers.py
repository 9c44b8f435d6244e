"""Consequence tiers: what a failure costs the engine that has it (issue 28).

Every FAILED result carries exactly one tier, derived, never typed by hand. The tiers,
most severe first, as issue 28 defines them:

- ``corrupts``: the receiver ends with KV, scales or state that differ from the model's
  (wrong bytes, wrong place, missing, stale), with no error;
- ``breaks``: a crash, hang, or refusal of a configuration the engine accepts at start-up
  (a valid one);
- ``accepts-invalid``: an input the clause says to refuse goes through (hardening);
- ``differs``: a correct result reached by another legitimate choice (more senders of
  identical bytes, another replica, another order).

Derivation (:func:`tier_of`):

1. a :class:`~kvspec.conformance.checks.Violation` may carry an explicit tier, set by the
   check from what it observed (``differs`` where the adapter's ``replicas_write`` is
   ``"every"`` and the extra senders are replicas; ``breaks`` where a refusal probe
   crashed instead of refusing);
2. otherwise the violated obligation decides: the first ``[FAMILY-N.M]`` the message
   names (:func:`violated_obligation`): a negative obligation (:func:`~kvspec.core.clause.refuses`)
   -> ``accepts-invalid``; a positive obligation of accepting a valid input
   (:func:`~kvspec.core.clause.accepts`) -> ``breaks``; any other positive one -> ``corrupts``;
3. any other exception raised by the implementation (not a Violation) -> ``breaks``.

A message naming no known obligation falls back on the check's first covered obligation.
Pure: no adapter is run here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kvspec.conformance.violation import Violation
from kvspec.core.clause import Obligation
from kvspec.core.tier_names import (
    ACCEPTS_INVALID,
    BREAKS,
    CORRUPTS,
    DIFFERS,
    TIERS,
    default_fail_on,
    parse_tiers,
    severity,
)

__all__ = [
    "ACCEPTS_INVALID",
    "BREAKS",
    "CORRUPTS",
    "DIFFERS",
    "TIERS",
    "default_fail_on",
    "parse_tiers",
    "severity",
    "tier_of",
    "tier_of_obligation",
    "violated_obligation",
]

_CITED = re.compile(r"\[([A-Z]+-[0-9]+\.[0-9]+)")
"""An obligation cited in a message: ``[PLAN-2.2]`` or the first of ``[PLAN-2.2, ...]``."""
_ANY_ID = re.compile(r"\b([A-Z]+-[0-9]+\.[0-9]+)\b")


def violated_obligation(
    message: str, obligations: Mapping[str, Obligation], fallback: Iterable[str] = ()
) -> str | None:
    """The obligation a failure message says was violated: the first ``[FAM-N.M]`` it
    cites that exists (then any known id it names), else the first of ``fallback`` (the
    check's covered obligations) that exists; None when there is none."""
    for pattern in (_CITED, _ANY_ID):
        for found in pattern.findall(message):
            if found in obligations:
                return found
    return next((o for o in fallback if o in obligations), None)


def tier_of_obligation(obligation: Obligation | None) -> str:
    """The tier of breaking ``obligation``: negative -> accepts-invalid, accepting a valid
    input -> breaks, other positive -> corrupts (unknown: corrupts, the cautious one)."""
    if obligation is None:
        return CORRUPTS
    if obligation.kind == "negative":
        return ACCEPTS_INVALID
    return BREAKS if obligation.accepts_valid else CORRUPTS


def tier_of(
    error: BaseException,
    obligations: Mapping[str, Obligation],
    fallback: Iterable[str] = (),
) -> tuple[str, str | None]:
    """(tier, violated obligation id or None) of the failure ``error`` raised by a check."""
    if not isinstance(error, Violation):
        return BREAKS, violated_obligation("", obligations, fallback)
    obligation = violated_obligation(str(error), obligations, fallback)
    if error.tier is not None:
        return error.tier, obligation
    return tier_of_obligation(obligations.get(obligation or "")), obligation
