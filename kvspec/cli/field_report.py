"""Write the field report: what kvspec finds on real engines, judged as a maintainer would.

Reads the JSON reports `make field` writes (one per engine, from `kvspec conform ENGINE
--profile ci --json`: each failure's consequence tier, whether serving reaches it and the
evidence, the failures grouped by root cause), the targeted replays, the repro scripts'
exit codes, the impact sweeps (field/impact/*.json) and the ledger (field/defects.json:
every defect kvspec has claimed, with its verdict). Writes docs/field-report.md and
docs/field-report.json.

The headline counts only defects whose failures *corrupt* KV or *break* a configuration
the engine accepts, reachable in serving, one entry per root cause. Inputs the clause
says to refuse that go through are hardening notes; correct results by another
legitimate choice are differences from kvspec's choices; failures serving never reaches
are listed with the evidence; every earlier claim the ledger withdraws stays visible
with its reason.

Exit status 1 when a failure has no ledger entry (UNTRIAGED) or the run contradicts a
verdict of the ledger (an open defect with no reachable corrupts/breaks evidence, or a
withdrawn one the run shows reachable), so a new engine release cannot change the
picture unnoticed.

examples:
  kvspec field-report                          # reports/field -> docs/field-report.{md,json}
  kvspec field-report --reports DIR --out -    # print the Markdown instead (no JSON)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = "field-report"
HELP = "write docs/field-report.md and .json from the JSON reports of `make field`"

PASSED, FAILED, NOT_PROVIDED = "passed", "FAILED", "not provided"
OUTSIDE, INCONCLUSIVE, SKIPPED = "outside domain", "inconclusive", "skipped"
GENERATED = "Generated:"
"""The one line that changes from run to run (date and run time); CI's diff ignores it."""

CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS = "corrupts", "breaks", "accepts-invalid", "differs"
TIERS = (CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS)
"""kvspec.conformance.tiers.TIERS, most severe first (restated: this command imports no
engine, torch or check; tests/suite/test_field_report.py holds the two equal)."""
HEADLINE_TIERS = (CORRUPTS, BREAKS)
REACH = ("yes", "unknown", "no")
"""Reachability in serving, most reachable first."""
OPEN, HARDENING, DIFFERENCE, WITHDRAWN = "open", "hardening", "differs", "withdrawn"
UNCONFIRMED = "unconfirmed"
"""A candidate defect shown by a repro whose reachability in serving is not established
(e.g. it needs a GPU to confirm): listed apart, not counted, until evidence decides."""
STATUSES = (OPEN, UNCONFIRMED, HARDENING, DIFFERENCE, WITHDRAWN)
PENDING = "pending"
"""A claim taken back for re-triage and not yet judged: shown apart, and `make field`
fails until it has one of STATUSES."""
LEDGER = "field/defects.json"


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


def run(args: argparse.Namespace) -> int:
    reports_dir = Path(args.reports)
    reports = load_reports(reports_dir)
    if not reports:
        print(f"kvspec field-report: no ENGINE.json reports in {reports_dir}", file=sys.stderr)
        return 2
    ledger = json.loads(Path(args.ledger).read_text())
    root = Path(args.root)
    replays = {name: _load(reports_dir / f"{name}.replays.json", []) for name in reports}
    repros = _load(reports_dir / "repro.json", {})
    meta = _load(reports_dir / "run.json", {})
    impacts = load_impacts(ledger, root)
    field_run = judge(reports, ledger, replays=replays, repros=repros, impacts=impacts)
    text = render(reports, ledger, field_run, replays=replays, meta=meta)
    json_out = args.json if args.json is not None else ("" if args.out == "-" else None)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
        json_out = json_out if json_out is not None else str(Path(args.out).with_suffix(".json"))
    if json_out:
        Path(json_out).write_text(json.dumps(as_json(reports, field_run), indent=2) + "\n")
    for engine, check in field_run.untriaged:
        print(f"kvspec field-report: UNTRIAGED {engine} {check}", file=sys.stderr)
    for line in field_run.contradictions:
        print(f"kvspec field-report: the run contradicts {LEDGER}: {line}", file=sys.stderr)
    for engine, check in stale_triage(reports, ledger):
        print(
            f"kvspec field-report: warning: {LEDGER} explains {engine} {check}, "
            "which did not fail (fixed upstream? remove the entry)",
            file=sys.stderr,
        )
    return 1 if field_run.untriaged or field_run.contradictions else 0


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


# --- the matrix -----------------------------------------------------------------------


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
    """One matrix cell: the verdict, with the effective example count of a pass and the
    tier and reachability of a failure."""
    if result is None:
        return "—"
    verdict = classify(result)
    if verdict == PASSED:
        return f"passed ({effective(result)})"
    if verdict == FAILED:
        tier = result.get("tier")
        if not tier:
            return "**FAILED**"
        reach = result.get("reachable_in_serving")
        unreachable = ", unreachable" if reach == "no" else ""
        return f"**FAILED** ({tier}{unreachable})"
    if verdict == INCONCLUSIVE:
        return f"inconclusive ({effective(result)})"
    return verdict


# --- judging the run against the ledger ----------------------------------------------


@dataclass
class Observation:
    """One piece of evidence about a defect: a failed check of the run, a replay, or the
    ledger's own finding (a repro, a reading of the engine's start-up checks)."""

    source: str
    tier: str | None
    reachable: str | None
    evidence: str


@dataclass
class Cause:
    """One root cause of an engine's run: the most basic failing check, the checks that
    fail with it, and the ledger entry that explains it."""

    engine: str
    headline: str
    tier: str | None
    reachable: str | None
    evidence: str
    counterexample: Any
    reason: str
    consequences: list[str]
    entry: Mapping[str, Any] | None
    pytest: str | None = None


@dataclass
class Defect:
    """A ledger defect with the run's evidence: the verdict the report prints."""

    id: str
    entry: Mapping[str, Any]
    observations: list[Observation] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    impact: Any = None
    repro_exit: int | None = None
    draft_exit: int | None = None

    @property
    def status(self) -> str:
        return self.entry.get("status", OPEN)

    def _best(self) -> Observation | None:
        """The observation that decides: the most reachable, then the most severe."""
        seen = [o for o in self.observations if o.tier in TIERS]
        if not seen:
            return None
        return min(seen, key=lambda o: (REACH.index(_reach(o.reachable)), TIERS.index(o.tier)))

    @property
    def tier(self) -> str | None:
        best = self._best()
        return best.tier if best else None

    @property
    def reachable(self) -> str:
        best = self._best()
        return _reach(best.reachable) if best else "unknown"

    @property
    def evidence(self) -> str:
        best = self._best()
        return best.evidence if best else ""

    @property
    def headline(self) -> bool:
        """Counted in the headline: open, and some reachable failure corrupts or breaks."""
        return self.status == OPEN and any(
            o.tier in HEADLINE_TIERS and _reach(o.reachable) == "yes" for o in self.observations
        )


def _reach(value: str | None) -> str:
    return value if value in REACH else "unknown"


@dataclass
class FieldRun:
    causes: dict[str, list[Cause]]
    defects: dict[str, Defect]
    untriaged: list[tuple[str, str]]
    contradictions: list[str]
    kvspec_hits: dict[str, list[str]]


def causes_of(engine: str, report: Mapping[str, Any], ledger: Mapping[str, Any]) -> list[Cause]:
    """The report's failures grouped by root cause (its ``causes``; a report without them:
    one cause per failure), each with the ledger entry of its headline check (the
    consequences need none of their own; a consequence's entry never names the cause)."""
    known = ledger.get("failures", {}).get(engine, {})
    results = {r["check"]: r for r in report["results"] if r["verdict"] == FAILED}
    groups = report.get("causes")
    if groups is None:
        groups = [{"headline": check, "consequences": []} for check in results]
    out, covered = [], set()
    for group in groups:
        head = group["headline"]
        consequences = [c for c in group.get("consequences", []) if c != head]
        covered |= {head, *consequences}
        r = results.get(head, {})
        # consequences inherit the headline's entry, never the other way round
        entry = resolve_entry(known.get(head), group.get("counterexample", r.get("counterexample")))
        out.append(
            Cause(
                engine=engine,
                headline=head,
                tier=group.get("tier", r.get("tier")),
                reachable=group.get("reachable_in_serving", r.get("reachable_in_serving")),
                evidence=r.get("reachability_evidence") or "",
                counterexample=group.get("counterexample", r.get("counterexample")),
                reason=r.get("reason", ""),
                consequences=consequences,
                entry=entry,
                pytest=r.get("pytest"),
            )
        )
    for check, r in results.items():  # a failure no cause names is a cause of its own
        if check not in covered:
            out.append(
                Cause(
                    engine,
                    check,
                    r.get("tier"),
                    r.get("reachable_in_serving"),
                    r.get("reachability_evidence") or "",
                    r.get("counterexample"),
                    r.get("reason", ""),
                    [],
                    resolve_entry(known.get(check), r.get("counterexample")),
                    r.get("pytest"),
                )
            )
    return out


def counterexample_facts(counterexample: Any) -> dict[str, Any]:
    """What a ledger ``when`` can ask of a counterexample: dotted paths into its transfer
    configuration (``source.tp``, ``model.attention``, ``policy``; a ``case`` wrapper is
    looked through) and two derived facts, ``tp_divides`` (one stage's TP divides the
    other's) and ``pipeline`` (either stage has PP above 1)."""
    config = (
        counterexample.get("case", counterexample) if isinstance(counterexample, Mapping) else {}
    )
    if not isinstance(config, Mapping):
        return {}
    facts: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            facts.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            facts[key] = value
    given = (facts.get("source.tp"), facts.get("target.tp"))
    tps = [t for t in given if isinstance(t, int) and t > 0]
    if len(tps) == len(given):
        facts["tp_divides"] = max(tps) % min(tps) == 0
    pps = [facts.get("source.pp") or 1, facts.get("target.pp") or 1]
    facts["pipeline"] = max(pps) > 1
    return facts


def resolve_entry(entry: Any, counterexample: Any) -> Mapping[str, Any] | None:
    """The ledger entry for one failure: a mapping as it stands, or, for a list of them,
    the first whose ``when`` (facts of :func:`counterexample_facts`) the counterexample
    meets (an entry without ``when`` meets every one). None when nothing fits."""
    if entry is None or isinstance(entry, Mapping):
        return entry
    facts = counterexample_facts(counterexample)
    for option in entry:
        when = option.get("when", {})
        if all(facts.get(k) == v for k, v in when.items()):
            return {k: v for k, v in option.items() if k != "when"}
    return None


def judge(
    reports: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, Any],
    *,
    replays: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    repros: Mapping[str, int] | None = None,
    impacts: Mapping[str, Any] | None = None,
) -> FieldRun:
    """Every failure of the run tied to its ledger entry, and each defect's verdict."""
    replays, repros, impacts = replays or {}, repros or {}, impacts or {}
    entries = ledger.get("defects", {})
    defects = {
        key: Defect(
            key,
            d,
            impact=impacts.get(d.get("impact") or ""),
            repro_exit=repros.get(d.get("repro") or ""),
            draft_exit=repros.get(d.get("upstream_draft") or ""),
        )
        for key, d in entries.items()
    }
    causes: dict[str, list[Cause]] = {}
    untriaged: list[tuple[str, str]] = []
    kvspec_hits: dict[str, list[str]] = {}
    for engine, report in reports.items():
        results = {r["check"]: r for r in report["results"] if r["verdict"] == FAILED}
        causes[engine] = causes_of(engine, report, ledger)
        for cause in causes[engine]:
            if cause.entry is None:
                untriaged.append((engine, cause.headline))
                continue
            if "kvspec" in cause.entry:
                kvspec_hits.setdefault(cause.entry["kvspec"], []).append(
                    f"{engine} {cause.headline}"
                )
                continue
            key = cause.entry.get("defect")
            if key not in defects:
                if key is not None:
                    untriaged.append((engine, f"{cause.headline} (unknown defect {key})"))
                continue
            for check in (cause.headline, *cause.consequences):
                r = results.get(check, {})
                defects[key].checks.append(f"{engine} {check}")
                defects[key].observations.append(
                    Observation(
                        f"{engine} {check}",
                        r.get("tier", cause.tier if check == cause.headline else None),
                        r.get("reachable_in_serving", cause.reachable),
                        r.get("reachability_evidence") or cause.evidence,
                    )
                )
    for engine, runs in replays.items():
        for r in runs:
            if r["verdict"] != FAILED:
                continue
            key = r.get("defect")
            if key in defects:
                defects[key].checks.append(f"{engine} replay {r['check']}")
                defects[key].observations.append(
                    Observation(
                        f"{engine} replay {r['check']}",
                        r.get("tier"),
                        r.get("reachable_in_serving"),
                        r.get("reachability_evidence") or r.get("why", ""),
                    )
                )
            elif r.get("kvspec"):
                kvspec_hits.setdefault(r["kvspec"], []).append(f"{engine} replay {r['check']}")
            else:
                untriaged.append((engine, f"replay {r['check']}"))
    # the ledger's own finding last: where it ties with the run's, the run's is shown
    for d in defects.values():
        ev = d.entry.get("evidence")
        if ev:
            d.observations.append(
                Observation(
                    "ledger",
                    ev.get("tier"),
                    ev.get("reachable_in_serving"),
                    ev.get("reachability_evidence", ""),
                )
            )
    contradictions = []
    for d in defects.values():
        run_obs = [o for o in d.observations if o.source != "ledger"]
        if d.status == PENDING:
            contradictions.append(f"{d.id} awaits re-triage (status pending)")
        elif d.status not in STATUSES:
            contradictions.append(f"{d.id}: unknown status {d.status!r}")
        elif d.status == OPEN and not d.headline:
            contradictions.append(
                f"{d.id} is open, but no reachable corrupts/breaks evidence supports it"
            )
        elif d.status != OPEN and any(
            o.tier in HEADLINE_TIERS and _reach(o.reachable) == "yes" for o in run_obs
        ):
            shown = next(o for o in run_obs if o.tier in HEADLINE_TIERS and o.reachable == "yes")
            contradictions.append(
                f"{d.id} is {d.status}, but {shown.source} {shown.tier} is reachable in serving"
            )
    return FieldRun(causes, defects, untriaged, contradictions, kvspec_hits)


def untriaged_failures(
    reports: Mapping[str, Mapping[str, Any]],
    replays: Mapping[str, Sequence[Mapping[str, Any]]],
    ledger: Mapping[str, Any],
) -> list[tuple[str, str]]:
    """(engine, check) of every failure (cause) the ledger does not explain."""
    return judge(reports, ledger, replays=replays).untriaged


def stale_triage(
    reports: Mapping[str, Mapping[str, Any]], ledger: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(engine, check) the ledger explains although it did not fail this run."""
    failed = {
        (engine, r["check"])
        for engine, report in reports.items()
        for r in report["results"]
        if r["verdict"] == FAILED
    }
    return [
        (engine, check)
        for engine, checks in ledger.get("failures", {}).items()
        if engine in reports
        for check in checks
        if (engine, check) not in failed
    ]


# --- impact sweeps ----------------------------------------------------------------------


def impact_summary(impact: Any) -> str:
    """One line on what an impact sweep found: its own ``summary``, else how many of the
    deployments it swept that the engine starts (``*_starts``, where the sweep says) it
    marks hit, and which models."""
    if impact is None:
        return ""
    if isinstance(impact, Mapping) and isinstance(impact.get("summary"), str):
        return impact["summary"]
    rows = _impact_rows(impact)
    if not rows:
        return ""
    started = [r for r in rows if _starts(r)]
    hit = [r for r in started if _hit(r)]
    models = sorted({str(r["model"]) for r in hit if "model" in r})
    gated = len(started) != len(rows) or any(_start_key(r) for r in rows)
    line = f"{len(hit)} of {len(started)} deployments swept" + (
        " that the engine starts" if gated else ""
    )
    line += " hit it"
    return line + (f" ({', '.join(models)})" if models else "")


def _impact_rows(impact: Any) -> list[Mapping[str, Any]]:
    if isinstance(impact, list):
        return [r for r in impact if isinstance(r, Mapping)]
    if isinstance(impact, Mapping):
        for key in ("deployments", "rows", "results", "sweep"):
            if isinstance(impact.get(key), list):
                return [r for r in impact[key] if isinstance(r, Mapping)]
    return []


def _start_key(row: Mapping[str, Any]) -> str | None:
    return next((k for k in row if k.endswith("_starts") or k == "starts"), None)


def _starts(row: Mapping[str, Any]) -> bool:
    """Whether the engine accepts the deployment at start-up (True where unsaid)."""
    key = _start_key(row)
    return bool(row[key]) if key else True


def _hit(row: Mapping[str, Any]) -> bool:
    for key in ("hit", "affected", "corrupts", "misrouted", "wrong"):
        if key in row:
            value = row[key]
            return bool(value) if not isinstance(value, (int, float)) else value > 0
    return False


def _cell_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_cell_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_cell_text(v) for v in value)
    return str(value)


def impact_table(impact: Any, limit: int = 40) -> list[str]:
    """The rows of an impact sweep that the engine starts and that hit the defect, as a
    Markdown table (long prose columns such as evidence left to the sweep file)."""
    rows = [r for r in _impact_rows(impact) if _starts(r) and _hit(r)]
    if not rows:
        return []
    skip = {"hit"} | {k for k in rows[0] if k == _start_key(rows[0])}
    columns = [
        k
        for k in rows[0]
        if k not in skip and all(len(_cell_text(r.get(k, ""))) <= 60 for r in rows)
    ]
    out = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |"]
    out.append("|" + "---|" * len(columns))
    for r in rows[:limit]:
        out.append("| " + " | ".join(_escape(_cell_text(r.get(c, ""))) for c in columns) + " |")
    if len(rows) > limit:
        out.append(f"\n({len(rows) - limit} more hit rows in the sweep file.)")
    return out


# --- rendering ---------------------------------------------------------------------------


def _first_line(text: str, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(key: str, title: str) -> str:
    """GitHub's heading anchor of ``### key: title``."""
    text = f"{key}: {title}".lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _link(d: Defect) -> str:
    return f"[{d.id}](#{_anchor(d.id, d.entry['title'])})"


def _repro_line(d: Defect) -> str:
    repro = d.entry.get("repro")
    if not repro:
        return "no repro"
    if d.repro_exit is None:
        shown = "not run"
    elif d.repro_exit:
        shown = f"exits {d.repro_exit} on the pinned version"
    else:
        shown = "exits 0 on the pinned version — **no longer fails: the engine may have fixed it**"
    return f"`{repro}` ({shown})"


def engine_lines(reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per engine: its version, verdict counts and failures by tier."""
    lines = []
    for engine, report in reports.items():
        c = dict.fromkeys((PASSED, FAILED, NOT_PROVIDED, OUTSIDE, INCONCLUSIVE, SKIPPED), 0)
        for r in report["results"]:
            c[classify(r)] = c.get(classify(r), 0) + 1
        extra = "".join(f", {c[v]} {v}" for v in (INCONCLUSIVE, SKIPPED) if c.get(v))
        tiers = report.get("summary_by_tier")
        by_tier = " (" + ", ".join(f"{tiers.get(t, 0)} {t}" for t in TIERS) + ")" if tiers else ""
        lines.append(
            f"- **{engine}** ({report['adapter']['version']}): {c[PASSED]} passed, "
            f"{c[FAILED]} FAILED{by_tier}, {c[NOT_PROVIDED]} not provided, {c[OUTSIDE]} "
            f"outside domain{extra}"
        )
    return lines


def headline(reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per engine (kept for callers of the old report)."""
    return engine_lines(reports)


def render(
    reports: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, Any],
    field_run: FieldRun | None = None,
    *,
    replays: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    repros: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    today: datetime.date | None = None,
) -> str:
    """The whole report as Markdown; only the ``Generated:`` line depends on the run."""
    replays = replays or {}
    meta = meta or {}
    if field_run is None:
        field_run = judge(reports, ledger, replays=replays, repros=repros)
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    engines = list(reports)
    defects = field_run.defects
    by_status = {s: [d for d in defects.values() if d.status == s] for s in STATUSES}
    heads = sorted(
        (d for d in defects.values() if d.headline),
        key=lambda d: (d.entry.get("severity") != "material", TIERS.index(d.tier), d.id),
    )
    minutes = f", `make field` took {meta['minutes']} min" if "minutes" in meta else ""
    first = next(iter(reports.values()))
    out = [
        "# kvspec on real engines",
        "",
        "<!-- Written by `kvspec field-report` from the reports of `make field`; do not edit. "
        f"Verdicts live in {LEDGER}; the same report as data: docs/field-report.json. -->",
        "",
        f"{GENERATED} {today.isoformat()}{minutes}",
        "",
        f"Each engine's installed package runs through `kvspec conform ENGINE --profile "
        f"{first['profile']}` (device {first['device']}) via its adapter in "
        "`kvspec/adapters/`; versions are pinned in `field/requirements/`. Every failure "
        "carries a consequence tier — *corrupts* (the receiver ends with KV that differ from "
        "the model's, no error), *breaks* (a crash, or a refusal of a configuration the engine "
        "accepts), *accepts-invalid* (an input the clause says to refuse goes through), "
        "*differs* (a correct result by another legitimate choice) — and whether serving "
        "reaches it: the adapter runs the engine's own start-up validation on the "
        "counterexample's deployment, or cites why serving never produces that input.",
        "",
        "## Headline",
        "",
        f"**{len(heads)} defects** corrupt KV or break a deployment the engine accepts, "
        "reachable in serving (one entry per root cause"
        + (
            f"; {sum(d.entry.get('severity') == 'material' for d in heads)} material, "
            f"{sum(d.entry.get('severity') == 'minor' for d in heads)} minor"
            if heads
            else ""
        )
        + "):",
        "",
    ]
    for d in heads:
        e = d.entry
        impact = impact_summary(d.impact)
        out.append(
            f"- {_link(d)} ({e['engine']}, {d.tier}, {e.get('severity', 'open')}): {e['title']}"
            + (f". Impact: {impact}" if impact else "")
            + f". Upstream: {e.get('upstream') or 'none found'}"
            + (f"; draft `{e['upstream_draft']}`" if e.get("upstream_draft") else "")
            + "."
        )
    if not heads:
        out.append("- none")
    out += [
        "",
        "Not counted: "
        f"{len(by_status[HARDENING])} hardening notes (inputs that should be refused, which "
        f"serving does not produce or which cost no KV), {len(by_status[DIFFERENCE])} "
        f"legitimate differences from kvspec's choices, {len(by_status[UNCONFIRMED])} "
        "candidates whose reachability is not confirmed, "
        f"{len(by_status[WITHDRAWN])} "
        f"withdrawn claims, {len(ledger.get('kvspec', {}))} kvspec issues"
        + (
            f", {n} awaiting re-triage"
            if (n := sum(d.status == PENDING for d in defects.values()))
            else ""
        )
        + ". Every claim of "
        "earlier reports is in the ledger below with its verdict.",
        "",
        *engine_lines(reports),
        "",
    ]
    out += ["## Defects", ""]
    for d in heads:
        out += _defect_section(d)
    out += [
        "## Hardening notes",
        "",
        "Inputs a clause says to refuse that the engine lets through, or wrong results only "
        "inputs serving never produces can reach. Worth a guard; not defects of serving.",
        "",
    ]
    out += _short_sections(by_status[HARDENING]) or ["None.", ""]
    if by_status[UNCONFIRMED]:
        out += [
            "## Candidates not confirmed in serving",
            "",
            "Wrong results a repro shows on the engine's own code, in a deployment whose "
            "reachability is not yet established. Not counted until it is.",
            "",
            *_short_sections(by_status[UNCONFIRMED]),
        ]
    out += [
        "## Legitimate differences from kvspec's choices",
        "",
        "Correct results reached by another choice than kvspec's (its adapter declares the "
        "engine's own rule). Not defects.",
        "",
    ]
    out += _short_sections(by_status[DIFFERENCE]) or ["None.", ""]
    out += ["## Withdrawn", ""]
    out += _short_sections(by_status[WITHDRAWN]) or ["None.", ""]
    pending = [d for d in defects.values() if d.status == PENDING]
    if pending:
        out += ["## Awaiting re-triage", "", "Claims of earlier reports not yet judged.", ""]
        out += _short_sections(pending)
    out += [
        "## Unreachable in serving",
        "",
        "Failures whose counterexample the engine rejects at start-up or serving never "
        "produces, with the evidence the run gave.",
        "",
    ]
    unreachable = [c for cs in field_run.causes.values() for c in cs if _reach(c.reachable) == "no"]
    for c in unreachable:
        out.append(
            f"- {c.engine} **{c.headline}** ({c.tier or '?'}): {_first_line(c.evidence) or '?'}"
            f" — {_entry_line(c.entry, defects, ledger, short=True)}"
        )
    if not unreachable:
        out.append("None in this run.")
    out += [
        "",
        "## Re-triage ledger",
        "",
        f"Every defect kvspec has claimed, with what it claimed then and the verdict now "
        f"({LEDGER}).",
        "",
        "| id | engine | previously | now | tier | reachable in serving |",
        "|---|---|---|---|---|---|",
    ]
    for d in sorted(
        defects.values(),
        key=lambda d: (STATUSES.index(d.status) if d.status in STATUSES else 9, d.id),
    ):
        now = d.status + (f" ({d.entry['severity']})" if d.entry.get("severity") else "")
        out.append(
            f"| {_link(d)} | {d.entry['engine']} | {_escape(d.entry.get('was', '—'))} | "
            f"{now}: {_escape(d.entry.get('verdict', ''))} | {d.tier or '—'} | {d.reachable} |"
        )
    out += ["", "## Failures by root cause", ""]
    for engine in engines:
        cs = field_run.causes.get(engine, [])
        out += [f"### {engine}", ""]
        if not cs:
            out += ["No check failed.", ""]
            continue
        for c in cs:
            tier = f" ({c.tier}, reachable: {_reach(c.reachable)})" if c.tier else ""
            out += [f"- **{c.headline}**{tier} — {_first_line(c.reason)}"]
            if c.consequences:
                out += ["  - consequences: " + ", ".join(f"`{x}`" for x in c.consequences)]
            out += [f"  - counterexample: `{json.dumps(c.counterexample)}`"]
            if c.evidence:
                out += [f"  - reachability: {_first_line(c.evidence)}"]
            out += [f"  - ledger: {_entry_line(c.entry, defects, ledger)}"]
        out.append("")
    out += [
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
    out.append("")
    runs = [(e, r) for e, rs in replays.items() for r in rs]
    if runs:
        out += [
            "## Targeted replays",
            "",
            "Examples the random search under `ci` did not reach first (each check stops at "
            "its first failure), replayed one by one from `field/replays/ENGINE.json`.",
            "",
            "| engine | check | verdict | why this example | ledger |",
            "|---|---|---|---|---|",
        ]
        for engine, r in runs:
            entry = {k: r[k] for k in ("defect", "kvspec") if r.get(k)}
            shown = (
                _entry_line(entry or None, defects, ledger, short=True)
                if r["verdict"] == FAILED
                else "—"
            )
            verdict = "**FAILED**" if r["verdict"] == FAILED else r["verdict"]
            out.append(
                f"| {engine} | {r['check']} | {verdict} | {_escape(r['why'])} | {_escape(shown)} |"
            )
        out.append("")
    out += ["## kvspec issues (checks failing on correct field behaviour)", ""]
    kvspec_bugs = ledger.get("kvspec", {})
    for key in sorted(kvspec_bugs):
        k = kvspec_bugs[key]
        hits = field_run.kvspec_hits.get(key)
        out += [f"### {key}: {k['title']}", "", k["detail"], "", f"- tracked in: {k['issue']}"]
        out += [f"- fails in this run: {', '.join(hits)}" if hits else "- not met in this run"]
        out.append("")
    if field_run.untriaged or field_run.contradictions:
        out += ["## Needs triage", ""]
        out += [f"- **UNTRIAGED** {e} {c} — add it to {LEDGER}" for e, c in field_run.untriaged]
        out += [
            f"- **the run contradicts the ledger**: {line}" for line in field_run.contradictions
        ]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _defect_section(d: Defect) -> list[str]:
    e = d.entry
    out = [f"### {d.id}: {e['title']}", "", e["detail"], ""]
    out += [
        f"- engine: {e['engine']}; source: {e.get('source', '?')}",
        f"- tier: {d.tier}; reachable in serving: {d.reachable} — {_first_line(d.evidence, 800)}",
    ]
    impact = impact_summary(d.impact)
    if e.get("impact"):
        out.append(
            f"- impact: {impact or 'see the sweep'} (`{e['impact']}`)"
            if d.impact is not None
            else f"- impact: `{e['impact']}` not written yet"
        )
    out += [
        f"- repro: {_repro_line(d)}",
        f"- upstream: {e.get('upstream') or 'no upstream issue found'}",
    ]
    if e.get("upstream_draft"):
        ran = (
            ""
            if d.draft_exit is None
            else f" (its standalone repro exits {d.draft_exit} on the pinned version"
            + (")" if d.draft_exit else " — **the engine may have fixed it**)")
        )
        out.append(f"- draft upstream issue: `{e['upstream_draft']}`{ran}")
    if d.checks:
        out.append("- failing in this run: " + ", ".join(f"`{c}`" for c in d.checks))
    out.append("")
    table = impact_table(d.impact)
    if table:
        out += ["Deployments the impact sweep finds hit:", "", *table, ""]
    return out


def _short_sections(items: Sequence[Defect]) -> list[str]:
    out: list[str] = []
    for d in sorted(items, key=lambda d: d.id):
        e = d.entry
        out += [f"### {d.id}: {e['title']}", "", e.get("reason") or e.get("detail", ""), ""]
        out += [
            f"- engine: {e['engine']}; previously: {e.get('was', '—')}",
            f"- tier: {d.tier or '—'}; reachable in serving: {d.reachable}"
            + (f" — {_first_line(d.evidence, 600)}" if d.evidence else ""),
            f"- what the engine does: {_first_line(e.get('detail', ''), 600)}",
            f"- repro: {_repro_line(d)}",
        ]
        if e.get("upstream"):
            out.append(f"- upstream: {e['upstream']}")
        if d.checks:
            out.append("- failing in this run: " + ", ".join(f"`{c}`" for c in d.checks))
        out.append("")
    return out


def _entry_line(
    entry: Mapping[str, Any] | None,
    defects: Mapping[str, Defect],
    ledger: Mapping[str, Any],
    *,
    short: bool = False,
) -> str:
    if not entry:
        return f"**UNTRIAGED** — add it to {LEDGER}"
    if "defect" in entry:
        d = defects.get(entry["defect"])
        if d is None:
            return f"unknown defect {entry['defect']}"
        kind = "defect" if d.status == OPEN else d.status
        return f"{kind} {_link(d)}" + ("" if short else f": {d.entry['title']}")
    if "kvspec" in entry:
        key = entry["kvspec"]
        title = ledger.get("kvspec", {}).get(key, {}).get("title", "?")
        return f"kvspec issue [{key}](#{_anchor(key, title)})" + ("" if short else f": {title}")
    return f"adapter translation error: {entry.get('adapter', '?')}"


# --- the JSON twin -----------------------------------------------------------------------


def as_json(reports: Mapping[str, Mapping[str, Any]], field_run: FieldRun) -> dict[str, Any]:
    """docs/field-report.json: per defect id its verdict and evidence (nothing that varies
    from run to run but the run's findings)."""
    defects = {}
    for key in sorted(field_run.defects):
        d = field_run.defects[key]
        e = d.entry
        defects[key] = {
            "engine": e["engine"],
            "title": e["title"],
            "status": d.status,
            "severity": e.get("severity"),
            "reason": e.get("reason"),
            "headline": d.headline,
            "tier": d.tier,
            "reachable_in_serving": d.reachable,
            "reachability_evidence": d.evidence,
            "impact": (
                {"sweep": e["impact"], "summary": impact_summary(d.impact) or None}
                if e.get("impact") and d.impact is not None
                else None
            ),
            "upstream": e.get("upstream"),
            "upstream_draft": e.get("upstream_draft"),
            "repro": e.get("repro"),
            "repro_exit": d.repro_exit,
            "upstream_draft_repro_exit": d.draft_exit,
            "source": e.get("source"),
            "previously": e.get("was"),
            "verdict": e.get("verdict"),
            "failing_checks": d.checks,
            "evidence": [
                {
                    "source": o.source,
                    "tier": o.tier,
                    "reachable_in_serving": o.reachable,
                    "evidence": o.evidence,
                }
                for o in d.observations
            ],
        }
    return {
        "engines": {e: r["adapter"]["version"] for e, r in reports.items()},
        "summary_by_tier": {e: r.get("summary_by_tier") for e, r in reports.items()},
        "headline": sorted(k for k, d in field_run.defects.items() if d.headline),
        "defects": defects,
        "kvspec_issues": {k: sorted(v) for k, v in sorted(field_run.kvspec_hits.items())},
        "untriaged": [f"{e} {c}" for e, c in field_run.untriaged],
        "contradictions": field_run.contradictions,
    }
