"""How a command line ends when it is stopped from outside: Ctrl-C, a reader that
closes the pipe (``kvspec conform --list | head``), or a result that cannot be written
(a full disk). Both ``kvspec`` and ``python -m sim`` end through :func:`run_to_exit`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from kvspec.console.output import OutputFailed, on_stdout

INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, as a shell reports it."""

READER_GONE = 141
"""The exit status when standard output's reader went away: 128 + SIGPIPE, what a
program that does not catch the signal would end with."""

OUTPUT_FAILED = 74
"""The exit status when the result could not be written (a full disk, ``/dev/full``):
``EX_IOERR`` of sysexits.h. The verdict was printed before the write was tried; the
file named was left as it was, with no partial file beside it."""


def run_to_exit(run: Callable[[], int], prog: str) -> int:
    """``run()``'s exit status, with no traceback when it is stopped from outside.

    Ctrl-C prints one line naming ``prog`` and gives :data:`INTERRUPTED`. A closed
    standard output gives :data:`READER_GONE` and prints nothing more: standard output
    is flushed before returning, so the broken pipe shows here and not at the
    interpreter's exit, and is then pointed at the null device so that exit's own
    flush is quiet. A result that cannot be written (:class:`OutputFailed`, or standard
    output refusing the last flush: a full disk) prints one line and gives
    :data:`OUTPUT_FAILED`. ``SystemExit`` (``--help``, a usage error) passes through.
    """
    guarded = sys.stdout = _Guarded(sys.stdout)
    try:
        try:
            return run()
        finally:
            if sys.stdout is guarded:
                sys.stdout = guarded.stream
            _flush_stdout()
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return READER_GONE
    except OutputFailed as failed:
        if failed.where == "standard output":
            _silence_stdout()
        print(f"{prog}: {failed}", file=sys.stderr)
        return OUTPUT_FAILED


class _Guarded:
    """Standard output whose write and flush turn a failure of the stream itself (a
    full disk, ``/dev/full``) into :class:`OutputFailed`; a closed pipe stays a
    ``BrokenPipeError``. Everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return on_stdout(lambda: self.stream.write(text))

    def flush(self) -> None:
        on_stdout(self.stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _flush_stdout() -> None:
    on_stdout(sys.stdout.flush)


def _silence_stdout() -> None:
    """Point standard output at the null device, so the interpreter's own last flush of
    what is still buffered neither fails nor prints a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
