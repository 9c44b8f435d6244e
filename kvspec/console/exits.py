"""How a command line ends when it is stopped from outside: Ctrl-C, or a reader that
closes the pipe (``kvspec conform --list | head``). Both ``kvspec`` and
``python -m sim`` end through :func:`run_to_exit`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, as a shell reports it."""

READER_GONE = 141
"""The exit status when standard output's reader went away: 128 + SIGPIPE, what a
program that does not catch the signal would end with."""


def run_to_exit(run: Callable[[], int], prog: str) -> int:
    """``run()``'s exit status, with no traceback when it is stopped from outside.

    Ctrl-C prints one line naming ``prog`` and gives :data:`INTERRUPTED`. A closed
    standard output gives :data:`READER_GONE` and prints nothing more: standard output
    is flushed before returning, so the broken pipe shows here and not at the
    interpreter's exit, and is then pointed at the null device so that exit's own
    flush is quiet. ``SystemExit`` (``--help``, a usage error) passes through.
    """
    try:
        try:
            return run()
        finally:
            sys.stdout.flush()
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return READER_GONE
