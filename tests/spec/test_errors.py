"""Every invalid input of kvspec.error_cases is refused with ValueError naming the values."""

import re

import pytest

from kvspec.clauses import all_clauses
from kvspec.error_cases import ERROR_CASES, OPERATIONS, ErrorCase
from kvspec.transport.wire import WireError


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.id)
def test_reference_refuses(case: ErrorCase) -> None:
    with pytest.raises(ValueError) as raised:
        case.run_reference()
    assert re.search(case.match, str(raised.value)), (
        f"{case.id}: message {str(raised.value)!r} does not match {case.match!r}"
    )


@pytest.mark.parametrize("case", [c for c in ERROR_CASES if c.op == "decode"], ids=lambda c: c.id)
def test_the_codec_refuses_with_its_own_error(case: ErrorCase) -> None:
    """WIRE-4: malformed messages raise WireError, a ValueError."""
    with pytest.raises(WireError):
        case.run_reference()


def test_error_cases_are_well_formed() -> None:
    ids = [c.id for c in ERROR_CASES]
    assert len(ids) == len(set(ids)), "error case ids are unique"
    assert {c.clause for c in ERROR_CASES} <= set(all_clauses())
    assert {c.op for c in ERROR_CASES} <= set(OPERATIONS)


def test_every_refusing_family_has_error_cases() -> None:
    families = {c.clause.split("-")[0] for c in ERROR_CASES}
    assert {
        "STAGE",
        "MODEL",
        "DTYPE",
        "HEAD",
        "LAYER",
        "PLAN",
        "SLICE",
        "LAYOUT",
        "ORACLE",
        "KEY",
        "PORT",
        "PAYLOAD",
        "CHUNK",
    } <= families
