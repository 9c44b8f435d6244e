"""docs/field-report.json: the same verdicts as the Markdown report, as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from field.report.impact import impact_summary
from field.report.verdicts import FieldRun
from field.report.workers import workers_json


def as_json(
    reports: Mapping[str, Mapping[str, Any]],
    field_run: FieldRun,
    history: Mapping[str, Any] | None = None,
    workers: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """docs/field-report.json: per defect id its verdict and evidence (nothing that varies
    from run to run but the run's findings); ``history`` is the historical corpus's verdicts
    (:func:`field.report.history.history_json`), under ``history``; with
    ``workers``, the worker harness's cases, under ``workers``."""
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
            "serving_verdict": d.serving is not None,
            "run_tiers": d.run_tiers,
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
    extra = {"workers": workers_json(workers)} if workers else {}
    return {
        "engines": {e: r["adapter"]["version"] for e, r in reports.items()},
        "summary_by_tier": {e: r.get("summary_by_tier") for e, r in reports.items()},
        "headline": sorted(k for k, d in field_run.defects.items() if d.headline),
        "defects": defects,
        "kvspec_issues": {k: sorted(v) for k, v in sorted(field_run.kvspec_hits.items())},
        "untriaged": [f"{e} {c}" for e, c in field_run.untriaged],
        "contradictions": field_run.contradictions,
        **({"history": dict(history)} if history is not None else {}),
        **extra,
    }
