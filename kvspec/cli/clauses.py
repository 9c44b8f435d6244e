"""List the clauses of the spec.

kvspec clauses                 id and title of every clause
kvspec clauses HEAD            only ids starting with HEAD
kvspec clauses --markdown      the table of docs/clauses.md
"""

from __future__ import annotations

import argparse

from kvspec.clauses import all_clauses, clause_table_markdown

NAME = "clauses"
HELP = "list the spec's numbered clauses"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="?", default="", help="show ids starting with this")
    parser.add_argument("--markdown", action="store_true", help="print the docs table")
    parser.add_argument("--text", action="store_true", help="print each clause's full text")


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(clause_table_markdown(), end="")
        return 0
    chosen = [c for c in all_clauses().values() if c.id.startswith(args.prefix.upper())]
    if not chosen:
        print(f"kvspec clauses: no clause id starts with {args.prefix!r}")
        return 1
    for clause in chosen:
        print(f"{clause.id:<10} {clause.title}")
        if args.text:
            print(f"{'':<10} {clause.text}\n")
    return 0
