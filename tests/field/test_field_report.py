"""The field report builder (`python -m field.report`): the report and its JSON twin,
written from `make field`'s JSON reports (tiers, reachability, causes) and the ledger
field/defects.json."""

import datetime
import json
from pathlib import Path

import pytest

from field.report import main, markdown
from field.report import verdicts as fr
from field.report.json_twin import as_json
from tests.paths import ROOT


def result(check: str, verdict: str, tried: int = 0, outside: int = 0, **extra) -> dict:
    out = {
        "check": check,
        "verdict": verdict,
        "examples_tried": tried,
        "outside_declared_domain": outside,
        "reason": extra.pop("reason", ""),
        "counterexample": extra.pop("counterexample", None),
    }
    if verdict == "FAILED":
        out.update(tier=None, obligation=None, reachable_in_serving=None)
        out.update(reachability_evidence="", pytest=None)
    out.update(extra)
    return out


def report(version: str, *results: dict, causes: list | None = None) -> dict:
    out = {
        "adapter": {"name": "x", "version": version},
        "profile": "ci",
        "device": "cpu",
        "results": list(results),
    }
    failed = [r for r in results if r["verdict"] == "FAILED"]
    if failed and failed[0].get("tier"):
        out["summary_by_tier"] = {t: sum(r["tier"] == t for r in failed) for t in fr.TIERS}
        out["fail_on"] = ["corrupts", "breaks"]
    if causes is not None:
        out["causes"] = causes
    return out


PAIRING = {"source": {"tp": 1, "pp": 2}, "target": {"tp": 1, "pp": 1}}
REPORTS = {
    "alpha": report(
        "alpha 1.0",
        result("PLAN-2/exact-cover", "passed", 20, 5),
        result(
            "RESHARD-2/round-trip",
            "FAILED",
            1,
            reason="8 of 24 elements differ [RESHARD-2.1]",
            counterexample=PAIRING,
            tier="corrupts",
            obligation="RESHARD-2.1",
            reachable_in_serving="yes",
            reachability_evidence="alpha's server_args accept PP2 -> PP1",
        ),
        result(
            "DTYPE-2/special-values",
            "FAILED",
            1,
            reason="NaN differs [DTYPE-2.1]",
            counterexample=PAIRING,
            tier="corrupts",
            reachable_in_serving="yes",
            reachability_evidence="alpha's server_args accept PP2 -> PP1",
        ),
        result(
            "KEY-3/refuses-outside-domain",
            "FAILED",
            1,
            reason="request_id='' accepted [KEY-3.1]",
            counterexample={"request_id": ""},
            tier="accepts-invalid",
            reachable_in_serving="no",
            reachability_evidence="request ids are engine-generated (alpha/ids.py)",
        ),
        result(
            "PLAN-2/replicas",
            "FAILED",
            1,
            reason="two senders of identical bytes [PLAN-2.2]",
            tier="differs",
            reachable_in_serving="yes",
        ),
        result("DTYPE-3/fp8-scales", "not provided", 8, 8),
        result("LAYOUT-3/convert", "not provided"),
        causes=[
            {
                "headline": "RESHARD-2/round-trip",
                "tier": "corrupts",
                "reachable_in_serving": "yes",
                "counterexample": PAIRING,
                "consequences": ["DTYPE-2/special-values"],
            },
            {
                "headline": "KEY-3/refuses-outside-domain",
                "tier": "accepts-invalid",
                "reachable_in_serving": "no",
                "counterexample": {"request_id": ""},
                "consequences": [],
            },
            {
                "headline": "PLAN-2/replicas",
                "tier": "differs",
                "reachable_in_serving": "yes",
                "counterexample": None,
                "consequences": [],
            },
        ],
    ),
    "beta": report(
        "beta 2.0",
        result("PLAN-2/exact-cover", "inconclusive", 3, 1),
        result("RESHARD-2/round-trip", "passed", 4),
    ),
}


def entry(engine: str, title: str, status: str, **extra) -> dict:
    return {
        "engine": engine,
        "title": title,
        "detail": f"What {title} does.",
        "source": f"{engine}/x.py",
        "repro": f"field/repro/{engine}/{title.replace(' ', '_')}.py",
        "upstream": None,
        "status": status,
        "was": "previous report: real defect",
        "verdict": "re-triaged",
        **extra,
    }


LEDGER = {
    "defects": {
        "alpha-pairing": entry(
            "alpha",
            "layers paired wrong",
            "open",
            severity="material",
            impact="field/impact/alpha.json",
            upstream="alpha/alpha#7",
            upstream_draft="field/upstream/alpha-pairing.md",
        ),
        "alpha-keys": entry(
            "alpha", "empty ids accepted", "hardening", reason="ids are engine-generated"
        ),
        "alpha-replicas": entry(
            "alpha", "every replica writes", "differs", reason="identical bytes, counted"
        ),
        "alpha-ghost": entry(
            "alpha",
            "ranks out of range",
            "withdrawn",
            reason="ranks come from the TP group",
            evidence={
                "tier": "accepts-invalid",
                "reachable_in_serving": "no",
                "reachability_evidence": "get_tp_group().rank_in_group",
            },
        ),
        "alpha-outside": entry(
            "alpha",
            "found by a repro",
            "open",
            severity="minor",
            evidence={
                "tier": "breaks",
                "reachable_in_serving": "yes",
                "reachability_evidence": "start-up checks accept a zero partition",
            },
        ),
    },
    "kvspec": {"scope": {"title": "too wide", "detail": "A check asks too much.", "issue": "12"}},
    "failures": {
        "alpha": {
            "RESHARD-2/round-trip": {"defect": "alpha-pairing"},
            "KEY-3/refuses-outside-domain": {"defect": "alpha-keys"},
            "PLAN-2/replicas": {"defect": "alpha-replicas"},
        }
    },
}
IMPACT = {  # the shape of field/impact/sglang_pp_pairing.json
    "deployments": [
        {
            "model": "m-32",
            "num_layers": 32,
            "prefill": {"tp": 1, "pp": 3, "split": [10, 11, 11]},
            "engine_starts": True,
            "start_evidence": "get_pp_indices and make_layers accept PP3 for 32 layers" * 2,
            "misrouted_writes": {"K": 0, "V": 32},
            "hit": True,
        },
        {"model": "m-32", "num_layers": 32, "prefill": {"tp": 1, "pp": 2, "split": [16, 16]}}
        | {"engine_starts": True, "misrouted_writes": {"K": 0, "V": 0}, "hit": False},
        {"model": "m-2", "num_layers": 2, "prefill": {"tp": 1, "pp": 3, "split": [0, 1, 1]}}
        | {"engine_starts": False, "misrouted_writes": {"K": 0, "V": 1}, "hit": True},
    ]
}
TODAY = datetime.date(2026, 12, 1)


def render(ledger=LEDGER, reports=REPORTS, **kw) -> str:
    run = fr.judge(reports, ledger, impacts={"field/impact/alpha.json": IMPACT}, **kw)
    return markdown.render(reports, ledger, run, today=TODAY)


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_tiers_are_the_conformance_suites() -> None:
    tiers = pytest.importorskip("kvspec.conformance.tiers")
    assert fr.TIERS == tiers.TIERS


def test_verdicts_read_as_the_matrix_shows_them() -> None:
    results = {r["check"]: r for r in REPORTS["alpha"]["results"]}
    assert fr.cell(results["PLAN-2/exact-cover"]) == "passed (15)"  # 5 were outside
    assert fr.cell(results["RESHARD-2/round-trip"]) == "**FAILED** (corrupts)"
    assert fr.cell(results["KEY-3/refuses-outside-domain"]) == (
        "**FAILED** (accepts-invalid, unreachable)"
    )
    assert fr.cell(results["DTYPE-3/fp8-scales"]) == "outside domain"
    assert fr.cell(results["LAYOUT-3/convert"]) == "not provided"
    assert fr.cell(REPORTS["beta"]["results"][0]) == "inconclusive (2)"
    assert fr.cell({"check": "x", "verdict": "FAILED"}) == "**FAILED**"  # an old report
    assert fr.effective({"effective_examples": 7, "examples_tried": 9}) == 7
    assert fr.cell(None) == "—"


def test_the_headline_counts_reachable_corrupts_and_breaks_one_per_cause() -> None:
    run = fr.judge(REPORTS, LEDGER, impacts={"field/impact/alpha.json": IMPACT})
    assert run.untriaged == [] and run.contradictions == []
    heads = {k for k, d in run.defects.items() if d.headline}
    assert heads == {"alpha-pairing", "alpha-outside"}
    pairing = run.defects["alpha-pairing"]
    # the cause's consequence joins its headline: one defect, two failing checks
    assert pairing.checks == ["alpha RESHARD-2/round-trip", "alpha DTYPE-2/special-values"]
    assert (pairing.tier, pairing.reachable) == ("corrupts", "yes")
    assert pairing.evidence == "alpha's server_args accept PP2 -> PP1"
    assert run.defects["alpha-outside"].tier == "breaks"  # the ledger's own finding
    text = markdown.render(REPORTS, LEDGER, run, today=TODAY)
    top = section(text, "Headline")
    assert "**2 defects** corrupt KV or break a deployment" in top
    assert "1 material, 1 minor" in top
    assert top.index("alpha-pairing") < top.index("alpha-outside")  # material first
    assert "Impact: 1 of 2 deployments swept that the engine starts hit it (m-32)" in top
    assert "Upstream: alpha/alpha#7; draft `field/upstream/alpha-pairing.md`" in top
    assert "alpha-keys" not in top and "alpha-replicas" not in top
    assert "1 hardening notes" in top and "1 legitimate differences" in top
    assert "1 withdrawn claims" in top
    assert "(2 corrupts, 0 breaks, 1 accepts-invalid, 1 differs)" in top
    table = section(text, "Defects")
    assert "| model | num layers | prefill | misrouted writes |" in table
    assert "| m-32 | 32 | tp 1, pp 3, split 10,11,11 | K 0, V 32 |" in table
    assert "split 16,16" not in table  # only the rows the sweep marks hit
    assert "m-2" not in table  # the engine refuses that deployment at start-up


def test_hardening_differences_withdrawn_and_unreachable_are_listed_apart() -> None:
    text = render()
    assert "### alpha-keys: empty ids accepted" in section(text, "Hardening notes")
    assert "ids are engine-generated" in section(text, "Hardening notes")
    diffs = section(text, "Legitimate differences from kvspec's choices")
    assert "### alpha-replicas: every replica writes" in diffs
    assert "identical bytes, counted" in diffs
    gone = section(text, "Withdrawn")
    assert "ranks come from the TP group" in gone and "get_tp_group().rank_in_group" in gone
    unreachable = section(text, "Unreachable in serving")
    assert "alpha **KEY-3/refuses-outside-domain** (accepts-invalid): request ids are " in (
        unreachable
    )
    ledger = section(text, "Re-triage ledger")
    assert ledger.count("| previous report: real defect |") == 5  # every claim stays
    assert "| withdrawn: re-triaged | accepts-invalid | no |" in ledger
    causes = section(text, "Failures by root cause")
    assert "- **RESHARD-2/round-trip** (corrupts, reachable: yes)" in causes
    assert "consequences: `DTYPE-2/special-values`" in causes
    assert "**UNTRIAGED**" not in text and "## Needs triage" not in text


def test_the_json_twin_has_each_defects_verdict() -> None:
    run = fr.judge(
        REPORTS,
        LEDGER,
        repros={
            "field/repro/alpha/layers_paired_wrong.py": 1,
            "field/upstream/alpha-pairing.md": 1,
        },
        impacts={"field/impact/alpha.json": IMPACT},
    )
    data = as_json(REPORTS, run)
    assert data["headline"] == ["alpha-outside", "alpha-pairing"]
    assert data["engines"] == {"alpha": "alpha 1.0", "beta": "beta 2.0"}
    pairing = data["defects"]["alpha-pairing"]
    assert pairing["status"] == "open" and pairing["tier"] == "corrupts"
    assert pairing["reachable_in_serving"] == "yes"
    assert pairing["reachability_evidence"] == "alpha's server_args accept PP2 -> PP1"
    assert pairing["impact"] == {
        "sweep": "field/impact/alpha.json",
        "summary": "1 of 2 deployments swept that the engine starts hit it (m-32)",
    }
    assert pairing["upstream"] == "alpha/alpha#7"
    assert pairing["repro"] == "field/repro/alpha/layers_paired_wrong.py"
    assert pairing["repro_exit"] == 1
    assert pairing["upstream_draft_repro_exit"] == 1
    gone = data["defects"]["alpha-ghost"]
    assert (gone["status"], gone["reason"]) == ("withdrawn", "ranks come from the TP group")
    assert data["defects"]["alpha-keys"]["reachable_in_serving"] == "no"
    assert data["defects"]["alpha-replicas"]["tier"] == "differs"
    assert json.loads(json.dumps(data)) == data


def test_a_consequence_needs_no_entry_of_its_own_but_a_cause_does() -> None:
    bare = {**LEDGER, "failures": {"alpha": {"RESHARD-2/round-trip": {"defect": "alpha-pairing"}}}}
    assert fr.untriaged_failures(REPORTS, {}, bare) == [
        ("alpha", "KEY-3/refuses-outside-domain"),
        ("alpha", "PLAN-2/replicas"),
    ]
    replays = {"beta": [{"check": "PLAN-1/x", "verdict": "FAILED", "why": "w", "reason": ""}]}
    assert ("beta", "replay PLAN-1/x") in fr.untriaged_failures(REPORTS, replays, LEDGER)
    text = render(bare)
    assert "**UNTRIAGED** alpha PLAN-2/replicas — add it to field/defects.json" in text
    stale = {**LEDGER, "failures": {"beta": {"RESHARD-2/round-trip": {"kvspec": "scope"}}}}
    assert fr.stale_triage(REPORTS, stale) == [("beta", "RESHARD-2/round-trip")]


def test_the_run_contradicting_a_verdict_is_caught_both_ways() -> None:
    defects = dict(LEDGER["defects"])
    # an open defect whose only failure the engine rejects at start-up
    defects["alpha-keys"] = {**defects["alpha-keys"], "status": "open", "severity": "minor"}
    # a withdrawn one the run shows corrupting in a deployment serving accepts
    defects["alpha-pairing"] = {**defects["alpha-pairing"], "status": "hardening"}
    run = fr.judge(REPORTS, {**LEDGER, "defects": defects})
    assert run.contradictions == [
        "alpha-pairing is hardening, but alpha RESHARD-2/round-trip corrupts is reachable "
        "in serving",
        "alpha-keys is open, but no reachable corrupts/breaks evidence supports it",
    ]
    assert {k for k, d in run.defects.items() if d.headline} == {"alpha-outside"}


def test_reports_without_tiers_still_render_from_the_ledgers_evidence() -> None:
    old = {"alpha": report("alpha 0.9", result("KEY-3/injective", "FAILED", 1))}
    for r in old["alpha"]["results"]:
        for key in ("tier", "reachable_in_serving", "reachability_evidence"):
            r.pop(key)
    ledger = {**LEDGER, "failures": {"alpha": {"KEY-3/injective": {"defect": "alpha-outside"}}}}
    run = fr.judge(old, ledger)
    assert run.untriaged == []
    assert run.defects["alpha-outside"].headline
    assert "alpha-pairing is open" in run.contradictions[0]  # nothing supports it now
    text = markdown.render(old, ledger, run, today=TODAY)
    assert "| KEY-3/injective | **FAILED** |" in text


def test_a_repro_that_passes_says_the_engine_may_have_fixed_it() -> None:
    repro = "field/repro/alpha/layers_paired_wrong.py"
    assert "no longer fails: the engine may have fixed it" in render(repros={repro: 0})
    assert f"`{repro}` (exits 1 on the pinned version)" in render(repros={repro: 1})
    draft = "field/upstream/alpha-pairing.md"
    assert f"`{draft}` (its standalone repro exits 1 on the pinned version)" in render(
        repros={draft: 1}
    )


def test_only_the_generated_line_varies() -> None:
    text = render()
    lines = [line for line in text.splitlines() if line.startswith(fr.GENERATED)]
    assert lines == ["Generated: 2026-12-01"]
    assert render() == text
    assert "Not provided by any engine (1 checks): `LAYOUT-3/convert`." in text


def test_the_command_writes_both_files_and_exits_1_on_untriaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, data in REPORTS.items():
        (reports / f"{name}.json").write_text(json.dumps(data))
    (reports / "alpha.replays.json").write_text(
        json.dumps([{"check": "PLAN-1/x", "verdict": "passed", "why": "a | b", "reason": ""}])
    )
    (tmp_path / "field" / "impact").mkdir(parents=True)
    (tmp_path / "field" / "impact" / "alpha.json").write_text(json.dumps(IMPACT))
    ledger = tmp_path / "defects.json"
    ledger.write_text(json.dumps(LEDGER))
    out = tmp_path / "report.md"
    args = ["--reports", str(reports), "--ledger", str(ledger)]
    args += ["--out", str(out), "--root", str(tmp_path)]
    assert main(args) == 0
    text = out.read_text()
    assert text.startswith("# kvspec on real engines")
    assert "| alpha | PLAN-1/x | passed | a \\| b | — |" in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert (
        data["defects"]["alpha-pairing"]["impact"]["summary"]
        == "1 of 2 deployments swept that the engine starts hit it (m-32)"
    )
    ledger.write_text(json.dumps({**LEDGER, "failures": {}}))
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "UNTRIAGED alpha RESHARD-2/round-trip" in err


def test_no_reports_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--reports", str(tmp_path), "--out", "-"]) == 2
    assert "no ENGINE.json reports" in capsys.readouterr().err


# --- the committed ledger --------------------------------------------------------------

PREVIOUS_REPORT = {  # docs/field-report.md before issue 28: 11 "real defects", 12 repros
    "omni-replicated-fan-in",
    "omni-replicated-fan-out",
    "omni-layout-guess",
    "omni-key-collision",
    "omni-port-collision",
    "omni-merge-unchecked",
    "omni-marker-only-warns",
    "omni-rank-range",
    "sglang-replicated-prefill-heads",
    "sglang-non-dividing-tp",
    "sglang-pp-layer-pairing",
    "sglang-empty-stage",
}


def test_the_ledger_keeps_every_earlier_claim_with_a_verdict() -> None:
    ledger = json.loads((ROOT / fr.LEDGER).read_text())
    defects = ledger["defects"]
    assert set(defects) >= PREVIOUS_REPORT
    for key, d in defects.items():
        assert d["status"] in fr.STATUSES, key
        assert d.get("was") and d.get("verdict"), key
        assert (ROOT / d["repro"]).exists(), key
        if d["status"] == fr.OPEN:
            assert d["severity"] in ("material", "minor"), key
            assert d["evidence"]["tier"] in fr.HEADLINE_TIERS, key
            assert d["evidence"]["reachable_in_serving"] == "yes", key
            assert d["evidence"]["reachability_evidence"], key
            assert (ROOT / d["upstream_draft"]).exists(), key
        else:
            assert d.get("reason"), key
    for engine, checks in ledger["failures"].items():
        for check, entries in checks.items():
            for e in entries if isinstance(entries, list) else [entries]:
                assert e.get("defect") in defects or e.get("kvspec") in ledger["kvspec"], (
                    engine,
                    check,
                )
    pairing = defects["sglang-pp-layer-pairing"]
    assert pairing["status"] == "open" and "sgl-project/sglang#27740" in pairing["upstream"]
    assert defects["sglang-replicated-prefill-heads"]["status"] == "differs"


def test_each_draft_upstream_issue_has_a_standalone_repro_without_kvspec() -> None:
    """The block `field/run.sh` extracts and runs against the pinned engine: Python that
    parses, imports the engine and not kvspec, and exits by itself."""
    import ast
    import re

    ledger = json.loads((ROOT / fr.LEDGER).read_text())
    drafts = {
        d["upstream_draft"]: d["status"]
        for d in ledger["defects"].values()
        if d.get("upstream_draft")
    }
    assert set(drafts) == {str(p.relative_to(ROOT)) for p in (ROOT / "field/upstream").glob("*.md")}
    for draft, status in sorted(drafts.items()):
        text = (ROOT / draft).read_text()
        # a hardening note is a suggestion, never a report of harm (issue 43)
        opening = "## What happens today" if status == "hardening" else "## What breaks"
        assert (status == "hardening") == ("Suggestion:" in text.split("\n## ", 1)[0]), draft
        for heading in (opening, "## Which deployments", "## Fix direction"):
            assert heading in text, (draft, heading)
        block = text.split("\n## Standalone repro", 1)[1]
        code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
        tree = ast.parse(code)
        imported = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        assert "kvspec" not in imported, draft
        assert "sys" in imported and "sys.exit(" in code, draft


def test_a_claim_awaiting_re_triage_is_shown_and_fails_the_run() -> None:
    defects = {**LEDGER["defects"], "alpha-later": entry("alpha", "not judged yet", "pending")}
    run = fr.judge(REPORTS, {**LEDGER, "defects": defects})
    assert run.contradictions == ["alpha-later awaits re-triage (status pending)"]
    text = markdown.render(REPORTS, {**LEDGER, "defects": defects}, run, today=TODAY)
    assert "### alpha-later: not judged yet" in section(text, "Awaiting re-triage")
    assert "1 awaiting re-triage" in section(text, "Headline")


def test_an_unconfirmed_candidate_is_listed_apart_and_not_counted() -> None:
    candidate = entry(
        "alpha",
        "views misread",
        "unconfirmed",
        reason="needs a GPU to confirm the backend",
        evidence={
            "tier": "corrupts",
            "reachable_in_serving": "unknown",
            "reachability_evidence": "plausible with backend X",
        },
    )
    ledger = {**LEDGER, "defects": {**LEDGER["defects"], "alpha-views": candidate}}
    run = fr.judge(REPORTS, ledger)
    assert run.contradictions == [] and not run.defects["alpha-views"].headline
    text = markdown.render(REPORTS, ledger, run, today=TODAY)
    assert "**2 defects**" in section(text, "Headline")
    assert "1 candidates whose reachability is not confirmed" in section(text, "Headline")
    listed = section(text, "Candidates not confirmed in serving")
    assert "### alpha-views: views misread" in listed and "plausible with backend X" in listed


def test_one_check_can_show_different_defects_by_its_counterexample() -> None:
    options = [
        {"defect": "tp", "when": {"tp_divides": False}},
        {"defect": "pp", "when": {"pipeline": True}},
        {"defect": "replicas", "when": {"model.attention": "mha"}},
    ]
    config = {"source": {"tp": 3, "pp": 1}, "target": {"tp": 2, "pp": 1}, "model": {}}
    assert fr.resolve_entry(options, {"case": config, "seed": 0}) == {"defect": "tp"}
    config = {**config, "target": {"tp": 1, "pp": 2}}
    assert fr.resolve_entry(options, config) == {"defect": "pp"}
    config = {**config, "target": {"tp": 1, "pp": 1}, "model": {"attention": "mha"}}
    assert fr.resolve_entry(options, config) == {"defect": "replicas"}
    assert fr.resolve_entry(options, {**config, "model": {"attention": "mla"}}) is None
    assert fr.resolve_entry({"kvspec": "x"}, None) == {"kvspec": "x"}
    ledger = {**LEDGER, "failures": {"alpha": {**LEDGER["failures"]["alpha"]}}}
    ledger["failures"]["alpha"]["RESHARD-2/round-trip"] = [
        {"defect": "alpha-keys", "when": {"tp_divides": False}},
        {"defect": "alpha-pairing", "when": {"pipeline": True}},
    ]
    run = fr.judge(REPORTS, ledger)  # PAIRING is PP2 -> PP1 with TP1 on both sides
    assert run.defects["alpha-pairing"].checks[0] == "alpha RESHARD-2/round-trip"


def test_the_builder_is_out_of_the_wheel_and_the_kvspec_command():
    """The report builder is the project's tool (issue 41): `kvspec` has no field-report
    subcommand, the wheel packages no field/ module, and no kvspec module imports field/."""
    import ast
    import re

    from kvspec.cli import build_parser

    subcommands = next(
        a for a in build_parser()._actions if getattr(a, "choices", None) and "conform" in a.choices
    )
    assert "field-report" not in subcommands.choices
    find = re.search(
        r"\[tool\.setuptools\.packages\.find\]\ninclude = \[(.*?)\]",
        (ROOT / "pyproject.toml").read_text(),
    )
    assert find is not None
    assert re.findall(r'"([^"]+)"', find.group(1)) == ["kvspec*", "sim*"]
    importers = []
    for path in sorted((ROOT / "kvspec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            importers += [str(path) for n in names if n == "field" or n.startswith("field.")]
    assert importers == []


def test_a_serving_verdict_decides_over_the_functions_tiers_and_shows_them() -> None:
    """Where serving turns what the functions compute into another outcome (issue 43: a
    transfer that never starts fails at the bootstrap timeout), the ledger's ``serving``
    verdict sets the tier and the headline; the run's own tiers stay listed beside it."""
    timeout = {
        "tier": "breaks",
        "reachable_in_serving": "yes",
        "evidence": "the unread prefill rank stays bootstrapping; every request times out",
    }
    defects = dict(LEDGER["defects"])
    defects["alpha-pairing"] = {**defects["alpha-pairing"], "serving": timeout}
    run = fr.judge(REPORTS, {**LEDGER, "defects": defects})
    pairing = run.defects["alpha-pairing"]
    assert (pairing.tier, pairing.reachable) == ("breaks", "yes")
    assert pairing.run_tiers == ["corrupts"] and pairing.headline
    assert run.contradictions == []
    text = markdown.render(REPORTS, {**LEDGER, "defects": defects}, run, today=TODAY)
    assert "(alpha, breaks, material)" in section(text, "Headline")
    assert "- the engine's functions in this run: corrupts (the serving verdict" in text
    assert as_json(REPORTS, run)["defects"]["alpha-pairing"]["run_tiers"] == ["corrupts"]
    # a hardening note the run shows corrupting is no contradiction once serving says why
    unreachable = {**timeout, "reachable_in_serving": "no"}
    defects["alpha-pairing"] = {
        **defects["alpha-pairing"],
        "status": "hardening",
        "serving": unreachable,
    }
    run = fr.judge(REPORTS, {**LEDGER, "defects": defects})
    assert run.contradictions == [] and not run.defects["alpha-pairing"].headline
    # an open defect whose serving verdict is unreachable is a contradiction
    defects["alpha-pairing"] = {**defects["alpha-pairing"], "status": "open"}
    run = fr.judge(REPORTS, {**LEDGER, "defects": defects})
    assert run.contradictions == [
        "alpha-pairing is open, but no reachable corrupts/breaks evidence supports it"
    ]


def test_a_drafted_upstream_comment_is_named_by_its_entry_and_needs_no_kvspec() -> None:
    """field/upstream/comments/: comments on open upstream threads (issue 43: the PP
    pairing on sgl-project/sglang#33457), each named by a ledger entry, with a script that
    imports the engine and torch only and exits by itself."""
    import ast
    import re

    ledger = json.loads((ROOT / fr.LEDGER).read_text())
    named = {d["upstream_comment"] for d in ledger["defects"].values() if d.get("upstream_comment")}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "field/upstream/comments").glob("*.md")}
    assert named == on_disk and named
    for comment in sorted(named):
        code = re.search(r"```python\n(.*?)```", (ROOT / comment).read_text(), re.S).group(1)
        imported = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(ast.parse(code))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        assert imported <= {"sys", "types", "torch", "sglang", "vllm", "vllm_omni"}, comment
        assert "sys.exit(" in code, comment
