"""One measured figure, and the timing helper every benchmark uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """A named measurement; speeds carry the same-run baseline and the ratio.

    ``ratio`` is baseline time / measured time for the same bytes (1.0 = as fast as
    the baseline, higher is faster); ``None`` when the figure is not a speed.
    """

    name: str
    unit: str
    value: float
    baseline: float | None = None
    baseline_name: str | None = None
    ratio: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def best_seconds(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1) -> float:
    """The fastest of ``repeat`` wall-clock timings of ``fn()``, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def speed_figure(
    name: str,
    nbytes: int,
    seconds: float,
    baseline_seconds: float,
    baseline_name: str,
    note: str = "",
) -> Figure:
    """A throughput figure in GB/s with its baseline throughput and the time ratio."""
    return Figure(
        name=name,
        unit="GB/s",
        value=nbytes / seconds / 1e9,
        baseline=nbytes / baseline_seconds / 1e9,
        baseline_name=baseline_name,
        ratio=baseline_seconds / seconds,
        note=note,
    )


def memcpy_seconds(nbytes: int, *, device: str = "cpu", repeat: int = 5) -> float:
    """Best time of one plain copy of ``nbytes`` between two buffers: the usual baseline."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()

    return best_seconds(copy, repeat=repeat)
