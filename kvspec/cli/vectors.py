"""Export the golden vectors, or replay them through an implementation.

  kvspec vectors check --impl IMPL [DIR]   replay them through an adapter (DIR: the
                                          vectors installed with kvspec)
  kvspec vectors export DIR                write DIR/manifest.json + DIR/tensors.safetensors

The export is byte-identical on every run; docs/vectors.md documents the schema for
readers in other languages. `check` exits 1 when a vector fails, 2 when the adapter
cannot be loaded or the directory is not a readable vector set.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from kvspec.console.args import int_in
from kvspec.console.output import add_json_option, write_json

NAME = "vectors"
HELP = "export or check the language-neutral golden vectors"

FAMILY_NAMES: tuple[str, ...] = (
    "ownership",
    "tokens",
    "plan",
    "errors",
    "reshard",
    "layouts",
    "paged",
    "records",
    "descriptors",
    "oracle",
    "keys",
    "ports",
    "wire",
    "groups",
    "states",
    "state-layouts",
    "cross-layer",
    "scaled",
)
"""The names of :data:`kvspec.conformance.vectors.FAMILY_NAMES`, for ``--family``'s choices:
written out, because the vectors (and so torch) are imported only by :func:`run`, and
`kvspec --help` starts without them. A test keeps the two in step."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="replay the golden vectors through an implementation",
        description=(
            "Replay every golden vector through an adapter and print, per family, how many "
            "passed, FAILED or were not applicable (a capability the adapter lacks).\n\n"
            "examples:\n  kvspec vectors check --impl reference\n"
            "  kvspec vectors check --impl my_adapter:adapter --verbose\n"
            "  kvspec vectors check --impl my_adapter:adapter --family plan --family reshard\n"
            "  kvspec vectors check ./my-vectors --impl reference --json -"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "directory",
        nargs="?",
        help="a vector set (default: the one installed with kvspec)",
    )
    check.add_argument("--impl", required=True, help="`reference` or MODULE:ATTR")
    check.add_argument(
        "--family",
        action="append",
        dest="families",
        choices=FAMILY_NAMES,
        metavar="NAME",
        help=f"replay only this family (repeatable): {', '.join(FAMILY_NAMES)}",
    )
    check.add_argument("--verbose", action="store_true", help="one line per vector")
    add_json_option(check, "the results, one object per vector")
    export = actions.add_parser(
        "export",
        help="write the golden vectors into a directory",
        description=(
            "Write DIR/manifest.json and DIR/tensors.safetensors: the same bytes on every run "
            "with the same seed.\n\nexample:\n  kvspec vectors export ./vectors"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("directory", help="where to write (created if missing)")
    export.add_argument(
        "--seed", type=int_in(0, (1 << 63) - 1), default=0, help="generator seed (0)"
    )


def run(args: argparse.Namespace) -> int:
    from kvspec.conformance.adapter import AdapterError, load_adapter
    from kvspec.conformance.vectors import GOLDEN_DIR, VectorsError, check_vectors, export_vectors

    if args.action == "export":
        try:
            out = export_vectors(args.directory, seed=args.seed)
        except OSError as error:
            print(f"kvspec vectors export: cannot write {args.directory}: {error}", file=sys.stderr)
            return 2
        print(f"kvspec vectors: wrote {out}/manifest.json and {out}/tensors.safetensors")
        return 0
    try:
        adapter = load_adapter(args.impl)
        directory = GOLDEN_DIR if args.directory is None else args.directory
        results = check_vectors(directory, adapter, args.families)
    except (AdapterError, VectorsError) as error:
        print(f"kvspec vectors check: {error}", file=sys.stderr)
        return 2
    by_family: dict[str, Counter[str]] = {}
    for r in results:
        by_family.setdefault(r.family, Counter())[r.verdict] += 1
    if args.json == "-":
        write_json(args.json, [vars(r) for r in results])
    else:
        for r in results:
            if args.verbose or r.verdict == "FAILED":
                print(f"{r.verdict:<15} {r.case_id:<28} {r.detail}")
        print(f"\n{'family':<12} {'passed':>7} {'FAILED':>7} {'not applicable':>15}")
        for family, counts in by_family.items():
            print(
                f"{family:<12} {counts['passed']:>7} {counts['FAILED']:>7} "
                f"{counts['not applicable']:>15}"
            )
        if args.json:
            write_json(args.json, [vars(r) for r in results])
    return 1 if any(r.verdict == "FAILED" for r in results) else 0
