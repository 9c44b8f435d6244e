"""The skips file: the checks an implementation under test chooses not to run, with reasons.

The file belongs to the implementation, not to the suite. One entry per line::

    # comment
    PLAN-4/*            we choose replicas by load, not by a named policy
    SLICE-2/modes-agree receiver-side slicing is not implemented yet

The first word is a glob over check ids (``CLAUSE/slug``); the rest is the reason,
which is required. Entries that match no check are reported so they can be removed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from kvspec.conformance.checks import Check


@dataclass(frozen=True)
class SkipEntry:
    pattern: str
    reason: str
    line: int


def read_skips(path: str | Path) -> list[SkipEntry]:
    """Parse a skips file; a line without a reason is an error naming the line."""
    entries = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pattern, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{path}:{number}: {pattern!r} needs a reason after the pattern")
        entries.append(SkipEntry(pattern, reason.strip(), number))
    return entries


def resolve_skips(
    entries: list[SkipEntry], checks: list[Check]
) -> tuple[dict[str, str], list[SkipEntry]]:
    """(check id -> reason, entries that matched no check)."""
    skipped: dict[str, str] = {}
    unused = []
    for entry in entries:
        hits = [c.id for c in checks if fnmatch.fnmatchcase(c.id, entry.pattern)]
        if not hits:
            unused.append(entry)
        for check_id in hits:
            skipped.setdefault(check_id, entry.reason)
    return skipped, unused
