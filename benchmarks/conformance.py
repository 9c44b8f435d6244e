"""Wall time of the whole conformance suite against the reference under the `ci` profile."""

from __future__ import annotations

import time

from benchmarks.figure import Figure
from kvspec.conformance import load_adapter, run_suite


def run(quick: bool) -> list[Figure]:
    started = time.perf_counter()
    report = run_suite(load_adapter("reference"), profile="ci")
    seconds = time.perf_counter() - started
    status = "all passed" if not report.failed else f"{report.count('FAILED')} FAILED"
    return [
        Figure(
            name=f"conformance suite, reference, ci ({len(report.results)} checks)",
            unit="s",
            value=seconds,
            note=status,
        )
    ]
