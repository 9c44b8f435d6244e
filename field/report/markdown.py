"""docs/field-report.md: the field run and the ledger rendered as Markdown, headline first
(defects that corrupt or break, reachable in serving), then the hardening notes,
differences, withdrawn claims, the failures by root cause and the matrix.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from field.report.impact import (
    cell_text,
    hits,
    impact_rows,
    impact_summary,
    start_key,
    starts,
)
from field.report.verdicts import (
    DIFFERENCE,
    FAILED,
    GENERATED,
    HARDENING,
    INCONCLUSIVE,
    LEDGER,
    NOT_PROVIDED,
    OPEN,
    OUTSIDE,
    PASSED,
    PENDING,
    SKIPPED,
    STATUSES,
    TIERS,
    UNCONFIRMED,
    WITHDRAWN,
    Defect,
    FieldRun,
    cell,
    classify,
    judge,
    reach_of,
)
from field.report.workers import worker_lines


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


def impact_table(impact: Any, limit: int = 40) -> list[str]:
    """The rows of an impact sweep that the engine starts and that hit the defect, as a
    Markdown table (long prose columns such as evidence left to the sweep file)."""
    rows = [r for r in impact_rows(impact) if starts(r) and hits(r)]
    if not rows:
        return []
    skip = {"hit"} | {k for k in rows[0] if k == start_key(rows[0])}
    columns = [
        k
        for k in rows[0]
        if k not in skip and all(len(cell_text(r.get(k, ""))) <= 60 for r in rows)
    ]
    out = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |"]
    out.append("|" + "---|" * len(columns))
    for r in rows[:limit]:
        out.append("| " + " | ".join(_escape(cell_text(r.get(c, ""))) for c in columns) + " |")
    if len(rows) > limit:
        out.append(f"\n({len(rows) - limit} more hit rows in the sweep file.)")
    return out


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
    history: Sequence[str] = (),
    workers: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The whole report as Markdown; only the ``Generated:`` line depends on the run.
    ``history`` is the historical corpus's section, already rendered
    (:func:`field.report.history.history_section`), placed after the defects;
    ``workers``: the worker harness's results by engine (``ENGINE.workers.json``)."""
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
    out = [
        *_opening(reports, heads, meta, today),
        *_not_counted(reports, ledger, defects, by_status),
        *_verdict_sections(heads, by_status, defects),
        *_unreachable(field_run, defects, ledger),
        *history,
        *_ledger_table(defects),
        *_failures(engines, field_run, defects, ledger),
        *_matrix(reports, engines),
        *_replays(replays, defects, ledger),
        *worker_lines(workers or {}),
        *_kvspec_issues(ledger, field_run),
        *_needs_triage(field_run),
    ]
    return "\n".join(out).rstrip() + "\n"


def _opening(
    reports: Mapping[str, Mapping[str, Any]],
    heads: list[Defect],
    meta: Mapping[str, Any],
    today: datetime.date,
) -> list[str]:
    """The title, the Generated line, what was run, and the headline: the defects that count."""
    out: list[str] = []
    minutes = f", `make field` took {meta['minutes']} min" if "minutes" in meta else ""
    first = next(iter(reports.values()))
    out = [
        "# kvspec on real engines",
        "",
        "<!-- Written by `python -m field.report` (field/report/) from the reports of "
        "`make field`; do not edit. "
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
    return out


def _not_counted(
    reports: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, Any],
    defects: Mapping[str, Defect],
    by_status: Mapping[str, list[Defect]],
) -> list[str]:
    """What the headline leaves out, by verdict, and each engine's line."""
    out: list[str] = []
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
    return out


def _verdict_sections(
    heads: list[Defect], by_status: Mapping[str, list[Defect]], defects: Mapping[str, Defect]
) -> list[str]:
    """A section per verdict: the defects in full, then hardening notes, unconfirmed
    candidates, legitimate differences, withdrawn claims and claims awaiting re-triage."""
    out: list[str] = []
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
    return out


def _unreachable(
    field_run: FieldRun, defects: Mapping[str, Defect], ledger: Mapping[str, Any]
) -> list[str]:
    """Failures the engine rejects at start-up or serving never produces, with the evidence."""
    out: list[str] = []
    out += [
        "## Unreachable in serving",
        "",
        "Failures whose counterexample the engine rejects at start-up or serving never "
        "produces, with the evidence the run gave.",
        "",
    ]
    unreachable = [
        c for cs in field_run.causes.values() for c in cs if reach_of(c.reachable) == "no"
    ]
    for c in unreachable:
        out.append(
            f"- {c.engine} **{c.headline}** ({c.tier or '?'}): {_first_line(c.evidence) or '?'}"
            f" — {_entry_line(c.entry, defects, ledger, short=True)}"
        )
    if not unreachable:
        out.append("None in this run.")
    return out


def _ledger_table(defects: Mapping[str, Defect]) -> list[str]:
    """Every claim kvspec has made, what it said then and the verdict now."""
    out: list[str] = []
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
    return out


def _failures(
    engines: list[str],
    field_run: FieldRun,
    defects: Mapping[str, Defect],
    ledger: Mapping[str, Any],
) -> list[str]:
    """Each engine's failures grouped by root cause, with counterexample and ledger entry."""
    out: list[str] = []
    out += ["", "## Failures by root cause", ""]
    for engine in engines:
        cs = field_run.causes.get(engine, [])
        out += [f"### {engine}", ""]
        if not cs:
            out += ["No check failed.", ""]
            continue
        for c in cs:
            tier = f" ({c.tier}, reachable: {reach_of(c.reachable)})" if c.tier else ""
            out += [f"- **{c.headline}**{tier} — {_first_line(c.reason)}"]
            if c.consequences:
                out += ["  - consequences: " + ", ".join(f"`{x}`" for x in c.consequences)]
            out += [f"  - counterexample: `{json.dumps(c.counterexample)}`"]
            if c.evidence:
                out += [f"  - reachability: {_first_line(c.evidence)}"]
            out += [f"  - ledger: {_entry_line(c.entry, defects, ledger)}"]
        out.append("")
    return out


def _matrix(reports: Mapping[str, Mapping[str, Any]], engines: list[str]) -> list[str]:
    """Every check's verdict per engine; checks no engine provides are named in one line."""
    out: list[str] = []
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
    return out


def _replays(
    replays: Mapping[str, Sequence[Mapping[str, Any]]],
    defects: Mapping[str, Defect],
    ledger: Mapping[str, Any],
) -> list[str]:
    """The targeted replays' verdicts (none: no section)."""
    out: list[str] = []
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
    return out


def _kvspec_issues(ledger: Mapping[str, Any], field_run: FieldRun) -> list[str]:
    """kvspec's own bugs met on correct field behaviour, and whether this run met them."""
    out: list[str] = []
    out += ["## kvspec issues (checks failing on correct field behaviour)", ""]
    kvspec_bugs = ledger.get("kvspec", {})
    for key in sorted(kvspec_bugs):
        k = kvspec_bugs[key]
        hits = field_run.kvspec_hits.get(key)
        out += [f"### {key}: {k['title']}", "", k["detail"], "", f"- tracked in: {k['issue']}"]
        out += [f"- fails in this run: {', '.join(hits)}" if hits else "- not met in this run"]
        out.append("")
    return out


def _needs_triage(field_run: FieldRun) -> list[str]:
    """Failures not in the ledger, and lines where the run contradicts it (none: no section)."""
    out: list[str] = []
    if field_run.untriaged or field_run.contradictions:
        out += ["## Needs triage", ""]
        out += [f"- **UNTRIAGED** {e} {c} — add it to {LEDGER}" for e, c in field_run.untriaged]
        out += [
            f"- **the run contradicts the ledger**: {line}" for line in field_run.contradictions
        ]
        out.append("")
    return out


def _defect_section(d: Defect) -> list[str]:
    e = d.entry
    out = [f"### {d.id}: {e['title']}", "", e["detail"], ""]
    out += [
        f"- engine: {e['engine']}; source: {e.get('source', '?')}",
        f"- tier: {d.tier}; reachable in serving: {d.reachable} — {_first_line(d.evidence, 800)}",
        *_run_tiers_line(d),
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


def _run_tiers_line(d: Defect) -> list[str]:
    """Where the ledger's serving verdict decides, the run's own tiers beside it."""
    if d.serving is None:
        return []
    tiers = ", ".join(d.run_tiers) or "none"
    return [
        f"- the engine's functions in this run: {tiers} (the serving verdict above decides: "
        "serving turns what they compute into another outcome)"
    ]


def _short_sections(items: Sequence[Defect]) -> list[str]:
    out: list[str] = []
    for d in sorted(items, key=lambda d: d.id):
        e = d.entry
        out += [f"### {d.id}: {e['title']}", "", e.get("reason") or e.get("detail", ""), ""]
        out += [
            f"- engine: {e['engine']}; previously: {e.get('was', '—')}",
            f"- tier: {d.tier or '—'}; reachable in serving: {d.reachable}"
            + (f" — {_first_line(d.evidence, 600)}" if d.evidence else ""),
            *_run_tiers_line(d),
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
