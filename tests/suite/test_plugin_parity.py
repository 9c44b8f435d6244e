"""The pytest plugin and `kvspec conform` give one verdict (issue 43, item 4): on the same
adapter and checks, the same exit status, the same tier for every failure and the same
causes; `--kvspec-fail-on` takes the CLI's `--fail-on` with its default."""

from __future__ import annotations

import json
import re

import pytest

from kvspec.cli import main
from kvspec.conformance.checks import all_checks
from kvspec.conformance.mutants import all_mutants
from tests.paths import ROOT

# Imported before pytester snapshots sys.modules: what a test imports is dropped after it,
# and the checks' registry would be filled twice.
all_checks(), all_mutants()

MERGED = "kvspec.conformance.families.routing.mutants:ReplicasMergedTwice"
EMPTY_ID = "kvspec.conformance.families.naming.mutants:EmptyRequestIdAccepted"
pytest_plugins = ["pytester"]

CAUSE = re.compile(r"^cause \d+ of \d+: (\S+)  (\S+)  \[")


def _cli(capsys: pytest.CaptureFixture[str], impl: str, check: str, *extra: str):
    code = main(["conform", impl, "--check", check, "--profile", "quick", "--json", "-", *extra])
    report = json.loads(capsys.readouterr().out)
    return code, report


def _plugin(pytester: pytest.Pytester, impl: str, check: str, *extra: str):
    # in a process of its own: the suite's registries are imported once per process
    pytester.syspathinsert(ROOT)
    result = pytester.runpytest_subprocess(
        "--kvspec-impl",
        impl,
        "--kvspec-clause",
        check,
        "--kvspec-profile",
        "quick",
        "-p",
        "no:cacheprovider",
        "-rxf",
        *extra,
    )
    causes = [m.groups() for m in map(CAUSE.match, result.outlines) if m]
    return result, causes


@pytest.mark.parametrize(
    ("impl", "check", "extra", "code"),
    [
        (MERGED, "PLAN-2/exact-cover", (), 1),  # corrupts: fails both
        (EMPTY_ID, "KEY-3/refuses-outside-domain", (), 0),  # accepts-invalid: reported only
        (EMPTY_ID, "KEY-3/refuses-outside-domain", ("accepts-invalid",), 1),
    ],
)
def test_the_plugin_and_the_cli_agree(
    pytester: pytest.Pytester,
    capsys: pytest.CaptureFixture[str],
    impl: str,
    check: str,
    extra: tuple[str, ...],
    code: int,
) -> None:
    cli_extra = ("--fail-on", *extra) if extra else ()
    plugin_extra = ("--kvspec-fail-on", *extra) if extra else ()
    cli_code, report = _cli(capsys, impl, check, *cli_extra)
    result, plugin_causes = _plugin(pytester, impl, check, *plugin_extra)
    assert cli_code == code
    assert int(result.ret) == cli_code, result.stdout.str()
    assert plugin_causes == [(c["tier"], c["headline"]) for c in report["causes"]]
    [failure] = [r for r in report["results"] if r["verdict"] == "FAILED"]
    shown = result.stdout.str()
    assert f"{failure['tier']}: {check} failed [{failure['obligation']}]" in shown
    outcome = result.parseoutcomes()
    assert outcome.get("failed", 0) + outcome.get("xfailed", 0) == 1, outcome
    assert (outcome.get("failed", 0) == 1) == (code == 1)
    assert result.outlines[-2].startswith(f"exit status {cli_code}: ") or any(
        line.startswith(f"exit status {cli_code}: ") for line in result.outlines
    )


def test_the_plugin_refuses_an_unknown_tier(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--kvspec-impl", "reference", "--kvspec-fail-on", "fatal"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "'fatal'" in result.stderr.str()
