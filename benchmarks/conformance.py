"""Wall time of the whole conformance suite against the reference under the `ci` profile,
and the suite's kill rate on the mutant corpus (each mutant through the whole suite)."""

from __future__ import annotations

import time

from benchmarks.figure import Figure
from kvspec.conformance import load_adapter, run_suite
from kvspec.conformance.mutation import run_corpus


def run(quick: bool) -> list[Figure]:
    started = time.perf_counter()
    report = run_suite(load_adapter("reference"), profile="ci")
    seconds = time.perf_counter() - started
    status = "all passed" if not report.failed else f"{report.count('FAILED')} FAILED"
    corpus = run_corpus(profile="ci")
    survivors = ", ".join(r.name for r in corpus.survivors)
    return [
        Figure(
            name=f"conformance suite, reference, ci ({len(report.results)} checks)",
            unit="s",
            value=seconds,
            note=status,
        ),
        Figure(
            name=f"mutant corpus kill rate, ci ({len(corpus.results)} mutants)",
            unit="%",
            value=100 * corpus.kill_rate,
            note=f"survivors: {survivors}" if survivors else "every mutant killed",
        ),
        Figure(
            name="mutant corpus through the suite, ci",
            unit="s",
            value=corpus.seconds,
        ),
    ]
