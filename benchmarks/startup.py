"""CLI start-up: what a `kvspec` command costs before it does anything (issue 27).

Every command that moves no tensors starts without torch: `kvspec --help`, `--version`,
`clauses`, `plan`. Each runs as a fresh process, interleaved with the floor a Python CLI
stands on (`python -c pass`, the same interpreter) and with what importing torch alone
costs; the ratio is floor time / command time (1.0: nothing beyond starting Python).
Start-up is not a data path, so none of these is held to the data-path goal.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from benchmarks import figure
from benchmarks.figure import Figure, interleaved

COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kvspec --help", ("--help",)),
    ("kvspec --version", ("--version",)),
    ("kvspec clauses", ("clauses",)),
    (
        "kvspec plan (TP8 -> TP2, 4 heads)",
        ("plan", "--source-tp", "8", "--target-tp", "2", "--kv-heads", "4"),
    ),
)


def _process(*args: str) -> Callable[[], None]:
    """Run ``python ARGS`` to completion, its output discarded; a failure is raised."""

    def run() -> None:
        subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)

    return run


def _cli(*args: str) -> Callable[[], None]:
    return _process("-c", "import sys; from kvspec.cli import main; sys.exit(main())", *args)


def _figure(
    name: str,
    measured: Callable[[], None],
    floor: Callable[[], None],
    note: str,
) -> Figure:
    mine, theirs = interleaved(measured, floor)
    return Figure(
        name=name,
        unit="s",
        value=mine.median,
        baseline=theirs.median,
        baseline_name="python -c pass",
        ratio=theirs.median / mine.median,
        note=note,
        value_range=(mine.low, mine.high),
        repeats=figure.REPEAT,
        reference=True,
    )


def run(quick: bool) -> list[Figure]:
    floor = _process("-c", "pass")
    figures = [
        _figure(f"start-up: {name}", _cli(*args), floor, "a fresh process, torch never imported")
        for name, args in (COMMANDS[:2] if quick else COMMANDS)
    ]
    figures.append(
        _figure(
            "start-up: import torch (what the CLI avoids)",
            _process("-c", "import torch"),
            floor,
            "the cost a command that moves no tensors no longer pays",
        )
    )
    return figures
