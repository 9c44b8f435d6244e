"""Real connector workers in the field report: an engine's own worker moving KV between
two TPs over a real transfer library (``make field``'s field/workers/, issue 31).

The harness writes ``ENGINE.workers.json`` beside the conformance reports: per case the
two TPs and the model, the outcome (``moved``: every request read and every element of
every decode cache equal to the coordinate-hash oracle [ORACLE-5]; ``refused``: the
engine refused the pairing, every request failed and nothing was written; ``wrong``:
anything else), the outcome the case expects, and each READ's descriptor list judged
against DESC-1..3 with its count beside the spec's minimum. This module renders that
data; it judges nothing itself but whether a case ended as it expects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SUFFIX = ".workers.json"


def load_workers(directory: Path) -> dict[str, dict[str, Any]]:
    """Engine name -> its worker harness results, for every ``ENGINE.workers.json``."""
    return {
        p.name.removesuffix(SUFFIX): json.loads(p.read_text())
        for p in sorted(directory.glob(f"*{SUFFIX}"))
    }


def unexpected(workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per case that did not end as it expects (or could not run)."""
    out = []
    for engine, run in workers.items():
        for case in run.get("cases", []):
            if "error" in case:
                out.append(f"{engine} {case['case']}: the harness failed: {case['error']}")
            elif case.get("outcome") != case.get("expected"):
                out.append(
                    f"{engine} {case['case']}: {case.get('outcome')}, expected "
                    f"{case.get('expected')}"
                )
    return out


def _edges(case: Mapping[str, Any]) -> str:
    return f"TP{case['prefill_tp']} → TP{case['decode_tp']}"


def _outcome(case: Mapping[str, Any]) -> str:
    if "error" in case:
        return f"**harness failed**: {case['error']}"
    text = str(case["outcome"])
    if case["outcome"] != case["expected"]:
        text = f"**{text}** (expected {case['expected']})"
    if case["outcome"] == "moved":
        text += (
            f": {case['elements_verified']:,} elements ({case['bytes_verified']:,} bytes) "
            "equal the oracle; no other block written"
        )
    elif case["outcome"] == "refused":
        why = "; ".join(case.get("connector_errors", [])[:1])
        text += f": every request failed, nothing written{f' — {why}' if why else ''}"
    return text


def worker_lines(workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The Markdown section (none when no harness ran)."""
    if not workers:
        return []
    out = [
        "## Real connector workers",
        "",
        "The engine's own worker code moves KV between two TPs over a real transfer "
        "library on CPU, one process per rank (`field/workers/`): the prefill caches hold "
        "the coordinate-hash oracle, every element of every decode cache is checked "
        "afterwards, and each READ's descriptor list is judged by its effect against "
        "kvspec's for the same edge (DESC-1..3). A read verdict is *exact* (the spec's "
        "effect), *whole blocks* (the spec's effect over every slot of the request's "
        "blocks: it also copies the slots past the last token of the request's own last "
        "block, which serving writes before it reads them) or *wrong*.",
        "",
    ]
    for engine, run in workers.items():
        out += [
            f"### {engine} ({run.get('release', '?')})",
            "",
            "| case | TPs | KV heads | outcome | reads exact / whole blocks / wrong | "
            "descriptors posted / DESC-3 minimum |",
            "|---|---|---|---|---|---|",
        ]
        for case in run.get("cases", []):
            if "error" in case:
                out.append(f"| {case['case']} | | | {_outcome(case)} | | |")
                continue
            verdicts = case["reads_by_verdict"]
            out.append(
                f"| {case['case']} | {_edges(case)} | {case['kv_heads']} | {_outcome(case)} | "
                f"{verdicts['exact']} / {verdicts['whole blocks']} / {verdicts['wrong']} | "
                f"{case['descriptors_posted']} / {case['descriptors_minimum']} |"
            )
        out += ["", *_counts(run), ""]
    return out


def _counts(run: Mapping[str, Any]) -> list[str]:
    """Descriptors per request beside the spec's minimum (issue 32's comparison)."""
    rows = []
    for case in run.get("cases", []):
        per: dict[str, dict[str, Any]] = {}
        for read in case.get("reads", []):
            if "verdict" not in read:
                continue
            row = per.setdefault(
                read["request"],
                {"pool": read.get("pool", "?"), "tokens": read["seq_len"], "n": 0, "min": 0},
            )
            row["n"] += read["count"]
            row["min"] += read.get("minimum", 0)
        rows += [
            f"| {case['case']} | {rid} | {r['pool']} | {r['tokens']} | {r['n']} | {r['min']} |"
            for rid, r in per.items()
        ]
    if not rows:
        return []
    return [
        "Descriptors per request (all of its READs) beside DESC-3's minimum for the same "
        "bytes: a fresh pool hands out consecutive block ids, a fragmented one scattered "
        "ids.",
        "",
        "| case | request | pool | tokens | posted | minimum |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def workers_json(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """docs/field-report.json's ``workers``: per engine and case what the Markdown shows."""
    keep = (
        "prefill_tp",
        "decode_tp",
        "kv_heads",
        "outcome",
        "expected",
        "elements_verified",
        "elements_wrong",
        "bytes_verified",
        "stray_nonzero_elements",
        "reads_by_verdict",
        "descriptors_posted",
        "descriptors_minimum",
        "connector_errors",
        "error",
    )
    return {
        engine: {
            "release": run.get("release"),
            "cases": {
                case["case"]: {k: case[k] for k in keep if k in case}
                for case in run.get("cases", [])
            },
        }
        for engine, run in workers.items()
    }
