"""Argument checks shared by the spec's constructors; every message names the value."""

from __future__ import annotations

from typing import Any


def require_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def require_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise list the valid ones."""
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {valid}; got {value!r}")
    return value


def require_rank(name: str, rank: Any, size: int) -> int:
    """Return ``rank`` if it lies in ``0..size-1``."""
    require_int(name, rank)
    if not 0 <= rank < size:
        raise ValueError(f"{name} {rank} is out of range: valid ranks are 0..{size - 1}")
    return rank
