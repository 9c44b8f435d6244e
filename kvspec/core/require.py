"""Argument checks shared by the spec's constructors; every message names the value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INT64_MAX = (1 << 63) - 1
"""No integer the spec accepts is larger: every count, id and size fits a signed int64."""


def show(value: object, limit: int = 60) -> str:
    """A bounded description of a possibly hostile value, for error messages.

    Never a deep or long repr: containers are described by their size, strings and
    numbers are cut to ``limit`` characters, and nothing is recursed into.
    """
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of {len(value)} key(s)"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of about {value.bit_length() * 3 // 10 + 1} digits"
    if isinstance(value, str | bytes | int | float | bool | type(None)):
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return f"a {type(value).__name__}"


def require_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int = INT64_MAX
) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {show(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {show(value)}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {show(value)}")
    return value


def require_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise list the valid ones."""
    if not isinstance(value, str | int | float | bool | type(None)) or value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {valid}; got {show(value)}")
    return value


def require_rank(name: str, rank: Any, size: int) -> int:
    """Return ``rank`` if it lies in ``0..size-1``."""
    require_int(name, rank)
    if not 0 <= rank < size:
        raise ValueError(f"{name} {rank} is out of range: valid ranks are 0..{size - 1}")
    return rank
