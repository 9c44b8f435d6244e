"""What a check raises when the implementation broke a clause: :class:`Violation`, with
the tier a check observed, if any, and the input it handed over [the runner derives the
tier from the violated obligation otherwise, :mod:`kvspec.conformance.tiers`]."""

from __future__ import annotations

from kvspec.core.tier_names import TIERS


class Violation(AssertionError):
    """The implementation broke the clause; the message says how, with the values.

    ``tier`` is set by a check only from what it observed (``differs`` for a replica's
    identical bytes sent by an engine whose replicas all write, ``breaks`` for a crash
    where a refusal was due); left None, the runner derives it from the violated
    obligation (:mod:`kvspec.conformance.tiers`)."""

    def __init__(self, message: str = "", tier: str | None = None, input: object = None) -> None:
        if tier is not None and tier not in TIERS:
            raise ValueError(f"a violation's tier must be one of {TIERS}, got {tier!r}")
        super().__init__(message)
        self.tier = tier
        self.input = input
        """The input the implementation was handed when it broke the clause, as data,
        where it is not the example itself (a refusal probe made from it), else None."""
