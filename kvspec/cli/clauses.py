"""List the clauses of the spec, their obligations, and what exercises each obligation.

kvspec clauses                 id and title of every clause
kvspec clauses HEAD            only ids starting with HEAD
kvspec clauses --text          with each clause's full text and its obligations
kvspec clauses --markdown      the table of docs/clauses.md
kvspec clauses --coverage      obligation -> checks -> mutants (exit 1 on a gap)
kvspec clauses --map [FAMILY]  where each family lives: spec module, error cases, checks,
                               mutants, golden vectors and (in a checkout) tests
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvspec.core.clauses import all_clauses, clause_table_markdown

NAME = "clauses"
HELP = "list the spec's numbered clauses and obligations"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="?", default="", help="show ids starting with this")
    parser.add_argument("--markdown", action="store_true", help="print the docs table")
    parser.add_argument("--text", action="store_true", help="print each clause's full text")
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="every obligation with the checks that exercise it and the mutants they kill",
    )
    parser.add_argument(
        "--map",
        action="store_true",
        help="the files of each family: spec, error cases, checks, mutants, vectors, tests",
    )


def _checkout_tests() -> Path | None:
    """The ``tests/`` of the source checkout kvspec runs from, if it runs from one."""
    root = Path(__file__).resolve().parents[2]
    tests = root / "tests"
    return tests if (root / "pyproject.toml").is_file() and tests.is_dir() else None


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(clause_table_markdown(), end="")
        return 0
    prefix = args.prefix.upper()
    if args.map:
        from kvspec.conformance.family_map import family_map, render_family_map

        families = [f for f in family_map(tests=_checkout_tests()) if f.family.startswith(prefix)]
        if not families:
            print(f"kvspec clauses: no clause family starts with {args.prefix!r}")
            return 1
        print(render_family_map(families), end="")
        return 0
    if args.coverage:
        from kvspec.conformance.coverage import coverage, render_coverage

        rows = [r for r in coverage() if r.obligation.id.startswith(prefix)]
        if not rows:
            print(f"kvspec clauses: no obligation id starts with {args.prefix!r}")
            return 1
        print(render_coverage(rows, verbose=args.text))
        return 0 if all(r.complete for r in rows) else 1
    chosen = [c for c in all_clauses().values() if c.id.startswith(prefix)]
    if not chosen:
        print(f"kvspec clauses: no clause id starts with {args.prefix!r}")
        return 1
    for clause in chosen:
        print(f"{clause.id:<10} {clause.title}")
        if args.text:
            print(f"{'':<10} {clause.text}")
            for o in clause.obligations:
                print(
                    f"{'':<10} {o.id:<12} {'must' if o.kind == 'positive' else 'refuses'}: {o.text}"
                )
            print()
    return 0
