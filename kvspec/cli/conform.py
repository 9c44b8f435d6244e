"""Check an implementation against the spec, clause by clause.

IMPL is a built-in adapter name (`reference`) or MODULE:ATTR naming an adapter
object or a zero-argument factory (the current directory is importable). Each check
runs as a Hypothesis property; a failure prints the shrunk counterexample and a
command that replays it.

examples:
  kvspec conform reference
  kvspec conform my_adapter:adapter --profile ci --report conform.json
  kvspec conform my_adapter:adapter --clause PLAN --clause SLICE-3
  kvspec conform my_adapter:adapter --check PLAN-2/exact-cover --replay '{...}'
  kvspec conform --list

exit status: 0 nothing failed, 1 a check failed, 2 the adapter could not be loaded
or is malformed (or the arguments are wrong).
"""

from __future__ import annotations

import argparse
import json
import sys

from kvspec.conformance.adapter import AdapterError, load_adapter
from kvspec.conformance.checks import all_checks
from kvspec.conformance.runner import (
    CheckResult,
    Report,
    render,
    run_check,
    run_suite,
    select_checks,
)
from kvspec.conformance.skips import read_skips, resolve_skips
from kvspec.profiles import PROFILES

NAME = "conform"
HELP = "check an implementation (through its adapter) against every clause"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("impl", nargs="?", help="`reference` or MODULE:ATTR")
    parser.add_argument("--profile", choices=PROFILES, help="Hypothesis profile (dev; ci if CI)")
    parser.add_argument(
        "--clause",
        "--check",
        dest="patterns",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only checks matching: a family (PLAN), a clause (PLAN-2), a check id or glob",
    )
    parser.add_argument("--device", default="cpu", help="tensor device: cpu or cuda (cpu)")
    parser.add_argument("--report", metavar="PATH", help="write the JSON report here")
    parser.add_argument("--skips", metavar="PATH", help="the implementation's skips file")
    parser.add_argument("--replay", metavar="JSON", help="run one example (with one --check)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for check in all_checks():
            print(f"{check.id:<40} needs {'+'.join(check.needs):<18} {check.title}")
        return 0
    if not args.impl:
        print("kvspec conform: give IMPL (`reference` or MODULE:ATTR); see --help", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("kvspec conform: --device cuda but no CUDA device is available", file=sys.stderr)
            return 2
    try:
        adapter = load_adapter(args.impl)
    except AdapterError as error:
        print(f"kvspec conform: cannot use {args.impl}: {error}", file=sys.stderr)
        return 2
    try:
        if args.replay is not None:
            return _replay(args, adapter)
        skips: dict[str, str] = {}
        if args.skips:
            skips, unused = resolve_skips(read_skips(args.skips), all_checks())
            for entry in unused:
                print(
                    f"kvspec conform: warning: {args.skips}:{entry.line}: {entry.pattern!r} "
                    "matches no check",
                    file=sys.stderr,
                )
        report = run_suite(
            adapter,
            impl=args.impl,
            profile=args.profile,
            patterns=args.patterns,
            device=args.device,
            skips=skips,
            progress=None if args.quiet else _progress,
        )
    except ValueError as error:
        print(f"kvspec conform: {error}", file=sys.stderr)
        return 2
    print(render(report))
    if args.report:
        with open(args.report, "w") as out:
            json.dump(report.to_dict(), out, indent=2)
    return 1 if report.failed else 0


def _progress(i: int, total: int, result: CheckResult) -> None:
    print(
        f"[{i:>3}/{total}] {result.check.id:<40} {result.verdict:<12} {result.seconds:6.2f} s",
        file=sys.stderr,
        flush=True,
    )


def _replay(args: argparse.Namespace, adapter) -> int:
    checks = select_checks(args.patterns)
    if len(checks) != 1:
        raise ValueError(f"--replay needs exactly one check; {len(checks)} match {args.patterns}")
    result = run_check(checks[0], adapter, device=args.device, replay=json.loads(args.replay))
    report = Report(args.impl, adapter, args.profile or "replay", args.device, [result])
    print(render(report))
    return 1 if report.failed else 0
