"""The skips file: the checks an implementation under test chooses not to run, with reasons.

The file belongs to the implementation, not to the suite. One entry per line::

    # comment
    PLAN-4/*            we choose replicas by load, not by a named policy
    SLICE-2/modes-agree receiver-side slicing is not implemented yet

The first word names checks as ``--clause`` does (:meth:`~kvspec.conformance.checks.
Check.matches`): a check id or a glob of ids, a clause (``PLAN-4``), a family or an
obligation. The rest of the line, after spaces or tabs (and a colon, if you like), is
the reason, which is required. Entries that match no check of the suite are reported so
they can be removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvspec.conformance.checks import Check
from kvspec.core.untrusted_input import InputRefused, read_regular_file

MAX_SKIPS_BYTES = 1 << 20
"""A skips file is a few lines; one past a mebibyte is refused unread."""


@dataclass(frozen=True)
class SkipEntry:
    pattern: str
    reason: str
    line: int


def read_skips(path: str | Path) -> list[SkipEntry]:
    """Parse a skips file. A file that cannot be read (not a regular file, over
    :data:`MAX_SKIPS_BYTES`, not UTF-8), or a line without a reason, is a ValueError naming
    the file (and the line)."""
    try:
        text = read_regular_file(path, MAX_SKIPS_BYTES).decode("utf-8")
    except InputRefused as refusal:
        raise ValueError(f"the skips file {str(path)!r} {refusal}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the skips file {str(path)!r} is not UTF-8 text") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pattern, *rest = line.split(None, 1)
        pattern = pattern.removesuffix(":")  # "PLAN-3/inverse: reason" reads naturally too
        if not rest:
            raise ValueError(f"{path}:{number}: {pattern!r} needs a reason after the pattern")
        entries.append(SkipEntry(pattern, rest[0].strip(), number))
    return entries


def resolve_skips(
    entries: list[SkipEntry], checks: list[Check]
) -> tuple[dict[str, str], list[SkipEntry]]:
    """(check id -> reason, entries that matched no check)."""
    skipped: dict[str, str] = {}
    unused = []
    for entry in entries:
        hits = [c.id for c in checks if c.matches(entry.pattern)]
        if not hits:
            unused.append(entry)
        for check_id in hits:
            skipped.setdefault(check_id, entry.reason)
    return skipped, unused
