"""The impact sweeps (``field/impact/*.json``) a ledger defect names: which deployments
the engine starts that hit the defect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def impact_summary(impact: Any) -> str:
    """One line on what an impact sweep found: its own ``summary``, else how many of the
    deployments it swept that the engine starts (``*_starts``, where the sweep says) it
    marks hit, and which models."""
    if impact is None:
        return ""
    if isinstance(impact, Mapping) and isinstance(impact.get("summary"), str):
        return impact["summary"]
    rows = impact_rows(impact)
    if not rows:
        return ""
    started = [r for r in rows if starts(r)]
    hit = [r for r in started if hits(r)]
    models = sorted({str(r["model"]) for r in hit if "model" in r})
    gated = len(started) != len(rows) or any(start_key(r) for r in rows)
    line = f"{len(hit)} of {len(started)} deployments swept" + (
        " that the engine starts" if gated else ""
    )
    line += " hit it"
    return line + (f" ({', '.join(models)})" if models else "")


def impact_rows(impact: Any) -> list[Mapping[str, Any]]:
    if isinstance(impact, list):
        return [r for r in impact if isinstance(r, Mapping)]
    if isinstance(impact, Mapping):
        for key in ("deployments", "rows", "results", "sweep"):
            if isinstance(impact.get(key), list):
                return [r for r in impact[key] if isinstance(r, Mapping)]
    return []


def start_key(row: Mapping[str, Any]) -> str | None:
    return next((k for k in row if k.endswith("_starts") or k == "starts"), None)


def starts(row: Mapping[str, Any]) -> bool:
    """Whether the engine accepts the deployment at start-up (True where unsaid)."""
    key = start_key(row)
    return bool(row[key]) if key else True


def hits(row: Mapping[str, Any]) -> bool:
    for key in ("hit", "affected", "corrupts", "misrouted", "wrong"):
        if key in row:
            value = row[key]
            return bool(value) if not isinstance(value, (int, float)) else value > 0
    return False


def cell_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {cell_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(cell_text(v) for v in value)
    return str(value)
