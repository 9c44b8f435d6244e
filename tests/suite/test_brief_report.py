"""`kvspec conform`'s default report fits a screen (issue 43, item 2): one summary line by
tier, each cause with its counterexample and paste-ready test, one line per family not
run, and a last line saying what set the exit status; `--verbose` gives the full listing.

The line counts are of the real output of the commands a user types (stdout and stderr
together), on a scaffold from `kvspec adapter new` with one bug planted and one capability
deleted, as a connector engineer's first week leaves it."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance.checks import all_checks

SCREEN = 40
"""The issue's "at most about 40 lines" for a one-failure run."""
FLAGS = ("--profile", "quick")


def _kvspec() -> list[str]:
    script = shutil.which("kvspec", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "kvspec"]


def _without_methods(source: str, names: set[str]) -> str:
    """``source`` with the methods called ``names`` (and their comments above) deleted."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    doomed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            first = node.lineno - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#"):
                first -= 1
            doomed |= set(range(first, node.end_lineno or node.lineno))
    return "".join(line for i, line in enumerate(lines) if i not in doomed)


@pytest.fixture(scope="module")
def one_bug_scaffold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`kvspec adapter new`'s scaffold whose legacy key swaps the two stages (the from
    stage written where the to stage goes) and whose paged cache protocol was deleted, its
    methods with it (an engine without one)."""
    where = tmp_path_factory.mktemp("scaffold")
    made = subprocess.run(
        [*_kvspec(), "adapter", "new", "conn_adapter"], cwd=where, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    path = where / "conn_adapter.py"
    right = (
        "    def legacy_key(self, *args: Any, **kwargs: Any) -> str:\n"
        "        return legacy_key(*args, **kwargs)\n"
    )
    source = path.read_text()
    assert source.count(right) == 1
    source = source.replace(
        right,
        "    def legacy_key(self, request_id: str, from_stage: int, to_stage: int) -> str:\n"
        "        return legacy_key(request_id, to_stage, from_stage)\n",
    )
    source = _without_methods(source, {"gather", "scatter"})
    # deleted from the bases and the imports with its methods, as the scaffold says
    assert source.count("    PagedProtocol,\n") == 2
    source = source.replace("    PagedProtocol,\n", "")
    assert "def gather" not in source and "def scatter" not in source
    path.write_text(source)
    return where


def _conform(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_kvspec(), "conform", "conn_adapter:adapter", *FLAGS, *args],
        cwd=where,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def default_run(one_bug_scaffold: Path) -> subprocess.CompletedProcess[str]:
    return _conform(one_bug_scaffold, "--json", "report.json")


def test_a_one_failure_run_fits_a_screen(
    one_bug_scaffold: Path, default_run: subprocess.CompletedProcess[str]
) -> None:
    printed = (default_run.stdout + default_run.stderr).splitlines()
    report = json.loads((one_bug_scaffold / "report.json").read_text())
    assert default_run.returncode == 1, default_run.stdout + default_run.stderr
    assert len(report["causes"]) == 1, report["causes"]
    assert report["summary"]["passed"] > 100  # the whole suite ran, not a --clause
    assert len(printed) <= SCREEN, "\n".join(printed)


def test_the_screen_holds_the_summary_the_cause_its_test_and_why_it_failed(
    one_bug_scaffold: Path, default_run: subprocess.CompletedProcess[str]
) -> None:
    report = json.loads((one_bug_scaffold / "report.json").read_text())
    [cause] = report["causes"]
    headline = next(r for r in report["results"] if r["check"] == cause["headline"])
    lines = default_run.stdout.splitlines()
    by_tier = ", ".join(f"{t} {n}" for t, n in report["summary_by_tier"].items())
    assert lines[1].startswith(f"by tier: {by_tier}; ")
    assert f"cause 1 of 1: {cause['tier']}  {cause['headline']}  [{cause['obligation']}]" in (
        default_run.stdout
    )
    assert f"  counterexample: {json.dumps(headline['counterexample'])}" in lines
    test_lines = [f"    {line}" if line else "" for line in headline["pytest"].splitlines()]
    at = lines.index(test_lines[0])
    assert lines[at : at + len(test_lines)] == test_lines  # the whole test, pasteable
    paged = [c for c in all_checks() if "paged" in c.needs]
    families = {c.clause.split("-")[0] for c in paged}
    for family in families:  # one line per family, not one per check
        [line] = [x for x in lines if x.startswith(f"  {family}: ")]
        assert "paged" in line
    assert not any(c.id in default_run.stdout for c in paged)
    last = lines[-1]
    assert last.startswith("exit status 1: 1 failure(s) in a --fail-on tier (corrupts,breaks)")
    assert cause["headline"] in last
    assert default_run.stderr == ""  # no progress lines off a terminal


def test_verbose_gives_every_check_and_a_progress_line_each(one_bug_scaffold: Path) -> None:
    run = _conform(one_bug_scaffold, "--verbose", "--clause", "KEY")
    keys = [c for c in all_checks() if c.clause.startswith("KEY-")]
    assert run.returncode == 1
    for check in keys:
        assert any(line.startswith(check.id) for line in run.stdout.splitlines()), check.id
        assert f"/{len(keys)}] {check.id}" in run.stderr
    assert "or in Python:" in run.stdout and "failures, by cause" in run.stdout


def test_the_last_line_says_why_nothing_failed_the_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hardening note (accepts-invalid) is reported and the last line says why it does not
    fail an engine's build."""
    code = main(
        [
            "conform",
            "kvspec.conformance.families.naming.mutants:EmptyRequestIdAccepted",
            "--check",
            "KEY-3/refuses-outside-domain",
            *FLAGS,
        ]
    )
    last = capsys.readouterr().out.splitlines()[-1]
    assert code == 0
    assert last == (
        "exit status 0: nothing failed in --fail-on corrupts,breaks; 1 failure(s) of tiers "
        "not in --fail-on (accepts-invalid) reported, not failing"
    )


def test_markdown_summary_and_stdout_conflicts(tmp_path: Path, capsys) -> None:
    summary = tmp_path / "summary.md"
    code = main(
        [
            "conform",
            "kvspec.conformance.families.routing.mutants:ReplicasMergedTwice",
            "--check",
            "PLAN-2/exact-cover",
            *FLAGS,
            "--markdown",
            str(summary),
        ]
    )
    text = summary.read_text()
    assert code == 1
    assert text.startswith("## kvspec conform `kvspec.conformance.families.routing.mutants:")
    assert "| corrupts | 1 | yes |" in text and "| accepts-invalid | 0 | no |" in text
    assert "**1. corrupts: `PLAN-2/exact-cover`** [PLAN-2.2]" in text
    assert "def test_plan_2_exact_cover():" in text
    assert text.rstrip().splitlines()[-1].startswith("**exit status 1: ")
    capsys.readouterr()
    assert main(["conform", "reference", "--json", "-", "--markdown", "-"]) == 2
    assert "cannot both write to stdout" in capsys.readouterr().err
