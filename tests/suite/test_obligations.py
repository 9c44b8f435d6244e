"""Every obligation of every clause has a check that exercises it and a mutant it kills."""

import re

import pytest

from kvspec.cli import main
from kvspec.conformance.checks import all_checks
from kvspec.conformance.coverage import coverage, gaps
from kvspec.conformance.mutants import all_mutants
from kvspec.core.clause import Clause, must, refuses
from kvspec.core.clauses import all_clauses, all_obligations, get_obligation
from tests.paths import ROOT


def test_every_clause_splits_into_numbered_obligations() -> None:
    for clause in all_clauses().values():
        assert clause.obligations, f"{clause.id} has no obligation"
        ids = [o.id for o in clause.obligations]
        assert ids == [f"{clause.id}.{i}" for i in range(1, len(ids) + 1)]
        assert all(
            o.kind in ("positive", "negative") and o.clause == clause.id for o in clause.obligations
        )
    assert get_obligation("PAYLOAD-3.8").kind == "negative"
    with pytest.raises(KeyError, match=r"no obligation 'PAYLOAD-3\.99'"):
        get_obligation("PAYLOAD-3.99")


def test_obligations_are_numbered_by_their_clause() -> None:
    clause = Clause("TEST-1", "t", "text", (must("does a"), refuses("b")))
    assert [(o.id, o.kind) for o in clause.obligations] == [
        ("TEST-1.1", "positive"),
        ("TEST-1.2", "negative"),
    ]


def test_every_obligation_has_a_check_and_a_mutant() -> None:
    assert gaps() == []
    rows = coverage()
    assert len(rows) == len(all_obligations())
    covered = {o for c in all_checks() for o in c.covers}
    broken = {o for m in all_mutants() for o in m.obligations}
    assert covered == broken == set(all_obligations())


def test_every_check_and_mutant_names_existing_obligations() -> None:
    known = set(all_obligations())
    for check in all_checks():
        assert check.covers and set(check.covers) <= known, check.id
    for mutant in all_mutants():
        assert set(mutant.obligations) <= known, mutant.name


def test_clauses_coverage_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clauses", "--coverage"]) == 0
    out = capsys.readouterr().out
    summary = out.strip().splitlines()[-1]
    counts = [int(n) for n in re.findall(r"(\d+) (?:obligations|checks|mutants)", summary)]
    assert counts == [len(all_obligations()), len(all_checks()), len(all_mutants())]
    assert "every obligation has a check and a mutant" in summary
    row = next(line for line in out.splitlines() if line.startswith("PAYLOAD-3.8 "))
    assert "PAYLOAD-3/refuses-disagreement" in row and "MissingLayerFilledWithZeros" in row
    assert main(["clauses", "PAYLOAD-3", "--coverage", "--text"]) == 0
    assert "a layer present on one shard and missing on another" in capsys.readouterr().out


def test_docs_list_every_obligation() -> None:
    docs = (ROOT / "docs" / "clauses.md").read_text()
    for obligation in all_obligations():
        assert f"| {obligation} |" in docs


def test_a_corpus_run_reports_every_mutant_with_its_killer() -> None:
    """`kvspec conform --mutants`' report, on a few mutants in two workers. The whole
    corpus through the whole suite runs once, as docs/conformance.md's transcript of
    `kvspec conform --mutants --profile ci` (tests/docs/test_readme.py), and every mutant
    against its own checks in tests/suite/test_conformance_power.py."""
    from kvspec.conformance.mutation import render_mutation, run_corpus

    chosen = all_mutants()[:: max(1, len(all_mutants()) // 4)][:4]
    report = run_corpus(chosen, profile="ci", jobs=2).to_dict()
    assert [r["mutant"] for r in report["results"]] == [m.name for m in chosen]
    assert report["mutants"] == len(chosen) == report["killed"]
    assert report["kill_rate"] == 1.0
    assert all(r["killed_by"] and r["checks_run"] >= 1 for r in report["results"])
    text = render_mutation(run_corpus(chosen[:1], profile="ci"))
    assert "kill rate: 1/1 = 100.0%" in text and chosen[0].name in text
