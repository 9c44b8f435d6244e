"""The names of kvspec's Hypothesis profiles, and which one a run uses, without Hypothesis.

:mod:`kvspec.testing.profiles` registers the profiles themselves, and importing it imports
Hypothesis; the command line only needs their names (``kvspec conform --profile``'s
choices), and ``kvspec --help`` must not pay for loading Hypothesis. Both are
re-exported from :mod:`kvspec.testing.profiles`.
"""

from __future__ import annotations

import os

PROFILES: tuple[str, ...] = ("dev", "ci", "thorough", "quick")
"""The short names users type; :func:`registered_name` gives Hypothesis's name."""


def registered_name(name: str) -> str:
    """``ci`` -> ``kvspec-ci``: the name the profile is registered under in Hypothesis."""
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {name!r}")
    return f"kvspec-{name}"


def default_profile() -> str:
    """``KVSPEC_PROFILE`` if set, else ``ci`` when ``CI`` is set, else ``dev``."""
    chosen = os.environ.get("KVSPEC_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if chosen not in PROFILES:
        raise ValueError(f"KVSPEC_PROFILE must be one of {', '.join(PROFILES)}; got {chosen!r}")
    return chosen
