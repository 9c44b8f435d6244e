"""``--json PATH``: the one meaning every kvspec and sim command gives it.

``--json PATH`` writes the command's result as JSON to ``PATH``; ``--json -`` writes
it to standard output instead of the human-readable text. A path that cannot be
written is refused before any work starts, so a long run never ends in a failed
write. A file is written atomically (:func:`write_text`): the whole text reaches a
temporary file beside it, which then replaces ``PATH``, so a disk that fills up midway
leaves ``PATH`` as it was and no partial file; the failure is an :class:`OutputFailed`,
which a command line ends with as one line and :data:`~kvspec.console.exits.OUTPUT_FAILED`.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import stat
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

STDOUT = "-"


def add_json_option(parser: argparse.ArgumentParser | Any, what: str) -> None:
    """Add ``--json PATH`` to ``parser`` (or an argument group), describing ``what``."""
    parser.add_argument(
        "--json",
        metavar="PATH",
        help=f"write {what} as JSON to PATH ('-' for standard output, instead of the text)",
    )


def check_writable(path: str | None, option: str = "--json") -> None:
    """Refuse, with the reason, a ``path`` that could not be written; ``-`` and None pass."""
    if path in (None, STDOUT):
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{option} {path}: is a directory; give a file path")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{option} {path}: the file is not writable")
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot create files in {parent}")


class OutputFailed(Exception):
    """A command's result could not be written (a full disk, a lost mount, ``/dev/full``):
    where it was going and the system's reason; nothing partial was left behind."""

    def __init__(self, where: str, error: OSError) -> None:
        self.where = where
        self.error = error
        reason = error.strerror or errno.errorcode.get(error.errno or 0, str(error))
        left = "" if where == "standard output" else f"; {where} was left as it was"
        super().__init__(f"could not write {where}: {reason}{left}")


def on_stdout(call: Callable[[], T]) -> T:
    """``call()`` (a write or flush of standard output), a failure of the stream itself
    raised as :class:`OutputFailed`; a closed pipe stays a ``BrokenPipeError`` (the
    reader left: :data:`~kvspec.console.exits.READER_GONE`, not a failed write)."""
    try:
        return call()
    except BrokenPipeError:
        raise
    except OSError as error:
        raise OutputFailed("standard output", error) from error


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path``, or to standard output for ``-``."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, or to standard output for ``-``.

    A regular file (or a new one) is written whole to a temporary file in the same
    directory, synced, and renamed over ``path``; a link is followed, an existing file's
    permissions kept. A path that is not a regular file (``/dev/null``, a pipe) is
    written in place, since it cannot be replaced. Any failure raises
    :class:`OutputFailed` and removes the temporary file."""
    if path == STDOUT:
        on_stdout(lambda: sys.stdout.write(text))
        on_stdout(sys.stdout.flush)
        return
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise OutputFailed(path, error) from error
    if mode is not None and not stat.S_ISREG(mode):
        try:
            with open(target, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as error:
            raise OutputFailed(path, error) from error
        return
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            if mode is not None:
                os.chmod(temporary, stat.S_IMODE(mode))
            os.replace(temporary, target)
        except BaseException:
            with suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as error:
        raise OutputFailed(path, error) from error
