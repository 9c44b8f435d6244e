"""`kvspec field-report`: the matrix and triage written from `make field`'s JSON reports."""

import datetime
import json
from pathlib import Path

import pytest

from kvspec.cli import field_report as fr
from kvspec.cli import main


def result(check: str, verdict: str, tried: int = 0, outside: int = 0, **extra) -> dict:
    return {
        "check": check,
        "verdict": verdict,
        "examples_tried": tried,
        "outside_declared_domain": outside,
        "reason": extra.get("reason", ""),
        "counterexample": extra.get("counterexample"),
    }


def report(version: str, *results: dict) -> dict:
    return {
        "adapter": {"name": "x", "version": version},
        "profile": "ci",
        "device": "cpu",
        "results": list(results),
    }


REPORTS = {
    "alpha": report(
        "alpha 1.0",
        result("PLAN-2/exact-cover", "passed", 20, 5),
        result("KEY-3/injective", "FAILED", 1, reason="two keys | one string", counterexample={}),
        result("DTYPE-3/fp8-scales", "not provided", 8, 8),
        result("LAYOUT-3/convert", "not provided"),
    ),
    "beta": report(
        "beta 2.0",
        result("PLAN-2/exact-cover", "inconclusive", 3, 1),
        result("KEY-3/injective", "passed", 4),
    ),
}
TRIAGE = {
    "defects": {
        "alpha-keys": {
            "engine": "alpha",
            "title": "keys collide",
            "detail": "Two transfers, one key.",
            "source": "alpha/keys.py",
            "repro": "field/repro/alpha/keys.py",
            "upstream": None,
        }
    },
    "kvspec": {"scope": {"title": "too wide", "detail": "A check asks too much.", "issue": "12"}},
    "failures": {"alpha": {"KEY-3/injective": {"defect": "alpha-keys"}}},
}
TODAY = datetime.date(2026, 12, 1)


def test_verdicts_read_as_the_matrix_shows_them() -> None:
    results = {r["check"]: r for r in REPORTS["alpha"]["results"]}
    assert fr.cell(results["PLAN-2/exact-cover"]) == "passed (15)"  # 5 were outside
    assert fr.cell(results["KEY-3/injective"]) == "**FAILED**"
    assert fr.cell(results["DTYPE-3/fp8-scales"]) == "outside domain"
    assert fr.cell(results["LAYOUT-3/convert"]) == "not provided"
    assert fr.cell(REPORTS["beta"]["results"][0]) == "inconclusive (2)"
    assert fr.effective({"effective_examples": 7, "examples_tried": 9}) == 7
    assert fr.cell(None) == "—"


def test_the_report_has_the_matrix_the_triage_and_one_generated_line() -> None:
    text = fr.render(REPORTS, TRIAGE, repros={"field/repro/alpha/keys.py": 1}, today=TODAY)
    assert "| check | alpha | beta |" in text
    assert "| PLAN-2/exact-cover | passed (15) | inconclusive (2) |" in text
    assert "- **alpha** (alpha 1.0): 1 passed, 1 FAILED, 1 not provided, 1 outside domain" in text
    assert "real defect [alpha-keys](#alpha-keys-keys-collide): keys collide" in text
    assert "`field/repro/alpha/keys.py` (exits 1 on the pinned version)" in text
    assert "### scope: too wide" in text
    assert "Not provided by any engine (1 checks): `LAYOUT-3/convert`." in text
    assert "| LAYOUT-3/convert |" not in text
    lines = [line for line in text.splitlines() if line.startswith(fr.GENERATED)]
    assert lines == ["Generated: 2026-12-01"]
    later = fr.render(REPORTS, TRIAGE, repros={"field/repro/alpha/keys.py": 1}, today=TODAY)
    assert later == text


def test_a_repro_that_passes_says_the_engine_may_have_fixed_it() -> None:
    text = fr.render(REPORTS, TRIAGE, repros={"field/repro/alpha/keys.py": 0}, today=TODAY)
    assert "no longer fails: the engine may have fixed it" in text


def test_failures_without_triage_are_listed_and_stale_entries_found() -> None:
    assert fr.untriaged_failures(REPORTS, {}, TRIAGE) == []
    bare = {**TRIAGE, "failures": {"beta": {"KEY-3/injective": {"kvspec": "scope"}}}}
    assert fr.untriaged_failures(REPORTS, {}, bare) == [("alpha", "KEY-3/injective")]
    assert fr.stale_triage(REPORTS, bare) == [("beta", "KEY-3/injective")]
    replays = {"beta": [{"check": "PLAN-1/x", "verdict": "FAILED", "why": "w", "reason": ""}]}
    assert fr.untriaged_failures(REPORTS, replays, TRIAGE) == [("beta", "replay PLAN-1/x")]
    text = fr.render(REPORTS, bare, today=TODAY)
    assert "**UNTRIAGED** — add it to field/triage.json" in text


def test_the_command_writes_the_file_and_exits_1_on_untriaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, data in REPORTS.items():
        (reports / f"{name}.json").write_text(json.dumps(data))
    (reports / "alpha.replays.json").write_text(
        json.dumps([{"check": "PLAN-1/x", "verdict": "passed", "why": "a | b", "reason": ""}])
    )
    triage = tmp_path / "triage.json"
    triage.write_text(json.dumps(TRIAGE))
    out = tmp_path / "report.md"
    args = ["field-report", "--reports", str(reports), "--triage", str(triage), "--out", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert text.startswith("# kvspec on real engines")
    assert "| alpha | PLAN-1/x | passed | a \\| b | — |" in text
    triage.write_text(json.dumps({**TRIAGE, "failures": {}}))
    assert main(args) == 1
    assert "UNTRIAGED alpha KEY-3/injective" in capsys.readouterr().err


def test_no_reports_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["field-report", "--reports", str(tmp_path), "--out", "-"]) == 2
    assert "no ENGINE.json reports" in capsys.readouterr().err
