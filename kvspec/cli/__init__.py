"""The ``kvspec`` command line: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvspec import __version__
from kvspec.cli import adapter, clauses, conform, desc, layouts, plan, ports, vectors
from kvspec.console.args import Parser, quote
from kvspec.console.exits import run_to_exit

SUBCOMMANDS = (plan, ports, layouts, desc, conform, adapter, vectors, clauses)
"""Each module provides ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvspec",
        description=(
            "The executable reference for moving a KV cache between inference stages whose "
            "parallel layouts differ. Every rule is a numbered clause; see `kvspec clauses`."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kvspec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        sub = commands.add_parser(
            module.NAME,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if "--version" in words and len(words) > 1:  # argparse would print it and ignore the rest
        others = " ".join(w for w in words if w != "--version")
        parser.error(f"--version stands alone; got also {quote(others)}")

    def command() -> int:
        args = parser.parse_args(words)
        return args.run(args)

    return run_to_exit(command, "kvspec")


if __name__ == "__main__":
    sys.exit(main())
