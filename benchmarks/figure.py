"""One measured figure, and the timing helpers every benchmark uses.

A speed is never measured alone: :func:`compare` runs the measured code and its
baseline (usually one plain copy of the same bytes) *interleaved*, ``REPEAT`` times
each (``--repeat``, default 7), alternating which goes first, so both see the same
machine — a neighbour's load, the cache, the clock — and reports the median of each,
their min..max, and the ratio of the medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

REPEAT = 7
"""Timed runs of each side of a comparison; ``python -m benchmarks --repeat N`` sets it."""


def set_repeat(n: int) -> None:
    global REPEAT
    if n < 1:
        raise ValueError(f"--repeat must be >= 1, got {n}")
    REPEAT = n


@dataclass(frozen=True)
class Spread:
    """Seconds of repeated runs: the fastest, the median and the slowest."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, seconds: list[float]) -> Spread:
        return cls(min(seconds), statistics.median(seconds), max(seconds))


@dataclass(frozen=True)
class Figure:
    """A named measurement; speeds carry the same-run baseline and the ratio.

    ``value`` is the median (of ``REPEAT`` interleaved runs for a speed); ``ratio`` is
    baseline median time / measured median time for the same bytes (1.0 = as fast as
    the baseline, higher is faster); ``None`` when the figure is not a speed.
    ``value_range`` is the measured value's (slowest, fastest) over the runs.
    ``reference``: a figure that shows what something else costs (a floor the data
    paths stand on, a parser against ``json.loads``), never held to the data-path goal.
    """

    name: str
    unit: str
    value: float
    baseline: float | None = None
    baseline_name: str | None = None
    ratio: float | None = None
    note: str = ""
    value_range: tuple[float, float] | None = None
    repeats: int = 1
    reference: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    measured: Callable[[], object],
    baseline: Callable[[], object],
    *,
    repeat: int | None = None,
    warmup: int = 1,
) -> tuple[Spread, Spread]:
    """Run ``measured`` and ``baseline`` alternately ``repeat`` times each (who goes first
    alternates too), after ``warmup`` runs of each; their :class:`Spread` s."""
    n = REPEAT if repeat is None else repeat
    for _ in range(warmup):
        measured()
        baseline()
    mine, theirs = [], []
    for i in range(n):
        if i % 2:
            theirs.append(timed(baseline))
            mine.append(timed(measured))
        else:
            mine.append(timed(measured))
            theirs.append(timed(baseline))
    return Spread.of(mine), Spread.of(theirs)


def compare(
    name: str,
    nbytes: int,
    measured: Callable[[], object],
    baseline: Callable[[], object],
    baseline_name: str,
    note: str = "",
    *,
    repeat: int | None = None,
    reference: bool = False,
) -> Figure:
    """A throughput figure in GB/s: ``measured`` against ``baseline`` moving the same
    ``nbytes``, interleaved; the medians, the measured range, the ratio of medians.
    ``reference``: see :class:`Figure`."""
    mine, theirs = interleaved(measured, baseline, repeat=repeat)
    return Figure(
        name=name,
        unit="GB/s",
        value=nbytes / mine.median / 1e9,
        baseline=nbytes / theirs.median / 1e9,
        baseline_name=baseline_name,
        ratio=theirs.median / mine.median,
        note=note,
        value_range=(nbytes / mine.high / 1e9, nbytes / mine.low / 1e9),
        repeats=REPEAT if repeat is None else repeat,
        reference=reference,
    )


def memcpy(nbytes: int, *, device: str = "cpu") -> Callable[[], None]:
    """One plain copy of ``nbytes`` between two preallocated buffers: the usual baseline."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()

    return copy
