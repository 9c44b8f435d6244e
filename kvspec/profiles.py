"""Hypothesis profiles for kvspec's tests and conformance suite, registered in one place.

- ``dev``: the default; quick, randomized.
- ``ci``: derandomized, no deadline, chosen automatically when ``CI`` is set.
- ``thorough``: many more examples, for a slow, deep run.

Choose one with ``KVSPEC_PROFILE=thorough`` (or pytest's ``--hypothesis-profile``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES: tuple[str, ...] = ("dev", "ci", "thorough")

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=_SUPPRESSED)
settings.register_profile(
    "ci",
    max_examples=50,
    derandomize=True,
    deadline=None,
    print_blob=False,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=_SUPPRESSED
)


def default_profile() -> str:
    """``KVSPEC_PROFILE`` if set, else ``ci`` when ``CI`` is set, else ``dev``."""
    chosen = os.environ.get("KVSPEC_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if chosen not in PROFILES:
        raise ValueError(f"KVSPEC_PROFILE must be one of {', '.join(PROFILES)}; got {chosen!r}")
    return chosen


def load_profile(name: str | None = None) -> str:
    """Load profile ``name`` (default: :func:`default_profile`) and return its name."""
    chosen = name or default_profile()
    if chosen not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {chosen!r}")
    settings.load_profile(chosen)
    return chosen
