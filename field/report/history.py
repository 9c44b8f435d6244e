"""The historical corpus in the field report: kvspec's recall on real, fixed bugs.

field/history/bugs/ID.json holds one known KV-transfer bug of an engine (schema in
field/history/README.md): its threads, the last release that has it (``buggy``) and the
first that does not (``fixed``), each with the line that differs, and what of kvspec
meets it (an adapter, the checks, the deployments the thread describes as ``scope``, the
thread's own deployment as replays), or why nothing runs it. `make field` runs the named
checks on both releases (field/history/run.py) into reports/field/history/; this module
judges those reports against the corpus, and renders the table and its JSON.

A failure counts for a bug when its counterexample lies in the bug's scope: the thread's
deployments, stated as facts of the transfer configuration (:func:`scope_facts`), so that
another bug of the same release, failing the same check elsewhere, is not taken for this
one. A release **fails** when a check or replay fails in scope with tier ``corrupts`` or
``breaks`` and serving may reach it (reachable ``yes`` or ``unknown``); it **passes**
when every run completed, nothing failed that way in scope, every replay passed, and (for
the fixed release, whose pass is evidence) something passed: a named check or a replay. A
bug
is **caught** when its buggy release fails and its fixed release passes; **missed** when
an adapter ran on both releases and that did not happen; **not run** when no adapter runs
it on both (the entry says why: the roadmap). Recall is caught / run / total.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from field.report.verdicts import FAILED, HEADLINE_TIERS, counterexample_facts

SIDES = ("buggy", "fixed")
FAILS, PASSES, NOT_RUN, INCOMPLETE = "fails", "passes", "not run", "incomplete"
CAUGHT, MISSED = "caught", "missed"
REQUIRED = ("id", "title", "engine", "threads", "symptom", "harm", "buggy", "fixed", "kvspec")
"""Fields every corpus entry has (field/history/README.md)."""


def scope_facts(counterexample: Any) -> dict[str, Any]:
    """What a bug's ``scope`` can ask of a counterexample: the field report's facts
    (:func:`~field.report.verdicts.counterexample_facts`: dotted paths,
    ``tp_divides``, ``pipeline``) and three of the head ownership rules [HEAD-1, HEAD-2]:
    ``source.replicates_heads`` / ``target.replicates_heads`` (that stage's TP exceeds the
    KV head count, so ranks hold replicas; None for MLA, whose latent every rank holds
    [HEAD-3]) and ``direction`` (``fan-in``: the source TP is larger, ``fan-out``: smaller,
    ``equal``)."""
    facts = counterexample_facts(counterexample)
    heads, mla = facts.get("model.num_kv_heads"), facts.get("model.attention") == "mla"
    for side in ("source", "target"):
        tp = facts.get(f"{side}.tp")
        replicates = None
        if isinstance(tp, int) and isinstance(heads, int) and not mla:
            replicates = tp > heads
        facts[f"{side}.replicates_heads"] = replicates
    src, dst = facts.get("source.tp"), facts.get("target.tp")
    if isinstance(src, int) and isinstance(dst, int):
        facts["direction"] = "fan-in" if src > dst else "fan-out" if src < dst else "equal"
    return facts


def in_scope(scope: Sequence[Mapping[str, Any]], counterexample: Any) -> bool:
    """Whether ``counterexample`` meets any of ``scope``'s conditions (all of one's facts)."""
    facts = scope_facts(counterexample)
    return any(all(facts.get(k) == v for k, v in when.items()) for when in scope)


def load_corpus(directory: Path) -> dict[str, dict[str, Any]]:
    """Bug id -> entry, for every ID.json in ``directory``; an entry that lacks a field,
    or whose id is not its file's name, is refused naming both."""
    corpus = {}
    for path in sorted(directory.glob("*.json")):
        bug = json.loads(path.read_text())
        missing = [k for k in REQUIRED if k not in bug]
        if missing or bug.get("id") != path.stem:
            raise ValueError(
                f"{path}: a corpus entry needs {list(REQUIRED)} and its id as the file name; "
                f"missing {missing}, id {bug.get('id')!r}"
            )
        spec = bug["kvspec"]
        if not spec.get("adapter") and not spec.get("not_run"):
            raise ValueError(f"{path}: kvspec.adapter is empty and kvspec.not_run says nothing")
        corpus[path.stem] = bug
    return corpus


@dataclass
class Failure:
    """One failing check (or replay) of one release, as the bug's judgement needs it."""

    check: str
    tier: str | None
    reachable: str | None
    in_scope: bool
    reason: str
    replay: bool = False

    @property
    def counts(self) -> bool:
        """In scope, corrupts or breaks, and serving may reach it."""
        return self.in_scope and self.tier in HEADLINE_TIERS and self.reachable != "no"


@dataclass
class Side:
    """One release's verdict for one bug."""

    release: str
    verdict: str
    failures: list[Failure] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    replays: list[str] = field(default_factory=list)
    """Each replay's verdict, in the entry's order."""
    note: str = ""

    @property
    def found(self) -> list[Failure]:
        return [f for f in self.failures if f.counts]

    @property
    def other(self) -> list[Failure]:
        """Failures outside the bug's scope or below its tiers (another bug, a hardening
        note, a difference): listed, not counted."""
        return [f for f in self.failures if not f.counts]


@dataclass
class Judged:
    """One bug of the corpus with its verdict."""

    bug: dict[str, Any]
    verdict: str
    sides: dict[str, Side]

    @property
    def id(self) -> str:
        return str(self.bug["id"])


def judge_side(
    bug: Mapping[str, Any], side: str, record: Mapping[str, Any] | None, reports: Path
) -> Side:
    """One release's verdict from the runner's record and the reports it wrote."""
    release = bug[side]["release"]
    if record is None:
        return Side(release, NOT_RUN, note="no run recorded (make field's history step)")
    if record.get("error"):
        return Side(release, INCOMPLETE, note=str(record["error"]))
    scope = bug["kvspec"].get("scope", [])
    out = Side(release, PASSES)
    for n, run in enumerate(record.get("runs", [])):
        path = reports / Path(run["report"]).name
        if "error" in run or not path.exists():
            out.verdict = INCOMPLETE
            out.note = f"exit {run.get('exit')}: {run.get('error', 'no report')}"
            return out
        report = json.loads(path.read_text())
        for r in report["results"]:
            if n > 0:
                out.replays.append(r["verdict"])
            if r["verdict"] != FAILED:
                if r["verdict"] == "passed" and n == 0:
                    out.passed.append(r["check"])
                continue
            out.failures.append(
                Failure(
                    r["check"],
                    r.get("tier"),
                    r.get("reachable_in_serving"),
                    in_scope(scope, r.get("counterexample")),
                    r.get("reason", ""),
                    replay=n > 0,
                )
            )
    if out.found:
        out.verdict = FAILS
    elif any(v != "passed" for v in out.replays):
        out.verdict = INCOMPLETE
        out.note = f"a replay of the thread's deployment ended {out.replays}"
    elif side == "fixed" and not out.passed and not out.replays:
        out.verdict = INCOMPLETE
        out.note = "no named check passed and there is no replay: a pass would be vacuous"
    return out


def judge_history(
    corpus: Mapping[str, Mapping[str, Any]], run: Mapping[str, Any], reports: Path
) -> list[Judged]:
    """Every bug of the corpus with its verdict: caught, missed or not run."""
    records = run.get("bugs", {})
    out = []
    for key, bug in corpus.items():
        record = records.get(key, {})
        if not bug["kvspec"].get("adapter"):
            out.append(Judged(dict(bug), NOT_RUN, {}))
            continue
        sides = {s: judge_side(bug, s, record.get(s), reports) for s in SIDES}
        verdicts = (sides["buggy"].verdict, sides["fixed"].verdict)
        if verdicts == (FAILS, PASSES):
            verdict = CAUGHT
        elif NOT_RUN in verdicts or INCOMPLETE in verdicts:
            verdict = NOT_RUN
        else:
            verdict = MISSED
        out.append(Judged(dict(bug), verdict, sides))
    return out


def recall(judged: Sequence[Judged]) -> dict[str, int]:
    """Caught, run (an adapter ran on both releases), and total."""
    return {
        "caught": sum(j.verdict == CAUGHT for j in judged),
        "run": sum(j.verdict in (CAUGHT, MISSED) for j in judged),
        "total": len(judged),
    }


def _cell(side: Side | None) -> str:
    if side is None:
        return "—"
    if side.verdict == FAILS:
        tiers = sorted({f.tier or "?" for f in side.found})
        checks = sorted({f.check + (" (replay)" if f.replay else "") for f in side.found})
        return f"**fails** ({', '.join(tiers)}): " + ", ".join(f"`{c}`" for c in checks)
    if side.verdict == PASSES:
        replays = f"; replay {'/'.join(side.replays)}" if side.replays else ""
        return f"passes ({len(side.passed)} checks passed{replays})"
    return f"{side.verdict}: {side.note}"


def _escape(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def history_section(judged: Sequence[Judged], run: Mapping[str, Any]) -> list[str]:
    """The report's section: recall, the table, then each bug's finding or roadmap."""
    if not judged:
        return []
    r = recall(judged)
    out = [
        "## Historical field bugs: kvspec's recall",
        "",
        "Known KV-transfer bugs of the engines whose last buggy and first fixed releases "
        "install from PyPI (`field/history/bugs/`, one file each; the line that differs "
        "was read in both wheels). `make field` runs the checks each entry names on both "
        f"releases with the `{run.get('profile', 'ci')}` profile, and replays the "
        "deployment its thread reported (`field/history/run.py`). A release *fails* when "
        "a check fails with tier corrupts or breaks on a deployment in the bug's scope (the "
        "thread's deployments) that serving may reach; the bug is *caught* when the buggy "
        "release fails and the fixed one passes. Failures outside the scope (another bug "
        "of the same release) are listed, not counted.",
        "",
        f"**Recall: {r['caught']} caught of {r['run']} run, {r['total']} in the corpus**"
        f" ({r['total'] - r['run']} not run: no adapter reaches the code that holds them"
        " on both releases).",
        "",
        "| bug | threads | releases (buggy → fixed) | harm | kvspec | buggy release | "
        "fixed release | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for j in judged:
        b, spec = j.bug, j.bug["kvspec"]
        meets = f"`{spec['adapter']}`: " if spec.get("adapter") else "no adapter: "
        meets += ", ".join(f"`{c}`" for c in spec.get("checks", []))
        releases = f"{b['buggy']['release']} → {b['fixed']['release']}"
        out.append(
            f"| [{j.id}](#{j.id}) | {', '.join(b['threads'])} | {releases} | {b['harm']} | "
            f"{_escape(meets)} | {_escape(_cell(j.sides.get('buggy')))} | "
            f"{_escape(_cell(j.sides.get('fixed')))} | **{j.verdict}** |"
        )
    out.append("")
    for j in judged:
        out += _bug_notes(j)
    return out


def _bug_notes(j: Judged) -> list[str]:
    b, spec = j.bug, j.bug["kvspec"]
    out = [
        f"### {j.id}",
        "",
        f"{b['title']} ({b['engine']}; {', '.join(b['threads'])}). {b['symptom']}",
        "",
        f"- buggy {b['buggy']['release']}: {b['buggy']['code']}",
        f"- fixed {b['fixed']['release']}: {b['fixed']['code']}",
        f"- what meets it: {spec.get('meets', '—')}",
    ]
    if j.verdict == NOT_RUN and not j.sides:
        out.append(f"- **not run**: {spec['not_run']}")
    for name, side in j.sides.items():
        for f in side.found:
            out.append(
                f"- {name} {side.release}: `{f.check}`{' (replay)' if f.replay else ''} "
                f"{f.tier}, reachable {f.reachable}: {_escape(f.reason)[:400]}"
            )
        if side.other:
            listed = "; ".join(_not_counted(f) for f in side.other)
            out.append(f"- {name} {side.release}, not counted: {listed}")
        if side.note:
            out.append(f"- {name} {side.release}: {side.verdict}: {_escape(side.note)}")
    if j.verdict == MISSED:
        out.append(f"- **missed**: {spec.get('missed', 'see the releases above')}")
    out.append("")
    return out


def _not_counted(f: Failure) -> str:
    """A failure that does not count for the bug, with why; a corrupts or breaks one also
    with the start of its reason (it may be another bug, or the adapter on an old release)."""
    why = [] if f.in_scope else ["out of scope"]
    if f.reachable == "no":
        why.append("unreachable")
    text = f"`{f.check}` {f.tier}" + (f" ({', '.join(why)})" if why else "")
    if f.tier in HEADLINE_TIERS:
        text += f": {_escape(f.reason)[:160]}"
    return text


def history_json(judged: Sequence[Judged], run: Mapping[str, Any]) -> dict[str, Any]:
    """The same verdicts as data (docs/field-report.json's ``history``)."""
    return {
        "recall": recall(judged),
        "profile": run.get("profile"),
        "bugs": {
            j.id: {
                "title": j.bug["title"],
                "engine": j.bug["engine"],
                "threads": j.bug["threads"],
                "harm": j.bug["harm"],
                "buggy": j.bug["buggy"]["release"],
                "fixed": j.bug["fixed"]["release"],
                "adapter": j.bug["kvspec"].get("adapter"),
                "checks": j.bug["kvspec"].get("checks", []),
                "verdict": j.verdict,
                "not_run": j.bug["kvspec"].get("not_run") if not j.sides else None,
                "releases": {
                    name: {
                        "release": s.release,
                        "verdict": s.verdict,
                        "found": [
                            {"check": f.check, "tier": f.tier, "reachable": f.reachable}
                            for f in s.found
                        ],
                        "not_counted": [
                            {"check": f.check, "tier": f.tier, "in_scope": f.in_scope}
                            for f in s.other
                        ],
                        "replays": s.replays,
                        "note": s.note or None,
                    }
                    for name, s in j.sides.items()
                },
            }
            for j in judged
        },
    }
