"""The field run judged against the ledger: the verdict words, the matrix cells, each
engine's failures grouped by root cause and tied to their ledger entry, and each claimed
defect's verdict from the evidence (the consequence tiers of issue 28, restated here).

Imports no engine, torch or check: ``python -m field.report`` runs in any venv.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PASSED, FAILED, NOT_PROVIDED = "passed", "FAILED", "not provided"
OUTSIDE, INCONCLUSIVE, SKIPPED = "outside domain", "inconclusive", "skipped"
GENERATED = "Generated:"
"""The one line that changes from run to run (date and run time); CI's diff ignores it."""

CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS = "corrupts", "breaks", "accepts-invalid", "differs"
TIERS = (CORRUPTS, BREAKS, ACCEPTS_INVALID, DIFFERS)
"""kvspec.conformance.tiers.TIERS, most severe first (restated: this command imports no
engine, torch or check; tests/field/test_field_report.py holds the two equal)."""
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

    @property
    def serving(self) -> Observation | None:
        """The ledger's ``serving`` verdict: where the triage shows that serving turns what
        the engine's functions compute into another outcome (a transfer serving never
        starts, an input its shipped models refuse), it decides over the run's tiers."""
        verdict = self.entry.get("serving")
        if not isinstance(verdict, Mapping):
            return None
        return Observation(
            "ledger (serving)",
            verdict.get("tier"),
            verdict.get("reachable_in_serving"),
            verdict.get("evidence", ""),
        )

    @property
    def run_tiers(self) -> list[str]:
        """The tiers the run's own failures and replays show, most severe first."""
        seen = {o.tier for o in self.observations if o.source != "ledger" and o.tier in TIERS}
        return [t for t in TIERS if t in seen]

    def _best(self) -> Observation | None:
        """The observation that decides: the ledger's serving verdict where it has one,
        else the most reachable, then the most severe."""
        if self.serving is not None and self.serving.tier in TIERS:
            return self.serving
        seen = [o for o in self.observations if o.tier in TIERS]
        if not seen:
            return None
        return min(seen, key=lambda o: (REACH.index(reach_of(o.reachable)), TIERS.index(o.tier)))

    @property
    def tier(self) -> str | None:
        best = self._best()
        return best.tier if best else None

    @property
    def reachable(self) -> str:
        best = self._best()
        return reach_of(best.reachable) if best else "unknown"

    @property
    def evidence(self) -> str:
        best = self._best()
        return best.evidence if best else ""

    @property
    def headline(self) -> bool:
        """Counted in the headline: open, and some reachable failure corrupts or breaks
        (where the ledger has a serving verdict, that verdict)."""
        shown = [self.serving] if self.serving is not None else self.observations
        return self.status == OPEN and any(
            o.tier in HEADLINE_TIERS and reach_of(o.reachable) == "yes" for o in shown
        )


def reach_of(value: str | None) -> str:
    """A reachability as the report shows it: one of REACH, "unknown" where unsaid."""
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
    untriaged: list[tuple[str, str]] = []
    kvspec_hits: dict[str, list[str]] = {}
    causes = {
        engine: _tie_causes(engine, report, ledger, defects, untriaged, kvspec_hits)
        for engine, report in reports.items()
    }
    _tie_replays(replays, defects, untriaged, kvspec_hits)
    _add_ledger_evidence(defects)
    contradictions = _contradictions(defects)
    return FieldRun(causes, defects, untriaged, contradictions, kvspec_hits)


def _tie_causes(
    engine: str,
    report: Mapping[str, Any],
    ledger: Mapping[str, Any],
    defects: dict[str, Defect],
    untriaged: list[tuple[str, str]],
    kvspec_hits: dict[str, list[str]],
) -> list[Cause]:
    """``engine``'s failures grouped by root cause, each tied to its ledger entry: a
    defect's observations gain the cause and its consequences; a kvspec issue's hits, or
    the untriaged list, gain the rest."""
    results = {r["check"]: r for r in report["results"] if r["verdict"] == FAILED}
    found = causes_of(engine, report, ledger)
    for cause in found:
        if cause.entry is None:
            untriaged.append((engine, cause.headline))
            continue
        if "kvspec" in cause.entry:
            kvspec_hits.setdefault(cause.entry["kvspec"], []).append(f"{engine} {cause.headline}")
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
    return found


def _tie_replays(
    replays: Mapping[str, Sequence[Mapping[str, Any]]],
    defects: dict[str, Defect],
    untriaged: list[tuple[str, str]],
    kvspec_hits: dict[str, list[str]],
) -> None:
    """Each failed targeted replay, tied to the defect or kvspec issue it names (else
    untriaged)."""
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


def _add_ledger_evidence(defects: dict[str, Defect]) -> None:
    """The ledger's own finding, last: where it ties with the run's, the run's is shown."""
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


def _contradictions(defects: Mapping[str, Defect]) -> list[str]:
    """Where the run and the ledger disagree: a claim awaiting re-triage or of an unknown
    status, an open defect no reachable corrupts/breaks evidence (or serving verdict)
    supports, a closed one the run shows reachable that no serving verdict explains."""
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
        elif (
            d.status != OPEN
            and d.serving is None
            and any(o.tier in HEADLINE_TIERS and reach_of(o.reachable) == "yes" for o in run_obs)
        ):
            shown = next(o for o in run_obs if o.tier in HEADLINE_TIERS and o.reachable == "yes")
            contradictions.append(
                f"{d.id} is {d.status}, but {shown.source} {shown.tier} is reachable in serving"
            )
    return contradictions


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
