"""Nearby valid configurations: what a refused command line would be accepted as, one change
away.

Every public error says what would be valid. For a command line, that is a short list of
alternatives, each changing one knob (a TP size, the head count, a token rule) to the
closest values the command's own validator accepts — so a hint is never a guess: it was
checked exactly as the command would check it. ``kvspec plan`` and ``python -m sim run``
ask with their own knobs and validators; the search is this module's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

Validate = Callable[[argparse.Namespace], object]
"""Raises ``ValueError`` for a namespace the command refuses; anything else is accepted."""


@dataclass(frozen=True)
class Knob:
    """One thing a hint may change: the namespace attribute ``name``, the ``values`` to try
    (the current value is never tried), their ``distance`` from it (closest first; by
    default ``(abs(value - current), value)``) and the ``hint`` line for the valid values
    found, closest first."""

    name: str
    values: Iterable[Any]
    hint: Callable[[list[Any]], str]
    distance: Callable[[Any], Any] | None = None


def closest_valid(
    args: argparse.Namespace, validate: Validate, knob: Knob, *, count: int = 3
) -> list[Any]:
    """Up to ``count`` values of ``knob``, closest first, that ``validate`` accepts with only
    that attribute of ``args`` changed."""
    current = getattr(args, knob.name)
    distance = knob.distance or (lambda value: (abs(value - current), value))
    found: list[Any] = []
    for value in sorted((v for v in knob.values if v != current), key=distance):
        try:
            validate(argparse.Namespace(**{**vars(args), knob.name: value}))
        except ValueError:
            continue
        found.append(value)
        if len(found) == count:
            break
    return found


def nearby(
    args: argparse.Namespace, validate: Validate, knobs: Sequence[Knob], *, count: int = 3
) -> list[str]:
    """One hint per knob that has valid values near its current one, in ``knobs`` order."""
    hints = []
    for knob in knobs:
        found = closest_valid(args, validate, knob, count=count)
        if found:
            hints.append(knob.hint(found))
    return hints


def either(values: Iterable[Any]) -> str:
    """``1 or 2 or 4``: the values a hint offers."""
    return " or ".join(map(str, values))


def flag_hint(flag: str) -> Callable[[list[Any]], str]:
    """The hint of a knob that is one flag: ``--source-cp 1 or 2``."""
    return lambda found: f"{flag} {either(found)}"


def print_hints(hints: Sequence[str], stream: TextIO) -> None:
    """Under a refusal: ``nearby valid configurations:``, one hint a line (nothing if none)."""
    if hints:
        print("nearby valid configurations:", file=stream)
        for hint in hints:
            print(f"  {hint}", file=stream)
