"""Write the field report: real engines x checks, with a triage of every failure.

Reads the JSON reports `make field` writes (one per engine, from `kvspec conform ENGINE
--profile ci`), the targeted replays and the repro scripts' exit codes next to them, and
the human triage in field/triage.json; writes a Markdown matrix (passed / FAILED / not
provided / outside domain / inconclusive, with the effective example count of each pass),
then each failure with its counterexample and triage.

A failure without a triage entry is printed as UNTRIAGED and the command exits 1, so a
new engine release that breaks a check cannot go unnoticed.

examples:
  kvspec field-report                          # reports/field -> docs/field-report.md
  kvspec field-report --reports DIR --out -    # print instead of writing
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NAME = "field-report"
HELP = "write docs/field-report.md from the JSON reports of `make field`"

PASSED, FAILED, NOT_PROVIDED = "passed", "FAILED", "not provided"
OUTSIDE, INCONCLUSIVE, SKIPPED = "outside domain", "inconclusive", "skipped"
GENERATED = "Generated:"
"""The one line that changes from run to run (date and run time); CI's diff ignores it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reports", default="reports/field", help="where `make field` wrote")
    parser.add_argument("--triage", default="field/triage.json", help="the triage file")
    parser.add_argument("--out", default="docs/field-report.md", help="output file, or -")


def run(args: argparse.Namespace) -> int:
    reports_dir = Path(args.reports)
    reports = load_reports(reports_dir)
    if not reports:
        print(f"kvspec field-report: no ENGINE.json reports in {reports_dir}", file=sys.stderr)
        return 2
    triage = json.loads(Path(args.triage).read_text())
    replays = {name: _load(reports_dir / f"{name}.replays.json", []) for name in reports}
    repros = _load(reports_dir / "repro.json", {})
    meta = _load(reports_dir / "run.json", {})
    text = render(reports, triage, replays=replays, repros=repros, meta=meta)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    untriaged = untriaged_failures(reports, replays, triage)
    for engine, check in untriaged:
        print(f"kvspec field-report: UNTRIAGED {engine} {check}", file=sys.stderr)
    for engine, check in stale_triage(reports, triage):
        print(
            f"kvspec field-report: warning: field/triage.json explains {engine} {check}, "
            "which did not fail (fixed upstream? remove the entry)",
            file=sys.stderr,
        )
    return 1 if untriaged else 0


def _load(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


def load_reports(directory: Path) -> dict[str, dict[str, Any]]:
    """Engine name -> its `kvspec conform --json` report, for every ENGINE.json there."""
    return {
        p.stem: json.loads(p.read_text())
        for p in sorted(directory.glob("*.json"))
        if "." not in p.stem and p.stem not in ("repro", "run")
    }


def classify(result: Mapping[str, Any]) -> str:
    """The matrix verdict of one check result.

    ``not provided`` with every tried example outside the adapter's declared domain is
    *outside domain*; an ``inconclusive`` verdict (a pass on too few effective examples)
    is kept.
    """
    verdict = result["verdict"]
    tried = result.get("examples_tried", 0)
    outside = result.get("outside_declared_domain", 0)
    if verdict == NOT_PROVIDED and tried and outside == tried:
        return OUTSIDE
    if verdict in (PASSED, FAILED, NOT_PROVIDED, INCONCLUSIVE, SKIPPED):
        return verdict
    return verdict.lower()


def effective(result: Mapping[str, Any]) -> int:
    """Examples that were inside the adapter's domain and really checked (the report's
    ``effective_examples``; older reports: tried minus outside the domain)."""
    if "effective_examples" in result:
        return result["effective_examples"]
    return result.get("examples_tried", 0) - result.get("outside_declared_domain", 0)


def cell(result: Mapping[str, Any] | None) -> str:
    """One matrix cell: the verdict, with the effective example count of a pass."""
    if result is None:
        return "—"
    verdict = classify(result)
    if verdict == PASSED:
        return f"passed ({effective(result)})"
    if verdict == FAILED:
        return "**FAILED**"
    if verdict == INCONCLUSIVE:
        return f"inconclusive ({effective(result)})"
    return verdict


def untriaged_failures(
    reports: Mapping[str, Mapping[str, Any]],
    replays: Mapping[str, Sequence[Mapping[str, Any]]],
    triage: Mapping[str, Any],
) -> list[tuple[str, str]]:
    """(engine, check) of every failure the triage file does not explain."""
    known = triage.get("failures", {})
    missing = [
        (engine, r["check"])
        for engine, report in reports.items()
        for r in report["results"]
        if r["verdict"] == FAILED and r["check"] not in known.get(engine, {})
    ]
    missing += [
        (engine, f"replay {r['check']}")
        for engine, runs in replays.items()
        for r in runs
        if r["verdict"] == FAILED and not r.get("defect") and not r.get("kvspec")
    ]
    return missing


def stale_triage(
    reports: Mapping[str, Mapping[str, Any]], triage: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(engine, check) the triage file explains although it did not fail this run."""
    failed = {
        (engine, r["check"])
        for engine, report in reports.items()
        for r in report["results"]
        if r["verdict"] == FAILED
    }
    return [
        (engine, check)
        for engine, checks in triage.get("failures", {}).items()
        if engine in reports
        for check in checks
        if (engine, check) not in failed
    ]


def _counts(report: Mapping[str, Any]) -> dict[str, int]:
    counts = dict.fromkeys((PASSED, FAILED, NOT_PROVIDED, OUTSIDE, INCONCLUSIVE, SKIPPED), 0)
    for r in report["results"]:
        verdict = classify(r)
        counts[verdict] = counts.get(verdict, 0) + 1
    return counts


def headline(reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per engine: its version and verdict counts."""
    lines = []
    for engine, report in reports.items():
        c = _counts(report)
        extra = "".join(f", {c[v]} {v}" for v in (INCONCLUSIVE, SKIPPED) if c.get(v))
        lines.append(
            f"- **{engine}** ({report['adapter']['version']}): {c[PASSED]} passed, "
            f"{c[FAILED]} FAILED, {c[NOT_PROVIDED]} not provided, {c[OUTSIDE]} outside "
            f"domain{extra}"
        )
    return lines


def _first_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render(
    reports: Mapping[str, Mapping[str, Any]],
    triage: Mapping[str, Any],
    *,
    replays: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    repros: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    today: datetime.date | None = None,
) -> str:
    """The whole report as Markdown; only the ``Generated:`` line depends on the run."""
    replays = replays or {}
    repros = repros or {}
    meta = meta or {}
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    engines = list(reports)
    defects = triage.get("defects", {})
    kvspec_bugs = triage.get("kvspec", {})
    failures = triage.get("failures", {})
    minutes = f", `make field` took {meta['minutes']} min" if "minutes" in meta else ""
    first = next(iter(reports.values()))
    out = [
        "# kvspec on real engines",
        "",
        "<!-- Written by `kvspec field-report` from the reports of `make field`; do not edit. "
        "Triage lives in field/triage.json. -->",
        "",
        f"{GENERATED} {today.isoformat()}{minutes}",
        "",
        f"Each engine's installed package runs through `kvspec conform ENGINE --profile "
        f"{first['profile']}` (device {first['device']}) via its adapter in "
        "`kvspec/adapters/`; versions are pinned in `field/requirements/`. Cells: the "
        "verdict; a pass shows how many examples were inside the adapter's declared domain "
        "(pinned examples included). *outside domain*: every example lay outside what the "
        "engine accepts on purpose; *not provided*: the engine has no such capability, or it "
        "cannot be reached without a GPU or a running engine (field/NOTES.md).",
        "",
        "## Headline",
        "",
        *headline(reports),
        "",
    ]
    real = {d for per in failures.values() for t in per.values() if (d := t.get("defect"))}
    real |= {r["defect"] for rs in replays.values() for r in rs if r.get("defect")}
    out += [
        f"Real defects found: {len(real)} (each with a standalone repro under `field/repro/`); "
        f"kvspec issues found: {len(kvspec_bugs)}.",
        "",
        "## Matrix",
        "",
        "| check | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    by_check: dict[str, dict[str, Mapping[str, Any]]] = {}
    for engine, report in reports.items():
        for r in report["results"]:
            by_check.setdefault(r["check"], {})[engine] = r
    nowhere = []
    for check, results in by_check.items():
        cells = [cell(results.get(e)) for e in engines]
        if all(c in (NOT_PROVIDED, "—") for c in cells):
            nowhere.append(check)
            continue
        out.append(f"| {check} | " + " | ".join(cells) + " |")
    if nowhere:
        out += [
            "",
            f"Not provided by any engine ({len(nowhere)} checks): "
            + ", ".join(f"`{c}`" for c in nowhere)
            + ".",
        ]
    out += ["", "## Failures and their triage", ""]
    for engine, report in reports.items():
        failed = [r for r in report["results"] if r["verdict"] == FAILED]
        if not failed:
            out += [f"### {engine}", "", "No check failed.", ""]
            continue
        out += [f"### {engine}", ""]
        for r in failed:
            entry = failures.get(engine, {}).get(r["check"])
            out += [f"- **{r['check']}** — {_first_line(r['reason'])}"]
            out += [f"  - counterexample: `{json.dumps(r['counterexample'])}`"]
            out += [f"  - triage: {_triage_line(entry, defects, kvspec_bugs)}"]
        out.append("")
    runs = [(e, r) for e, rs in replays.items() for r in rs]
    if runs:
        out += [
            "## Targeted replays",
            "",
            "Examples the random search under `ci` did not reach first (each check stops at "
            "its first failure), replayed one by one from `field/replays/ENGINE.json`.",
            "",
            "| engine | check | verdict | why this example | triage |",
            "|---|---|---|---|---|",
        ]
        for engine, r in runs:
            entry = {k: r[k] for k in ("defect", "kvspec") if r.get(k)}
            shown = (
                _triage_line(entry or None, defects, kvspec_bugs, short=True)
                if r["verdict"] == FAILED
                else "—"
            )
            verdict = "**FAILED**" if r["verdict"] == FAILED else r["verdict"]
            out.append(
                f"| {engine} | {r['check']} | {verdict} | {_escape(r['why'])} | {_escape(shown)} |"
            )
        out.append("")
    out += ["## Real defects", ""]
    for key in sorted(defects):
        d = defects[key]
        status = repros.get(d["repro"])
        shown = (
            "not run"
            if status is None
            else f"exits {status} on the pinned version"
            + ("" if status else " — **no longer fails: the engine may have fixed it**")
        )
        out += [
            f"### {key}: {d['title']}",
            "",
            d["detail"],
            "",
            f"- engine: {d['engine']}; source: {d['source']}",
            f"- repro: `{d['repro']}` ({shown})",
            f"- upstream: {d.get('upstream') or 'no upstream issue found'}",
            "",
        ]
    out += ["## kvspec issues (checks failing on correct field behaviour)", ""]
    for key in sorted(kvspec_bugs):
        k = kvspec_bugs[key]
        out += [f"### {key}: {k['title']}", "", k["detail"], "", f"- tracked in: {k['issue']}", ""]
    return "\n".join(out).rstrip() + "\n"


def _triage_line(
    entry: Mapping[str, Any] | None,
    defects: Mapping[str, Any],
    kvspec_bugs: Mapping[str, Any],
    *,
    short: bool = False,
) -> str:
    if not entry:
        return "**UNTRIAGED** — add it to field/triage.json"
    if "defect" in entry:
        key = entry["defect"]
        title = defects.get(key, {}).get("title", "?")
        return f"real defect [{key}](#{_anchor(key, title)})" + ("" if short else f": {title}")
    if "kvspec" in entry:
        key = entry["kvspec"]
        title = kvspec_bugs.get(key, {}).get("title", "?")
        return f"kvspec issue [{key}](#{_anchor(key, title)})" + ("" if short else f": {title}")
    return f"adapter translation error: {entry.get('adapter', '?')}"


def _anchor(key: str, title: str) -> str:
    """GitHub's heading anchor of ``### key: title``."""
    text = f"{key}: {title}".lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")
