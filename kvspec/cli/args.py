"""Command-line parsing the way every kvspec and sim command does it.

A bad value is refused up front with exit status 2 and one line naming the option,
the value (at most a short prefix of it) and what would be valid; sizes have upper
bounds, so no option can ask for more than a machine can give.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
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


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``PROG: refused: WHY (see --help)``."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: refused: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high``."""

    def parse(text: str) -> int:
        try:
            if len(text) > 20:
                raise ValueError
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {low}..{high}, got {quote(text)}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def seconds_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds in ``(low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {quote(text)}"
            ) from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"must be in ({low:g}, {high:g}] seconds, got {text}")
        return value

    parse.__name__ = "seconds"
    return parse
