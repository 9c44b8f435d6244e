"""Hypothesis profiles for kvspec's tests and conformance suite, registered in one place.

- ``dev``: the default; quick, randomized.
- ``ci``: derandomized, no deadline, chosen automatically when ``CI`` is set.
- ``thorough``: many more examples, for a slow, deep run.
- ``quick``: 25 examples, derandomized: ``make check``'s tier, a first look in seconds.

They are registered under namespaced names (``kvspec-dev``, ``kvspec-ci``,
``kvspec-thorough``) so they never shadow a profile of the same short name that a
user's own project registers. The conformance suite applies its profile to the
checks it runs, through :func:`profile_settings`; it never loads a profile
globally, so a user's own Hypothesis profile stays in force for the user's tests.
Choose one with ``KVSPEC_PROFILE=thorough`` or ``kvspec conform --profile``. The names
and the choice need no Hypothesis and live in :mod:`kvspec.core.profile_names`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from kvspec.core.profile_names import PROFILES, default_profile, registered_name

__all__ = [
    "PROFILES",
    "current_profile_name",
    "default_profile",
    "load_profile",
    "profile_settings",
    "registered_name",
]

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    registered_name("dev"), max_examples=50, deadline=None, suppress_health_check=_SUPPRESSED
)
settings.register_profile(
    registered_name("ci"),
    max_examples=50,
    derandomize=True,
    deadline=None,
    print_blob=False,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(  # ci's settings, at half its examples
    registered_name("quick"), settings.get_profile(registered_name("ci")), max_examples=25
)
settings.register_profile(
    registered_name("thorough"),
    max_examples=1000,
    deadline=None,
    suppress_health_check=_SUPPRESSED,
)


def profile_settings(name: str | None = None) -> settings:
    """The settings of profile ``name`` (default: :func:`default_profile`), to apply to one
    test without touching the globally loaded profile."""
    return settings.get_profile(registered_name(name or default_profile()))


def load_profile(name: str | None = None) -> str:
    """Load profile ``name`` (default: :func:`default_profile`) globally; return its short
    name. Only kvspec's own test suite does this; the conformance suite never does."""
    chosen = name or default_profile()
    settings.load_profile(registered_name(chosen))
    return chosen


def current_profile_name() -> str:
    """The globally loaded Hypothesis profile, by the name it was registered under."""
    return settings.get_current_profile_name()
