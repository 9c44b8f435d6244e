"""Reading a file or JSON text a user hands a command, refusing rather than failing.

Every parser of user input (layout files, ``kvspec desc --check``, ``kvspec conform
--replay``, the skips file) reads through here, so for any input it returns a value or
raises :class:`InputRefused` (a ``ValueError``) with a one-line reason; the caller puts
the file's or option's name in front:

- :func:`read_regular_file` opens without blocking and refuses what is not a regular file
  (a FIFO would block the read forever, ``/dev/zero`` would never end) or is over its
  size, before reading more than that size;
- :func:`loads` refuses nesting past a depth before :func:`json.loads`, which recurses,
  sees it (a ``RecursionError`` is not a ``ValueError``), integers of more digits than a
  bound before converting them, and the non-JSON constants ``NaN`` and ``Infinity``.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any


class InputRefused(ValueError):
    """User input kvspec will not read, with why (one line, no file name)."""


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them."""
    try:
        # O_NONBLOCK: a FIFO (or a device) must not block the open; it is then refused as
        # not a regular file, unread.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise InputRefused(f"is {file_kind(mode)}, not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as handle:
                raw = handle.read(max_bytes + 1)
        finally:
            os.close(fd)
    except OSError as error:
        raise InputRefused(f"cannot be read: {error.strerror or error}") from None
    if len(raw) > max_bytes:
        raise InputRefused(f"is over {max_bytes} bytes")
    return raw


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def deeper_than(text: str, max_depth: int) -> bool:
    """Whether ``text`` nests JSON arrays and objects past ``max_depth`` (brackets inside
    strings do not count): one scan, no recursion."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loads(
    raw: bytes | str,
    *,
    max_depth: int,
    max_digits: int = 32,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The JSON value of ``raw``, or :class:`InputRefused` saying why it is not one."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise InputRefused("is not UTF-8 text") from None
    if deeper_than(text, max_depth):
        raise InputRefused(f"nests arrays or objects more than {max_depth} deep")

    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > max_digits:
            raise ValueError(
                f"the number {digits[:12]}... has {len(digits.lstrip('-'))} digits; at most "
                f"{max_digits} are read"
            )
        return int(digits)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(
            text,
            parse_int=bounded_int,
            parse_constant=no_constant,
            object_pairs_hook=object_pairs_hook,
        )
    except ValueError as error:
        raise InputRefused(f"is not JSON: {error}") from None
