"""Command-line parsing the way every kvspec and sim command does it.

A bad value is refused up front with exit status 2 and one line naming the option,
the value (at most a short prefix of it) and what would be valid; sizes have upper
bounds, so no option can ask for more than a machine can give.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

MAX_PARALLEL = 4096
"""The largest TP, PP, DP or replica count a command accepts."""
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 1 << 16
MAX_PORT = 65535


def quote(text: object, limit: int = 40) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters."""
    shown = str(text)
    return repr(shown) if len(shown) <= limit else repr(shown[:limit]) + f"... ({len(shown)} chars)"


def some_of(names: Sequence[str], limit: int = 10) -> str:
    """Preset ``names`` for a one-line message: all of them up to ``limit``, else the first
    ``limit`` and how many more, with the command that lists every preset."""
    if len(names) <= limit:
        return ", ".join(names)
    return (
        f"{', '.join(names[:limit])} and {len(names) - limit} more (every preset: kvspec layouts)"
    )


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``PROG: refused: WHY (see --help)``."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: refused: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def cache_layout_ref(text: str) -> str:
    """An argparse ``type``: a cache layout preset's name, or the path of a layout file
    (ending in ``.json``), read and checked here and given back absolute, so that every
    process a command starts reads the same file [LAYOUT-1, LAYOUT-5]."""
    from kvspec.memory.cache_layout import PRESETS, get_layout
    from kvspec.memory.layout_refs import is_layout_file

    if text in PRESETS:
        return text
    if not is_layout_file(text):
        close = difflib.get_close_matches(text, PRESETS, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise argparse.ArgumentTypeError(
            f"invalid choice: {quote(text)} (choose from {some_of(list(PRESETS))}, or a "
            f"layout file: a path ending in .json){hint}"
        )
    try:
        get_layout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return os.path.abspath(text)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high``."""

    def parse(text: str) -> int:
        if not _INTEGER.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"expected an integer in {low}..{high}, got {quote(text)}"
            )
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def seconds_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds in ``(low, high]``."""

    def parse(text: str) -> float:
        try:
            value = decimal(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected a number of seconds: {error}") from None
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"must be in ({low:g}, {high:g}] seconds, got {text}")
        return value

    parse.__name__ = "seconds"
    return parse


def number_in(low: float, high: float, unit: str) -> Callable[[str], float]:
    """An argparse ``type``: a finite decimal number of ``unit`` in ``low..high``."""

    def parse(text: str) -> float:
        try:
            value = decimal(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected a number of {unit}: {error}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low:g}..{high:g} {unit}, got {text}")
        return value

    parse.__name__ = unit
    return parse


_INTEGER = re.compile(r"-?[0-9]{1,20}")
"""A command line's integer: ASCII digits and an optional minus, nothing else (``int``
also takes spaces, underscores, a plus and other scripts' digits)."""
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?")


def decimal(text: str) -> float:
    """A command line's number: a plain decimal (``0.25``, ``5``, ``1e-3``), finite, and
    not so small that it reads as 0 when it was not written as 0 (``1e-400``): the value
    used is the value written. Raises ``ValueError`` naming the text otherwise."""
    if len(text) > 40 or not _DECIMAL.fullmatch(text):
        raise ValueError(f"expected a decimal number such as 0.25 or 1e-3, got {quote(text)}")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{quote(text)} is beyond the largest number ({sys.float_info.max:.3g})")
    mantissa = re.split("[eE]", text)[0]
    if value == 0 and mantissa.strip("-.0"):
        raise ValueError(f"{quote(text)} is too small to be told from 0; write 0 if 0 is meant")
    return value
