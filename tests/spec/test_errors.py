"""Every family's error case is refused by the reference with ValueError naming the values."""

import importlib
import re

import pytest

from kvspec.conformance.families import error_cases, modules, owner
from kvspec.conformance.vectors.errors import EXPORT_ORDER, ordered_cases
from kvspec.core.clauses import all_clauses
from kvspec.error_cases import OPERATIONS, ErrorCase
from kvspec.transport.wire import WireError

ERROR_CASES = error_cases()


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


def test_each_case_is_in_the_folder_of_its_clause_family() -> None:
    """A family's error cases are its own folder's ``errors.py``, none another's."""
    for name in modules("errors"):
        folder = name.split(".")[-2]
        for case in importlib.import_module(name).ERROR_CASES:
            assert owner(case.clause.split("-")[0]) == folder, (case.id, name)


def test_the_export_order_lists_every_case_once() -> None:
    """The golden vectors' order is declared, not the order the modules are read in."""
    assert sorted(EXPORT_ORDER) == sorted(c.id for c in ERROR_CASES)
    assert len(set(EXPORT_ORDER)) == len(EXPORT_ORDER)
    assert [c.id for c in ordered_cases()] == list(EXPORT_ORDER)
    assert [c.id for c in ERROR_CASES] != list(EXPORT_ORDER)  # the order is not the folders'
