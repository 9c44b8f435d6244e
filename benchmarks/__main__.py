"""Run every benchmark and print one table.

python -m benchmarks            full sizes
python -m benchmarks --quick    small sizes, under two minutes
python -m benchmarks --json PATH --only reshard
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time

import torch

from benchmarks.figure import Figure

BENCHMARKS: tuple[str, ...] = (
    "benchmarks.reshard",
    "benchmarks.layouts",
    "benchmarks.descriptors",
    "benchmarks.codec",
    "benchmarks.conformance",
    "benchmarks.sim",
)
"""Benchmark modules, in the order they run; each has ``run(quick) -> list[Figure]``."""


def render(figures: list[Figure]) -> str:
    header = f"{'figure':<46} {'value':>12} {'unit':<6} {'baseline':>12}  {'ratio':>6}  note"
    lines = [header, "-" * len(header)]
    for f in figures:
        baseline = "" if f.baseline is None else f"{f.baseline:12.3f}"
        ratio = "" if f.ratio is None else f"{f.ratio:6.2f}"
        lines.append(
            f"{f.name:<46} {f.value:12.3f} {f.unit:<6} {baseline:>12}  {ratio:>6}  "
            f"{f.baseline_name or ''} {f.note}".rstrip()
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (under two minutes)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="run only benchmarks whose module name contains NAME",
    )
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or any(o in b for o in args.only)]
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        figures.extend(importlib.import_module(name).run(args.quick))
    print(render(figures))
    elapsed = time.perf_counter() - started
    print(
        f"\n{len(figures)} figures in {elapsed:.1f} s; torch {torch.__version__}, "
        f"{platform.machine()}, {torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"quick": args.quick, "figures": [f.to_dict() for f in figures]}, out, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
