"""Write the field report: what kvspec finds on real engines, judged as a maintainer would.

The project's own tool, not part of the kvspec wheel: `make field` (field/run.sh) and
`make field-report` run it as ``python -m field.report``. It imports nothing from kvspec,
no engine and no torch, so it runs in any venv.

Reads the JSON reports `make field` writes (one per engine, from `kvspec conform ENGINE
--profile ci --json`: each failure's consequence tier, whether serving reaches it and the
evidence, the failures grouped by root cause), the targeted replays, the repro scripts'
exit codes, the impact sweeps (field/impact/*.json) and the ledger (field/defects.json:
every defect kvspec has claimed, with its verdict); and the historical corpus
(field/history/bugs/, with the runs of both releases of each bug in
reports/field/history/): kvspec's recall on fixed bugs of the field. Writes
docs/field-report.md and docs/field-report.json.

The headline counts only defects whose failures *corrupt* KV or *break* a configuration
the engine accepts, reachable in serving, one entry per root cause. Inputs the clause
says to refuse that go through are hardening notes; correct results by another
legitimate choice are differences from kvspec's choices; failures serving never reaches
are listed with the evidence; every earlier claim the ledger withdraws stays visible
with its reason. Where the triage shows that serving turns what the engine's functions
compute into another outcome (a transfer serving never starts, an input its shipped
models refuse), the ledger's ``serving`` verdict decides, and the run's own tiers stay
listed beside it (field/report/verdicts.py).

Exit status 1 when a failure has no ledger entry (UNTRIAGED) or the run contradicts a
verdict of the ledger (an open defect with no reachable corrupts/breaks evidence, or a
withdrawn one the run shows reachable), so a new engine release cannot change the
picture unnoticed.

examples:
  python -m field.report                          # reports/field -> docs/field-report.{md,json}
  python -m field.report --reports DIR --out -    # print the Markdown instead (no JSON)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from field.report.history import (
    history_json,
    history_section,
    judge_history,
    load_corpus,
)
from field.report.json_twin import as_json
from field.report.markdown import render
from field.report.verdicts import LEDGER, judge, stale_triage
from field.report.workers import load_workers, unexpected

__all__ = ["PROG", "add_arguments", "build_parser", "load_impacts", "load_reports", "main", "run"]

PROG = "python -m field.report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reports", default="reports/field", help="where `make field` wrote")
    parser.add_argument("--ledger", "--triage", default=LEDGER, help="the defect ledger")
    parser.add_argument("--out", default="docs/field-report.md", help="Markdown file, or -")
    parser.add_argument(
        "--json",
        default=None,
        help="the per-defect JSON (default: docs/field-report.json, none with --out -)",
    )
    parser.add_argument("--root", default=".", help="where field/impact/ and repros resolve")
    parser.add_argument(
        "--history",
        default="field/history/bugs",
        help="the historical corpus (one JSON per bug; none if the directory is missing); "
        "its runs are read from REPORTS/history/",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and write the report; the exit status."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    reports_dir = Path(args.reports)
    reports = load_reports(reports_dir)
    if not reports:
        print(f"{PROG}: no ENGINE.json reports in {reports_dir}", file=sys.stderr)
        return 2
    ledger = json.loads(Path(args.ledger).read_text())
    root = Path(args.root)
    replays = {name: _load(reports_dir / f"{name}.replays.json", []) for name in reports}
    repros = _load(reports_dir / "repro.json", {})
    meta = _load(reports_dir / "run.json", {})
    impacts = load_impacts(ledger, root)
    workers = load_workers(reports_dir)
    field_run = judge(reports, ledger, replays=replays, repros=repros, impacts=impacts)
    corpus_dir = Path(args.history)
    history_lines: list[str] = []
    history: dict[str, Any] | None = None
    if corpus_dir.is_dir():
        runs = reports_dir / "history"
        run_record = _load(runs / "run.json", {})
        judged = judge_history(load_corpus(corpus_dir), run_record, runs)
        history_lines, history = (
            history_section(judged, run_record),
            history_json(judged, run_record),
        )
    text = render(
        reports,
        ledger,
        field_run,
        replays=replays,
        meta=meta,
        history=history_lines,
        workers=workers,
    )
    json_out = args.json if args.json is not None else ("" if args.out == "-" else None)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
        json_out = json_out if json_out is not None else str(Path(args.out).with_suffix(".json"))
    if json_out:
        data = as_json(reports, field_run, history, workers)
        Path(json_out).write_text(json.dumps(data, indent=2) + "\n")
    for engine, check in field_run.untriaged:
        print(f"{PROG}: UNTRIAGED {engine} {check}", file=sys.stderr)
    for line in field_run.contradictions:
        print(f"{PROG}: the run contradicts {LEDGER}: {line}", file=sys.stderr)
    for engine, check in stale_triage(reports, ledger):
        print(
            f"{PROG}: warning: {LEDGER} explains {engine} {check}, "
            "which did not fail (fixed upstream? remove the entry)",
            file=sys.stderr,
        )
    worker_problems = unexpected(workers)
    for line in worker_problems:
        print(f"{PROG}: worker harness: {line}", file=sys.stderr)
    return 1 if field_run.untriaged or field_run.contradictions or worker_problems else 0


def _load(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


def load_reports(directory: Path) -> dict[str, dict[str, Any]]:
    """Engine name -> its `kvspec conform --json` report, for every ENGINE.json there."""
    return {
        p.stem: json.loads(p.read_text())
        for p in sorted(directory.glob("*.json"))
        if "." not in p.stem and p.stem not in ("repro", "run")
    }


def load_impacts(ledger: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """Impact sweep path -> its JSON, for every sweep the ledger names that exists."""
    paths = {d["impact"] for d in ledger.get("defects", {}).values() if d.get("impact")}
    return {p: json.loads((root / p).read_text()) for p in sorted(paths) if (root / p).exists()}
