"""Check an implementation against the spec, clause by clause.

IMPL is a built-in adapter name (`reference`) or MODULE:ATTR naming an adapter
object or a zero-argument factory (the current directory is importable). Each check
runs as a Hypothesis property over examples drawn inside the adapter's declared
domain; a failure prints the shrunk counterexample and a command that replays it. A
check that passed on too few examples inside the domain is "inconclusive".

`--mutants` runs the project's corpus of one-bug implementations (the reference with
one realistic bug each) through the suite instead, and prints how many it kills.

examples:
  kvspec conform reference
  kvspec conform my_adapter:adapter --profile ci --json conform.json --jobs 4
  kvspec conform my_adapter:adapter --clause PLAN --clause SLICE-3 --clause PAYLOAD-3.4
  kvspec conform my_adapter:adapter --check PLAN-2/exact-cover --replay '{...}'
  kvspec conform --list
  kvspec conform --mutants --profile ci
  kvspec conform reference --coverage --profile ci

`--coverage` draws every check's examples as a run would, without running the checks,
and prints how many hit each declared feature of the domain (every preset, TP relation
and replica policy, layer-group kind, state with and without speculative rows, lifecycle
event and event sequence, token rule, dtype): a feature never drawn is a corner no
implementation is held to (exit 1).

Every failure has a consequence tier, derived from the obligation it broke and what
was observed: corrupts (the receiver ends with KV, scales or state that differ from the
model's, with no error), breaks (a crash, or a valid configuration refused),
accepts-invalid (an input the clause says to refuse goes through: hardening), differs (a
correct result by another legitimate choice the adapter declares, e.g. every replica
writing). The table ends with the count by tier; failures are listed by cause, the most
basic failing obligation first with its consequences under it.

--fail-on TIERS (a comma list, or all) says which tiers fail the exit status. Default:
all for `reference` (kvspec holds itself to every tier); corrupts,breaks for any other
adapter (an engine's hardening notes and legitimate differences are reported, not
failed). A failure whose counterexample serving never reaches (the adapter's
serving_never_produces, or the engine's own start-up validation refusing the deployment)
never fails the exit status.

exit status: 0 nothing failed in a --fail-on tier, 1 a check failed in a --fail-on tier
and serving may reach it (with --mutants: a mutant survived), 2 the adapter could not be
loaded or is malformed (or the arguments are wrong: an unknown tier), 3 nothing failed
that way but a check was inconclusive.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvspec.console.args import quote
from kvspec.console.output import check_writable, write_text
from kvspec.core.profile_names import PROFILES
from kvspec.core.untrusted_input import InputRefused, loads

# The suite (and so torch and Hypothesis) is imported by run(), so that `kvspec --help`
# and every other command start without it.
if TYPE_CHECKING:
    from kvspec.conformance.adapter import Adapter
    from kvspec.conformance.mutation import MutantResult
    from kvspec.conformance.runner import CheckResult, Report

NAME = "conform"
HELP = "check an implementation (through its adapter) against every clause"

MAX_REPLAY_DEPTH = 16
"""How deep a ``--replay`` example may nest: a drawn example nests a few levels (a list of
block tables, a map of layers); deeper is refused before the JSON parser recurses."""

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")


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
        help="run only checks matching: a family (PLAN), a clause (PLAN-2), an obligation "
        "(PLAN-2.3), a check id or glob",
    )
    parser.add_argument("--device", default="cpu", help="tensor device: cpu, cuda or cuda:N (cpu)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write the JSON report here; '-' writes it to stdout (the table goes to stderr)",
    )
    parser.add_argument("--report", dest="report", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--skips", metavar="PATH", help="the implementation's skips file")
    parser.add_argument("--replay", metavar="JSON", help="run one example (with one --check)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "--mutants",
        action="store_true",
        help="run the project's mutant corpus through the suite and print the kill rate",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="draw every check's examples under the profile without running the checks, "
        "and print how many hit each declared feature of the domain (exit 1 if one is "
        "never drawn); --json writes the table",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="worker processes, each loading IMPL itself (1); results keep the checks' order",
    )
    parser.add_argument(
        "--fail-on",
        metavar="TIERS",
        help="tiers that fail the exit status, a comma list of corrupts, breaks, "
        "accepts-invalid, differs, or all (default: all for reference, corrupts,breaks "
        "for any other adapter)",
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="also write the report in markdown here (a CI job summary: "
        "$GITHUB_STEP_SUMMARY); '-' writes it to stdout",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="one line per check, every failure and every check not run, and a progress "
        "line per check (the default is one screen: the summary, each cause, one line per "
        "family not run, why the exit status is what it is)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress at all")


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot run the suite, or None: checked before anything runs."""
    kind, _, index = device.partition(":")
    if kind not in DEVICE_TYPES or (index and not index.isdigit()) or (index and kind == "cpu"):
        return f"--device must be cpu, cuda or cuda:N; got {device!r}"
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            return f"--device {device} but no CUDA device is available"
        if index and int(index) >= torch.cuda.device_count():
            return (
                f"--device {device} but only {torch.cuda.device_count()} CUDA device(s) are "
                "available"
            )
    return None


def run(args: argparse.Namespace) -> int:
    if args.list:
        from kvspec.conformance.checks import all_checks

        for check in all_checks():
            print(f"{check.id:<44} needs {'+'.join(check.needs):<22} {check.title}")
        return 0
    problem = _refused(args)
    if problem:
        print(f"kvspec conform: {problem}", file=sys.stderr)
        return 2
    if args.mutants:
        return _mutants(args)
    if args.coverage:
        return _coverage(args)
    return _conform(args)


def _refused(args: argparse.Namespace) -> str | None:
    """Why the command line cannot run, before anything slow is imported (the suite, torch,
    Hypothesis); None when it can. Sets ``args.fail_on_tiers`` (and ``args.json`` from the
    deprecated ``--report``)."""
    problem = device_problem(args.device)
    if problem:
        return problem
    if args.report and not args.json:
        print("kvspec conform: --report is deprecated; use --json PATH", file=sys.stderr)
        args.json = args.report
    try:
        check_writable(args.json)  # before a run of minutes, not after it
        check_writable(args.markdown, "--markdown")
    except ValueError as error:
        return f"refused: {error}"
    if args.json == "-" and args.markdown == "-":
        return "--json - and --markdown - cannot both write to stdout; give one a file"
    if args.quiet and args.verbose:
        return "--quiet and --verbose contradict each other; give one"
    if args.jobs < 1:
        return f"--jobs must be at least 1; got {args.jobs}"
    args.fail_on_tiers = None
    if args.fail_on is not None:
        from kvspec.core.tier_names import parse_tiers  # no torch, no Hypothesis

        try:
            args.fail_on_tiers = parse_tiers(args.fail_on)
        except ValueError as error:
            return f"--fail-on: {error}"
        if args.mutants:
            return "--fail-on does not apply to --mutants"
    if args.mutants and args.impl:
        return "--mutants takes no IMPL"
    if args.coverage and (args.mutants or args.replay is not None):
        return "--coverage draws inputs only: it takes neither --mutants nor --replay"
    if not args.mutants and not args.impl:
        return "give IMPL (`reference` or MODULE:ATTR); see --help"
    return None


def _conform(args: argparse.Namespace) -> int:
    """Load the adapter, then replay one example or run the suite and report it."""
    # Only now, after every refusal that needs none of it: the suite, torch and Hypothesis.
    from kvspec.conformance.adapter import AdapterError, load_adapter
    from kvspec.conformance.checks import all_checks
    from kvspec.conformance.runner import NOT_PROVIDED, run_suite
    from kvspec.conformance.skips import read_skips, resolve_skips

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
            progress=_progress_for(args),
            jobs=args.jobs,
        )
    except ValueError as error:
        print(f"kvspec conform: {error}", file=sys.stderr)
        return 2
    report.fail_on = args.fail_on_tiers
    _emit(args, report)
    if report.results and all(r.verdict == NOT_PROVIDED for r in report.results):
        print(
            f"kvspec conform: warning: nothing was checked: {args.impl} provides none of "
            "what the selected checks need (the table says what each needs)",
            file=sys.stderr,
        )
    return report.exit_code


def _coverage(args: argparse.Namespace) -> int:
    """Draw every selected check's inputs (no check runs) and print the coverage table."""
    from kvspec.conformance.adapter import AdapterError, load_adapter
    from kvspec.conformance.input_coverage import draw_coverage, render_coverage
    from kvspec.conformance.runner import select_checks
    from kvspec.core.profile_names import default_profile

    try:
        adapter = load_adapter(args.impl)
        checks = select_checks(args.patterns)
    except (AdapterError, ValueError) as error:
        print(f"kvspec conform: cannot use {args.impl}: {error}", file=sys.stderr)
        return 2
    coverage = draw_coverage(adapter, profile=args.profile or default_profile(), checks=checks)
    print(render_coverage(coverage), file=sys.stderr if args.json == "-" else sys.stdout)
    _write(args.json, lambda: json.dumps(coverage.to_dict(), indent=2))
    return 1 if coverage.gaps() else 0


def _emit(args: argparse.Namespace, report: Report) -> None:
    """The report on stdout (stderr when the JSON or the markdown goes to stdout): one
    screen, or with ``--verbose`` the full listing; then the JSON and markdown reports."""
    from kvspec.conformance.brief import render_brief
    from kvspec.conformance.markdown import render_markdown
    from kvspec.conformance.runner import render

    text = render(report) if args.verbose else render_brief(report)
    print(text, file=sys.stderr if "-" in (args.json, args.markdown) else sys.stdout)
    _write(args.json, lambda: json.dumps(report.to_dict(), indent=2))
    _write(args.markdown, lambda: render_markdown(report))


def _write(path: str | None, text: Callable[[], str]) -> None:
    if path:
        write_text(path, text() + "\n")


def _progress_for(args: argparse.Namespace) -> Callable[[int, int, CheckResult], None] | None:
    """A line per check with ``--verbose``; none with ``--quiet``; by default one line
    rewritten in place, and only on a terminal (a log or a CI job gets the report alone)."""
    if args.quiet:
        return None
    if args.verbose:
        return _progress
    return _progress_in_place if sys.stderr.isatty() else None


def _progress(i: int, total: int, result: CheckResult) -> None:
    print(
        f"[{i:>3}/{total}] {result.check.id:<44} {result.verdict:<12} {result.seconds:6.2f} s",
        file=sys.stderr,
        flush=True,
    )


def _progress_in_place(i: int, total: int, result: CheckResult) -> None:
    end = "\r" if i < total else "\r\033[K"  # the last one clears the line
    print(f"\r\033[K[{i:>3}/{total}] {result.check.id}", end=end, file=sys.stderr, flush=True)


def _replay(args: argparse.Namespace, adapter: Adapter) -> int:
    from kvspec.conformance.runner import Report, run_check, select_checks

    if not args.patterns:
        raise ValueError("--replay needs --check naming the one check to replay it through")
    checks = select_checks(args.patterns)
    if len(checks) != 1:
        raise ValueError(
            f"--replay needs exactly one check; {len(checks)} match {args.patterns}: name one "
            "check id (see `kvspec conform --list`)"
        )
    try:
        example = loads(args.replay, max_depth=MAX_REPLAY_DEPTH)
    except InputRefused as refusal:
        raise ValueError(f"--replay {quote(args.replay)} {refusal}") from None
    if not isinstance(example, dict):
        raise ValueError(
            f"--replay must be a JSON object (the example a failure prints), got "
            f"{type(example).__name__} {quote(args.replay)}"
        )
    from kvspec.conformance.adapter import load_adapter

    # The reference passes every example a check generates; one it fails on is not an
    # example of this check (a hand-edited replay, one of another check), and running it
    # would blame the implementation for the example's own fault.
    trial = run_check(checks[0], load_adapter("reference"), device=args.device, replay=example)
    if trial.verdict == "FAILED":
        why = (trial.reason or "").removeprefix("the implementation raised ").splitlines()[0]
        raise ValueError(
            f"--replay is not an example of {checks[0].id}: the reference fails on it too "
            f"({why[:300]})"
        )
    result = run_check(checks[0], adapter, device=args.device, replay=example, profile=args.profile)
    report = Report(
        args.impl,
        adapter,
        args.profile or "replay",
        args.device,
        [result],
        fail_on=args.fail_on_tiers,
    )
    _emit(args, report)
    return report.exit_code


def _mutants(args: argparse.Namespace) -> int:
    from kvspec.conformance.mutation import render_mutation, run_corpus

    def progress(i: int, total: int, result: MutantResult) -> None:
        verdict = f"killed by {result.killed_by}" if result.killed else "SURVIVED"
        print(
            f"[{i:>3}/{total}] {result.name:<36} {verdict} ({result.seconds:.2f} s)",
            file=sys.stderr,
            flush=True,
        )

    report = run_corpus(
        profile=args.profile,
        device=args.device,
        jobs=args.jobs,
        progress=None if args.quiet else progress,
    )
    print(render_mutation(report), file=sys.stderr if args.json == "-" else sys.stdout)
    _write(args.json, lambda: json.dumps(report.to_dict(), indent=2))
    return 0 if not report.survivors else 1
