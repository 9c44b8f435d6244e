"""The consequence tiers' names, ``--fail-on``'s parsing and its defaults (stdlib only).

:mod:`kvspec.conformance.tiers` derives a failure's tier and re-exports these; the
command line only needs the names (``kvspec conform --fail-on``), and an argument error
must not pay for loading torch (the ``kvspec.conformance`` package imports it). See
:mod:`kvspec.conformance.tiers` for what each tier means.
"""

from __future__ import annotations

CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS = "corrupts", "breaks", "accepts-invalid", "differs"
TIERS: tuple[str, ...] = (CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS)
"""The consequence tiers, most severe first."""


def severity(tier: str | None) -> int:
    """Sort key: 0 for the most severe tier; unknown or None last."""
    return TIERS.index(tier) if tier in TIERS else len(TIERS)


def parse_tiers(text: str) -> tuple[str, ...]:
    """``--fail-on``'s value: a comma list of tiers or ``all``; an unknown tier is refused
    with ValueError naming it and the valid ones."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return TIERS
    unknown = [n for n in names if n not in TIERS]
    if unknown or not names:
        raise ValueError(
            f"unknown tier(s) {', '.join(map(repr, unknown)) or repr(text)}; "
            f"give a comma list of {', '.join(TIERS)}, or all"
        )
    return tuple(t for t in TIERS if t in names)


def default_fail_on(impl: str) -> tuple[str, ...]:
    """Which tiers fail the exit status by default: every tier for ``reference`` (kvspec
    holds itself to all of it), ``corrupts`` and ``breaks`` for any other adapter (an
    engine's hardening notes and legitimate differences do not fail its build)."""
    return TIERS if impl == "reference" else (CORRUPTS, BREAKS)
