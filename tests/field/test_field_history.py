"""The historical corpus (field/history/): the runner, the judgement of its reports, the
report's table and recall, and the committed corpus itself. Nothing here needs an engine:
the runner is exercised on kvspec's own reference and one of its mutants standing in for a
fixed and a buggy release."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from field.report import history as fh
from field.report import main
from field.report import verdicts as fr
from tests.field.test_field_report import LEDGER, REPORTS
from tests.paths import ROOT

TP4_TO_TP2 = {  # 2 KV heads: the source replicates them, the target does not
    "source": {"tp": 4, "pp": 1, "layer_partition": None},
    "target": {"tp": 2, "pp": 1, "layer_partition": None},
    "model": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 2, "attention": "mha"},
    "policy": "lowest",
}


def bug(key: str, adapter: str | None = "alpha", **kvspec) -> dict:
    return {
        "id": key,
        "title": f"{key} goes wrong",
        "engine": "alpha",
        "threads": ["alpha/alpha#1"],
        "symptom": "wrong heads, no error",
        "harm": "corrupts",
        "buggy": {"release": "alpha==1.0", "requirements": "alpha-1.0", "code": "a.py:1 `x`"},
        "fixed": {"release": "alpha==1.1", "requirements": "alpha-1.1", "code": "a.py:1 `y`"},
        "kvspec": {
            "adapter": adapter,
            "checks": ["PLAN-2/exact-cover"],
            "scope": [{"source.replicates_heads": True}],
            **({} if adapter else {"not_run": "no adapter reaches a.py"}),
            **kvspec,
        },
    }


def conform_report(*results: dict) -> dict:
    return {"adapter": {"name": "alpha", "version": "alpha"}, "results": list(results)}


def failed(check: str, tier: str, counterexample: dict, reachable: str = "yes") -> dict:
    return {
        "check": check,
        "verdict": "FAILED",
        "tier": tier,
        "reachable_in_serving": reachable,
        "counterexample": counterexample,
        "reason": f"{check} went wrong",
    }


def passed(check: str) -> dict:
    return {"check": check, "verdict": "passed"}


def write_run(tmp_path: Path, key: str, reports: dict[str, list[dict]]) -> dict:
    """The runner's record for one bug, with its reports written: side -> [search, replays]."""
    record = {}
    for side, runs in reports.items():
        record[side] = {"release": side, "runs": []}
        for n, report in enumerate(runs):
            name = f"{key}.{side}.json" if n == 0 else f"{key}.{side}.replay-{n}.json"
            (tmp_path / name).write_text(json.dumps(report))
            record[side]["runs"].append({"report": str(tmp_path / name), "exit": 1})
    return {"profile": "ci", "seconds": 60, "bugs": {key: record}}


# --- what a scope asks of a counterexample ----------------------------------------------


def test_scope_facts_read_head_replication_and_direction() -> None:
    facts = fh.scope_facts({"case": TP4_TO_TP2, "seed": 0})
    assert facts["source.replicates_heads"] is True
    assert facts["target.replicates_heads"] is False
    assert facts["direction"] == "fan-in"
    assert facts["tp_divides"] is True and facts["pipeline"] is False
    mla = {**TP4_TO_TP2, "model": {**TP4_TO_TP2["model"], "attention": "mla"}}
    assert fh.scope_facts(mla)["source.replicates_heads"] is None  # the latent is whole
    fan_out = {**TP4_TO_TP2, "source": {"tp": 1}, "target": {"tp": 4}}
    assert fh.scope_facts(fan_out)["direction"] == "fan-out"
    assert fh.scope_facts(fan_out)["target.replicates_heads"] is True
    nothing = fh.scope_facts(None)  # a failure with no counterexample meets no fact
    assert nothing["source.replicates_heads"] is None and "direction" not in nothing


def test_a_failure_is_in_scope_when_it_meets_any_condition() -> None:
    scope = [{"direction": "fan-out"}, {"source.replicates_heads": True, "pipeline": False}]
    assert fh.in_scope(scope, TP4_TO_TP2)
    assert not fh.in_scope(scope[:1], TP4_TO_TP2)
    piped = {**TP4_TO_TP2, "source": {"tp": 4, "pp": 2}}
    assert not fh.in_scope(scope, piped)
    assert not fh.in_scope([], TP4_TO_TP2)


# --- the judgement -----------------------------------------------------------------------

REPLAY = {"check": "PLAN-2/exact-cover", "why": "the thread's", "example": TP4_TO_TP2}
BUGGY_WITH_REPLAY = [
    conform_report(failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2)),
    conform_report(failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2)),
]
"""The buggy release fails in scope, in its suite run and in the replay of :data:`REPLAY`."""


def test_the_buggy_release_failing_in_scope_and_the_fixed_passing_is_caught(
    tmp_path: Path,
) -> None:
    b = bug("b", replays=[REPLAY])
    other_bug = {**TP4_TO_TP2, "source": {"tp": 1}, "target": {"tp": 2}}  # out of scope
    run = write_run(
        tmp_path,
        "b",
        {
            "buggy": BUGGY_WITH_REPLAY,
            "fixed": [
                conform_report(failed("PLAN-2/exact-cover", "corrupts", other_bug)),
                conform_report(passed("PLAN-2/exact-cover")),
            ],
        },
    )
    [judged] = fh.judge_history({"b": b}, run, tmp_path)
    assert judged.verdict == fh.CAUGHT
    buggy, fixed = judged.sides["buggy"], judged.sides["fixed"]
    assert [f.check for f in buggy.found] == ["PLAN-2/exact-cover"] * 2
    assert buggy.found[1].replay
    assert fixed.verdict == fh.PASSES and fixed.replays == ["passed"]
    assert [f.in_scope for f in fixed.other] == [False]  # another bug, listed only
    assert fh.recall([judged]) == {"caught": 1, "run": 1, "total": 1}


@pytest.mark.parametrize(
    ("buggy", "fixed", "verdict"),
    [
        # the buggy release passes: kvspec did not see it
        ([passed("PLAN-2/exact-cover")], [passed("PLAN-2/exact-cover")], fh.MISSED),
        # both fail in scope: nothing tells the releases apart
        (
            [failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2)],
            [failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2)],
            fh.MISSED,
        ),
        # a hardening note or a difference is not the bug's harm
        (
            [failed("PLAN-2/exact-cover", "accepts-invalid", TP4_TO_TP2)],
            [passed("PLAN-2/exact-cover")],
            fh.MISSED,
        ),
        # serving never reaches it
        (
            [failed("PLAN-2/exact-cover", "breaks", TP4_TO_TP2, reachable="no")],
            [passed("PLAN-2/exact-cover")],
            fh.MISSED,
        ),
    ],
)
def test_what_is_not_a_catch(tmp_path: Path, buggy: list, fixed: list, verdict: str) -> None:
    run = write_run(
        tmp_path, "b", {"buggy": [conform_report(*buggy)], "fixed": [conform_report(*fixed)]}
    )
    [judged] = fh.judge_history({"b": bug("b")}, run, tmp_path)
    assert judged.verdict == verdict
    assert fh.recall([judged]) == {"caught": 0, "run": 1, "total": 1}


def test_a_release_that_could_not_run_makes_the_bug_not_run(tmp_path: Path) -> None:
    run = write_run(tmp_path, "b", {"buggy": [conform_report(passed("PLAN-2/exact-cover"))]})
    run["bugs"]["b"]["fixed"] = {"release": "alpha==1.1", "error": "alpha-1.1 is not installed"}
    [judged] = fh.judge_history({"b": bug("b")}, run, tmp_path)
    assert judged.verdict == fh.NOT_RUN
    assert judged.sides["fixed"].verdict == fh.INCOMPLETE
    assert "not installed" in judged.sides["fixed"].note
    run["bugs"]["b"]["fixed"] = {
        "release": "alpha==1.1",
        "runs": [{"report": "gone.json", "exit": 2, "error": "cannot use alpha"}],
    }
    [judged] = fh.judge_history({"b": bug("b")}, run, tmp_path)
    assert judged.sides["fixed"].note == "exit 2: cannot use alpha"
    [nothing] = fh.judge_history({"b": bug("b")}, {}, tmp_path)
    assert nothing.verdict == fh.NOT_RUN and nothing.sides["buggy"].verdict == fh.NOT_RUN


def test_a_fixed_release_whose_replay_does_not_pass_does_not_pass(tmp_path: Path) -> None:
    inconclusive = {"check": "PLAN-2/exact-cover", "verdict": "inconclusive"}
    run = write_run(
        tmp_path,
        "b",
        {
            "buggy": BUGGY_WITH_REPLAY,
            "fixed": [conform_report(passed("PLAN-2/exact-cover")), conform_report(inconclusive)],
        },
    )
    [judged] = fh.judge_history({"b": bug("b", replays=[REPLAY])}, run, tmp_path)
    assert judged.sides["fixed"].verdict == fh.INCOMPLETE
    assert judged.verdict == fh.NOT_RUN


def test_a_pass_with_nothing_passed_is_not_a_pass(tmp_path: Path) -> None:
    """The fixed release's only failure is another bug's, and nothing else ran: no
    evidence that the bug is gone."""
    other_bug = {**TP4_TO_TP2, "source": {"tp": 1}, "target": {"tp": 2}}
    run = write_run(
        tmp_path,
        "b",
        {
            "buggy": [conform_report(failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2))],
            "fixed": [conform_report(failed("PLAN-2/exact-cover", "corrupts", other_bug))],
        },
    )
    [judged] = fh.judge_history({"b": bug("b")}, run, tmp_path)
    assert judged.sides["fixed"].verdict == fh.INCOMPLETE
    assert "vacuous" in judged.sides["fixed"].note


def test_the_corpus_refuses_an_entry_naming_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(bug("a")))
    assert list(fh.load_corpus(tmp_path)) == ["a"]
    (tmp_path / "b.json").write_text(json.dumps(bug("c")))
    with pytest.raises(ValueError, match=r"b\.json.*id 'c'"):
        fh.load_corpus(tmp_path)
    (tmp_path / "b.json").write_text(json.dumps({k: v for k, v in bug("b").items() if k != "harm"}))
    with pytest.raises(ValueError, match=r"missing \['harm'\]"):
        fh.load_corpus(tmp_path)
    silent = bug("b", adapter=None)
    del silent["kvspec"]["not_run"]
    (tmp_path / "b.json").write_text(json.dumps(silent))
    with pytest.raises(ValueError, match="not_run says nothing"):
        fh.load_corpus(tmp_path)


# --- the report ----------------------------------------------------------------------------


def test_the_report_gains_the_table_with_recall_and_its_json(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for b in (bug("caught-one"), bug("roadmap", adapter=None)):
        (corpus / f"{b['id']}.json").write_text(json.dumps(b))
    reports = tmp_path / "reports"
    runs = reports / "history"
    runs.mkdir(parents=True)
    run = write_run(
        runs,
        "caught-one",
        {
            "buggy": [conform_report(failed("PLAN-2/exact-cover", "corrupts", TP4_TO_TP2))],
            "fixed": [conform_report(passed("PLAN-2/exact-cover"))],
        },
    )
    run["bugs"]["roadmap"] = {"not_run": "no adapter reaches a.py"}
    (runs / "run.json").write_text(json.dumps(run))
    for name, data in REPORTS.items():
        (reports / f"{name}.json").write_text(json.dumps(data))
    ledger = tmp_path / "defects.json"
    ledger.write_text(json.dumps(LEDGER))
    out = tmp_path / "report.md"
    args = ["--reports", str(reports), "--ledger", str(ledger), "--out", str(out)]
    main([*args, "--root", str(tmp_path), "--history", str(corpus)])
    text = out.read_text()
    section = text.split("## Historical field bugs: kvspec's recall\n", 1)[1].split("\n## ")[0]
    assert "**Recall: 1 caught of 1 run, 2 in the corpus** (1 not run" in section
    row = next(line for line in section.splitlines() if line.startswith("| [caught-one]"))
    assert "alpha==1.0 → alpha==1.1" in row and row.endswith("| **caught** |")
    assert "**fails** (corrupts): `PLAN-2/exact-cover`" in row
    assert "- **not run**: no adapter reaches a.py" in section
    data = json.loads(out.with_suffix(".json").read_text())["history"]
    assert data["recall"] == {"caught": 1, "run": 1, "total": 2}
    assert data["bugs"]["caught-one"]["releases"]["buggy"]["found"] == [
        {"check": "PLAN-2/exact-cover", "tier": "corrupts", "reachable": "yes"}
    ]
    assert data["bugs"]["roadmap"]["verdict"] == "not run"
    # no corpus (an installed wheel): no section, no key
    main([*args, "--root", str(tmp_path), "--history", str(tmp_path / "none")])
    assert "Historical field bugs" not in out.read_text()
    assert "history" not in json.loads(out.with_suffix(".json").read_text())


# --- the runner, on kvspec's reference and a mutant -----------------------------------------


@pytest.mark.slow
def test_the_runner_runs_both_releases_and_the_judgement_catches_the_mutant(
    tmp_path: Path,
) -> None:
    """The buggy "release" is a one-bug mutant (a replicated head taken from every replica),
    the fixed one kvspec's reference; each "release" directory is empty (no engine)."""
    replay = {"check": "PLAN-2/exact-cover", "why": "a fan-in", "example": TP4_TO_TP2}
    b = bug("mutant", adapter="reference", replays=[replay])
    b["buggy"]["adapter"] = "kvspec.conformance.families.routing.mutants:ReplicasMergedTwice"
    corpus, engines, out = tmp_path / "bugs", tmp_path / "engines", tmp_path / "out"
    corpus.mkdir()
    (corpus / "mutant.json").write_text(json.dumps(b))
    (engines / "alpha-1.0").mkdir(parents=True)
    (engines / "alpha-1.1").mkdir()
    kvspec = str(Path(sys.executable).parent / "kvspec")
    command = [sys.executable, str(ROOT / "field/history/run.py"), "--corpus", str(corpus)]
    command += ["--engines", str(engines), "--out", str(out), "--kvspec", kvspec]
    done = subprocess.run(
        [*command, "--profile", "quick"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    run = json.loads((out / "run.json").read_text())
    assert [r["exit"] for r in run["bugs"]["mutant"]["buggy"]["runs"]] == [1, 1]
    assert [r["exit"] for r in run["bugs"]["mutant"]["fixed"]["runs"]] == [0, 0]
    [judged] = fh.judge_history(fh.load_corpus(corpus), run, out)
    assert judged.verdict == fh.CAUGHT
    assert {f.tier for f in judged.sides["buggy"].found} == {"corrupts"}
    # a release that is not installed is reported, not skipped in silence
    (engines / "alpha-1.1").rmdir()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "mutant fixed produced no report" in done.stderr
    run = json.loads((out / "run.json").read_text())
    assert "is not installed" in run["bugs"]["mutant"]["fixed"]["error"]


# --- the committed corpus --------------------------------------------------------------------


def test_the_committed_corpus_names_both_releases_and_how_each_is_met() -> None:
    corpus = fh.load_corpus(ROOT / "field/history/bugs")
    assert len(corpus) >= 8  # issue 31: at least 8 known bugs
    requirements = ROOT / "field/history/requirements"
    for key, b in corpus.items():
        assert b["harm"] in fr.HEADLINE_TIERS, key
        assert all("#" in t for t in b["threads"]), key
        for side in fh.SIDES:
            package, _, version = b[side]["release"].partition("==")
            assert package and version and b[side]["code"], (key, side)
            if b["kvspec"].get("adapter"):
                pins = (requirements / f"{b[side]['requirements']}.txt").read_text()
                assert f"\n{package}=={version}\n" in f"\n{pins}", (key, side)
        assert b["buggy"]["release"] != b["fixed"]["release"], key
        if b["kvspec"].get("adapter"):
            assert b["kvspec"]["scope"] and b["kvspec"]["checks"], key
        else:
            assert len(b["kvspec"]["not_run"]) > 80, key  # says why, and what it would need
