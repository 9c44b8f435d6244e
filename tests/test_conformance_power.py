"""The suite's power: every deliberately wrong adapter is caught, with a counterexample."""

import json

import pytest

from kvspec.conformance.runner import FAILED, PASSED, render, run_check, run_suite
from tests.mutants import MUTANTS


@pytest.fixture(scope="module", autouse=True)
def ci_profile():
    """The suite's checks run under ``ci`` here, whatever profile the session uses."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSPEC_PROFILE", "ci")
        yield


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_mutant_is_caught_by_its_check(mutant) -> None:
    check_id = MUTANTS[mutant]
    report = run_suite(mutant(), impl=f"tests.mutants:{mutant.__name__}", patterns=[check_id])
    [result] = report.results
    assert result.verdict == FAILED, f"{mutant.__name__} was not caught by {check_id}"
    assert result.counterexample is not None
    text = render(report)
    assert (
        f"{check_id}: " in text
        and "counterexample: " in text
        and "reproduce: kvspec conform" in text
    )
    # The printed counterexample replays to the same failure.
    replayed = run_check(
        result.check, mutant(), replay=json.loads(json.dumps(result.counterexample))
    )
    assert replayed.verdict == FAILED


def test_there_are_at_least_fifteen_mutants() -> None:
    assert len(MUTANTS) >= 15


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_mutant_differs_from_the_reference_only_where_intended(mutant) -> None:
    """Each mutant has one bug: it still accepts every valid configuration."""
    report = run_suite(mutant(), patterns=["PLAN-1/accepts-valid"])
    assert report.results[0].verdict == PASSED
