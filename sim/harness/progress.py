"""A live progress line on stderr: a bar on a terminal, a line every 10% elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from kvspec.console.units import human_bytes
from sim.books.report import human_rate


class ProgressBar:
    def __init__(self, total: int, *, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = max(1, total)
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.width = width
        self.started = time.monotonic()
        self.last_tenth = -1

    def update(self, verified: int, failed: int, total: int, moved: float) -> None:
        done = verified + failed
        elapsed = max(1e-9, time.monotonic() - self.started)
        line = (
            f"{done}/{total} requests ({verified} verified, {failed} failed), "
            f"{human_bytes(int(moved))} moved, {human_rate(moved / elapsed)}"
        )
        if self.tty:
            filled = self.width * done // self.total
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] {line}")
            self.stream.flush()
        else:
            tenth = 10 * done // self.total
            if tenth != self.last_tenth:
                self.last_tenth = tenth
                self.stream.write(f"progress: {line}\n")
                self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
