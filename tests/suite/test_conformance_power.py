"""The suite's power: every mutant of the corpus is killed by a check of its obligation.

Each mutant runs only through the checks that cover the obligations it breaks (under
``ci``, unshrunk), so the corpus costs seconds here; ``kvspec conform --mutants`` runs it
through the whole suite (its README transcript, run by tests/docs/test_readme.py).
"""

import json
import re

import pytest

from kvspec.conformance.mutants import all_mutants, get_mutant
from kvspec.conformance.reproduction import python_reproduction
from kvspec.conformance.runner import (
    FAILED,
    PASSED,
    checks_covering,
    render,
    run_check,
    run_suite,
)

MUTANTS = all_mutants()
OBLIGATION_ID = re.compile(r"\b[A-Z]+-\d+\.\d+\b")


pytestmark = pytest.mark.usefixtures("ci_profile")  # the checks run under ci


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_a_check_of_its_obligation(mutant) -> None:
    adapter = mutant.cls()
    verdicts = {}
    for check in checks_covering(mutant.obligations):
        result = run_check(check, adapter, shrink=False)
        verdicts[check.id] = result.verdict
        if result.verdict == FAILED:
            assert result.counterexample is not None
            assert OBLIGATION_ID.search(result.reason), result.reason  # names the obligation
            return
        if mutant.unclear and result.notes:  # a message bug: the unclear note names it
            cited = OBLIGATION_ID.findall(result.notes[0])
            assert set(cited) & set(mutant.obligations), result.notes
            return
    pytest.fail(f"{mutant.name} [{', '.join(mutant.obligations)}] survived {verdicts}")


def test_the_corpus_is_larger_than_the_obligations() -> None:
    from kvspec.core.clauses import all_obligations

    assert len(MUTANTS) >= len(all_obligations()) > 100
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert all(m.bug and m.cls.__module__.startswith("kvspec.conformance.") for m in MUTANTS)


@pytest.mark.parametrize(
    ("name", "check_id"),
    [
        ("TargetsOmitLast", "PLAN-3/inverse"),
        ("DoubleSlicing", "SLICE-3/applied-once"),
        ("PlainJsonLoads", "WIRE-4/refuses-non-json"),
    ],
)
def test_a_killed_mutant_has_a_readable_replayable_counterexample(name: str, check_id: str) -> None:
    mutant = get_mutant(name)
    report = run_suite(mutant.cls(), impl=mutant.spec, patterns=[check_id])
    [result] = report.results
    assert result.verdict == FAILED
    text = render(report)
    # The failure is shown as its cause: tier, check id, then the counterexample.
    assert re.search(rf"^cause 1 of 1: {result.tier}\s+{re.escape(check_id)}\s", text, re.M), text
    assert "counterexample: " in text
    assert f"reproduce: kvspec conform {mutant.spec} --check {check_id} --replay" in text
    replayed = run_check(
        result.check, mutant.cls(), replay=json.loads(json.dumps(result.counterexample))
    )
    assert replayed.verdict == FAILED
    # The Python line is valid Python and replays the failure too.
    line = python_reproduction(mutant.spec, result)
    namespace: dict = {}
    exec(line.replace("; run_check(", "; result = run_check("), namespace)
    assert namespace["result"].verdict == FAILED


@pytest.mark.parametrize(
    "mutant",
    [m for m in MUTANTS if m.cls.__module__.endswith((".topology", ".models"))],
    ids=lambda m: m.name,
)
def test_a_validation_mutant_still_accepts_every_valid_configuration(mutant) -> None:
    """Each validation mutant has one bug: it lets something through, it refuses nothing
    valid (except the one whose bug is refusing)."""
    patterns = ["PLAN-1/accepts-valid", "DTYPE-1/accepts-allowed"]
    report = run_suite(mutant.cls(), patterns=patterns)
    verdicts = {r.check.id: r.verdict for r in report.results}
    wrong = {"PLAN-1.2": "PLAN-1/accepts-valid", "DTYPE-1.2": "DTYPE-1/accepts-allowed"}
    for obligation, check_id in wrong.items():
        if obligation not in mutant.obligations:
            assert verdicts[check_id] in (PASSED, "not provided"), (mutant.name, verdicts)


@pytest.mark.parametrize(
    "name", ["PadsMissingShipment", "TruncatesToShortest", "TrustsFirstSendersScales"]
)
def test_an_accepted_wrong_shipment_is_named_by_shape_not_dumped(name: str) -> None:
    """What a receiver wrongly returned is shown by dtype and shape (values only when there
    are a few): a reason is a line to read, not a tensor's printout [RESHARD-3, DTYPE-3]."""
    mutant = get_mutant(name)
    [check] = [c for c in checks_covering(mutant.obligations) if "refuses" in c.id]
    result = run_check(check, mutant.cls(), shrink=False)
    assert result.verdict == FAILED
    assert "tensor(" not in result.reason and "\n" not in result.reason, result.reason
    assert re.search(r"it returned RequestKV\(data=\w+ tensor \[\d+(, \d+){4}\]", result.reason)
    assert len(result.reason) < 400, result.reason
