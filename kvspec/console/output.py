"""``--json PATH``: the one meaning every kvspec and sim command gives it.

``--json PATH`` writes the command's result as JSON to ``PATH``; ``--json -`` writes
it to standard output instead of the human-readable text. A path that cannot be
written is refused before any work starts, so a long run never ends in a failed
write.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

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


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path``, or to standard output for ``-``."""
    text = json.dumps(data, indent=2) + "\n"
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    Path(path).write_text(text)
