"""Export the golden vectors, or replay them through an implementation.

  kvspec vectors export DIR                 write DIR/manifest.json + DIR/tensors.safetensors
  kvspec vectors check DIR --impl IMPL      replay them through an adapter

The export is byte-identical on every run; docs/vectors.md documents the schema for
readers in other languages. `check` exits 1 when a vector fails, 2 when the adapter
cannot be loaded or the directory is not a vector set.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from kvspec.conformance.adapter import AdapterError, load_adapter
from kvspec.conformance.vectors import check_vectors, export_vectors

NAME = "vectors"
HELP = "export or check the language-neutral golden vectors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("export", "check"))
    parser.add_argument("directory")
    parser.add_argument("--impl", help="for check: `reference` or MODULE:ATTR")
    parser.add_argument("--seed", type=int, default=0, help="for export: generator seed (0)")
    parser.add_argument("--verbose", action="store_true", help="for check: one line per vector")


def run(args: argparse.Namespace) -> int:
    if args.action == "export":
        out = export_vectors(args.directory, seed=args.seed)
        print(f"kvspec vectors: wrote {out}/manifest.json and {out}/tensors.safetensors")
        return 0
    if not args.impl:
        print("kvspec vectors check: give --impl (`reference` or MODULE:ATTR)", file=sys.stderr)
        return 2
    try:
        adapter = load_adapter(args.impl)
        results = check_vectors(args.directory, adapter)
    except (AdapterError, ValueError, FileNotFoundError) as error:
        print(f"kvspec vectors check: {error}", file=sys.stderr)
        return 2
    by_family: dict[str, Counter[str]] = {}
    for r in results:
        by_family.setdefault(r.family, Counter())[r.verdict] += 1
        if args.verbose or r.verdict == "FAILED":
            print(f"{r.verdict:<15} {r.case_id:<28} {r.detail}")
    print(f"\n{'family':<12} {'passed':>7} {'FAILED':>7} {'not applicable':>15}")
    for family, counts in by_family.items():
        print(
            f"{family:<12} {counts['passed']:>7} {counts['FAILED']:>7} "
            f"{counts['not applicable']:>15}"
        )
    return 1 if any(r.verdict == "FAILED" for r in results) else 0
