"""Moved to :mod:`kvspec.core.errors` (the stdlib-only core); this name keeps working, with
a :class:`DeprecationWarning`, so that code written against it runs unchanged."""

from __future__ import annotations

import warnings

from kvspec.core.errors import FormError, InputError

__all__ = ["FormError", "InputError"]

warnings.warn(
    "kvspec.errors moved to kvspec.core.errors; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
