"""Run every benchmark and print one table.

python -m benchmarks            full sizes
python -m benchmarks --quick    small sizes, under two minutes
python -m benchmarks --json PATH --only reshard --repeat 11
python -m benchmarks --markdown  docs/benchmarks.md's tables, from this run

Every speed runs interleaved with its baseline (a copy of the same bytes, raw pyzmq for
the sim, the same sim runs over ZMQ for its gloo path) --repeat times each; the table
shows medians, the measured range and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time

import torch

from benchmarks.figure import Figure, set_repeat
from kvspec.console.args import int_in

BENCHMARKS: tuple[str, ...] = (
    "benchmarks.access",
    "benchmarks.reshard",
    "benchmarks.layouts",
    "benchmarks.descriptors",
    "benchmarks.codec",
    "benchmarks.conformance",
    "benchmarks.sim",
    "benchmarks.transports",
    "benchmarks.startup",
    "benchmarks.onesided",  # last: once UCX has started here, no sim may fork from this process
)
"""Benchmark modules, in the order they run; each has ``run(quick) -> list[Figure]``."""


def render(figures: list[Figure]) -> str:
    """The table: each speed's median, its range over the runs, the baseline's median in
    the same runs and the ratio of the medians."""
    header = (
        f"{'figure':<46} {'median':>10} {'min..max':>17} {'unit':<5} {'baseline':>9}  "
        f"{'ratio':>6}  note"
    )
    lines = [header, "-" * len(header)]
    for f in figures:
        spread = "" if f.value_range is None else f"{f.value_range[0]:.3g}..{f.value_range[1]:.3g}"
        baseline = "" if f.baseline is None else f"{f.baseline:9.3g}"
        ratio = "" if f.ratio is None else f"{f.ratio:6.2f}"
        lines.append(
            f"{f.name:<46} {f.value:10.4g} {spread:>17} {f.unit:<5} {baseline:>9}  {ratio:>6}  "
            f"{f.baseline_name or ''} {f.note}".rstrip()
        )
    return "\n".join(lines)


GOAL = 0.8
"""Every data-path speed's goal: this fraction of a memory copy of the same bytes (issue 18)."""


def render_markdown(figures: list[Figure]) -> str:
    """docs/benchmarks.md's tables: every figure but the layout pairs, then the pairs as a matrix.

    A speed below :data:`GOAL` of its baseline is marked, its note saying why; a
    reference figure is never marked (it is not held to the goal).
    """
    from benchmarks.layouts import is_pair, pair_matrix

    lines = [
        "| figure | median | min..max | baseline (same run) | ratio | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for f in figures:
        if is_pair(f):
            continue
        spread = "" if f.value_range is None else f"{f.value_range[0]:.3g}..{f.value_range[1]:.3g}"
        baseline = "" if f.baseline is None else f"{f.baseline:.3g} {f.unit} ({f.baseline_name})"
        ratio = ""
        if f.ratio is not None:
            below = f.unit == "GB/s" and f.ratio < GOAL and not f.reference
            ratio = f"{f.ratio:.2f}" + (" ✗" if below else "")
        lines.append(
            f"| {f.name} | {f.value:.3g} {f.unit} | {spread} | {baseline} | {ratio} | {f.note} |"
        )
    matrix = pair_matrix(figures)
    return "\n".join(lines) + ("\n\n" + matrix if matrix else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (under two minutes)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--repeat",
        type=int_in(1, 1000),
        default=7,
        metavar="N",
        help="timed runs of each side of a comparison, interleaved (7)",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print docs/benchmarks.md's tables instead"
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="run only benchmarks whose module name contains NAME",
    )
    args = parser.parse_args(argv)
    set_repeat(args.repeat)
    chosen = [b for b in BENCHMARKS if not args.only or any(o in b for o in args.only)]
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        figures.extend(importlib.import_module(name).run(args.quick))
    print(render_markdown(figures) if args.markdown else render(figures))
    elapsed = time.perf_counter() - started
    print(
        f"\n{len(figures)} figures in {elapsed:.1f} s; torch {torch.__version__}, "
        f"{platform.machine()}, {torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "quick": args.quick,
                    "repeat": args.repeat,
                    "figures": [f.to_dict() for f in figures],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
