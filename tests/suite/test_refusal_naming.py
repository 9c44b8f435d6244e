"""Naming judged everywhere a clause asks for it (issue 44): the inventory of refusal
probes, as a test.

Where a clause's text asks a refusal to name the offending values ("refused with both
numbers in the error", "naming both block sizes and the evicted token range", "raises
WireError naming the problem"), every refusal probe of its negative obligations must
hand the judge (:func:`~kvspec.conformance.checks.expectations.expect_refused`) the
values to be named, so a message that names none of them is noted ``unclear``. Here the
reference runs through every check that covers a negative obligation, the judge
recording each probe (:func:`~kvspec.conformance.checks.expectations.recording`), and a
probe of such an obligation that gives no values fails the test, unless the obligation
is exempt (nothing in the input to name).
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from kvspec.conformance.checks import all_checks
from kvspec.conformance.checks.expectations import recording
from kvspec.conformance.mutants import all_mutants, get_mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import checks_covering, run_check
from kvspec.core.clauses import all_clauses, all_obligations

ASKS = re.compile(
    r"\bnaming\b|\bnames (the|both|each|every|that)\b|\bwith (the|its|both) "
    r"(values?|shapes?|numbers?)\b|\blisting\b|\blists every\b|\bproblem named\b|\bnames listed\b"
)
"""How a clause's (or an obligation's) text asks a refusal to name values."""

ASKING: dict[str, tuple[str, ...]] = {
    "STAGE-2": ("STAGE-2.3",),
    "MODEL-3": ("MODEL-3.1", "MODEL-3.2", "MODEL-3.3", "MODEL-3.4", "MODEL-3.5"),
    "DTYPE-1": ("DTYPE-1.1",),
    "CP-2": ("CP-2.1", "CP-2.2", "CP-2.3"),
    "HEAD-2": ("HEAD-1.2", "HEAD-2.2"),  # "any (H, tp) that satisfies neither HEAD-1 nor HEAD-2"
    "CP-3": ("CP-3.3", "CP-3.4"),
    "PLAN-1": ("PLAN-1.1",),
    "GROUP-2": ("GROUP-2.1", "GROUP-2.2", "GROUP-2.3"),
    "STATE-1": ("STATE-1.3",),
    "WINDOW-2": ("WINDOW-2.3",),
    "GROUP-3": ("GROUP-3.3",),
    "LAYOUT-1": ("LAYOUT-1.2", "LAYOUT-1.3"),
    "LAYOUT-4": ("LAYOUT-4.2", "LAYOUT-4.4"),
    "PAGED-2": ("PAGED-2.1", "PAGED-2.2", "PAGED-2.3", "PAGED-2.4"),
    "PAGED-3": ("PAGED-3.1", "PAGED-3.2"),
    "PAGED-4": ("PAGED-4.4",),
    "PAGED-5": ("PAGED-5.1", "PAGED-5.2"),
    "DESC-2": ("DESC-2.2",),
    "SLAYOUT-1": ("SLAYOUT-1.3",),
    "PORT-2": ("PORT-2.1", "PORT-2.2", "PORT-2.3", "PORT-2.4", "PORT-2.5", "PORT-2.6"),
    "PAYLOAD-1": ("PAYLOAD-1.1", "PAYLOAD-1.2", "PAYLOAD-1.3", "PAYLOAD-1.4"),
    "CHUNK-2": ("CHUNK-2.3", "CHUNK-2.4", "CHUNK-2.5", "CHUNK-2.6"),
    # WIRE-4: "decode ... raises WireError (a ValueError) naming the problem, for every input"
    "WIRE-4": (
        "WIRE-1.2",
        "WIRE-1.3",
        "WIRE-2.1",
        "WIRE-2.2",
        "WIRE-3.1",
        "WIRE-3.2",
        "WIRE-3.3",
        "WIRE-3.4",
        "WIRE-4.2",
        "WIRE-4.3",
        "WIRE-6.2",
        "WIRE-7.2",
        "WIRE-7.3",
    ),
}
"""The clauses whose text asks a refusal to name values, and the negative obligations the
asking sentence covers."""

NOT_ASKING: dict[str, str] = {
    "ORACLE-6": "'names the first differing element' is a verification's report, no refusal",
    "GROUP-1": "'a layer map naming a group that does not exist' describes the input",
    "LIFE-1": "'an event naming a handle that was never posted' describes the input",
}

EXEMPT: dict[str, str] = {
    "PAGED-5.2": "fp8 KV without scales: they are missing as a whole, no layer or value to name",
    "WIRE-4.2": "a header that is no JSON at all: no value of it can be read to be named",
    "WIRE-6.2": "a flipped bit under crc32: the offending value is a bit of a frame",
    "WIRE-7.2": "a flipped bit under crc32c: the offending value is a bit of a frame",
}
"""Negative obligations of an asking clause with nothing in the input to name."""

MUST_NAME = {o for obligations in ASKING.values() for o in obligations} - set(EXEMPT)


def test_the_asking_clauses_are_those_whose_text_asks() -> None:
    clauses = all_clauses()
    obligations = all_obligations()
    asking = {c.id for c in clauses.values() if ASKS.search(c.text)}
    asking |= {o.clause for o in obligations.values() if ASKS.search(o.text)}
    assert asking - set(NOT_ASKING) == set(ASKING)
    for covered in ASKING.values():
        for obligation in covered:
            assert obligations[obligation].kind == "negative", obligation
    assert set(EXEMPT) <= {o for c in ASKING.values() for o in c}


@pytest.fixture(scope="module")
def probes() -> dict[str, list[tuple[str, bool]]]:
    """Every refusal probe the reference is judged on, by obligation: (check, whether it
    gave the judge values to be named), under quick with a few examples a check."""
    negative = {o for o, ob in all_obligations().items() if ob.kind == "negative"}
    found: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    adapter = ReferenceAdapter()
    for check in all_checks():
        if not set(check.covers) & negative:
            continue
        with recording() as judged:
            run_check(check, adapter, shrink=False, profile="quick", max_examples=5)
        for obligation, values in judged:
            found[obligation or ""].append((check.id, bool(values)))
    return found


def test_every_probe_of_an_asking_obligation_goes_through_the_judge_with_values(
    probes: dict[str, list[tuple[str, bool]]],
) -> None:
    unnamed = {
        obligation: sorted({check for check, named in probes[obligation] if not named})
        for obligation in MUST_NAME
        if not all(named for _, named in probes[obligation])
    }
    assert not unnamed, f"refusal probes judged by exception type alone, though asked: {unnamed}"


def test_every_asking_obligation_is_probed(probes: dict[str, list[tuple[str, bool]]]) -> None:
    """The walk reaches each of them, so a probe left out is not a probe judged well."""
    assert not sorted(o for o in MUST_NAME if not probes[o])


@pytest.mark.parametrize(
    "name",
    [m.name for m in all_mutants() if m.unclear],
)
def test_a_message_mutant_is_noted_by_a_check_of_its_obligation(name: str) -> None:
    """Each ``unclear`` mutant refuses what it must (no check fails) and names none of the
    values: a check of its obligations notes it, citing the obligation, and a headline
    run leads with that note."""
    from kvspec.conformance.headlines import run_headline

    mutant = get_mutant(name)
    own = checks_covering(mutant.obligations)
    results = [run_check(c, mutant.cls(), shrink=False, profile="quick") for c in own]
    assert all(r.verdict != "failed" for r in results), [(r.check.id, r.reason) for r in results]
    noted = [n for r in results for n in r.notes]
    assert noted and all(n.startswith("unclear: ") for n in noted), noted
    assert any(re.search(rf"\[{re.escape(o)}\]$", n) for n in noted for o in mutant.obligations)
    headline = run_headline(mutant, {}, checks=own)
    assert headline.tier == "unclear" and headline.exact, headline.to_dict()


def test_the_message_mutants_cover_the_routed_families() -> None:
    """One message mutant for each family whose probes were routed through the judge with
    values (issue 44): head splits, window eviction, the wire, the paged scatter, a side
    that cannot hold the model, detection, the payload a message describes, chunk sets."""
    covered = {o for m in all_mutants() if m.unclear for o in m.obligations}
    routed = {"HEAD-1.2", "HEAD-2.2", "WINDOW-2.3", "WIRE-1.2", "WIRE-3.1", "PAGED-2.1"}
    routed |= {"PLAN-1.1", "LAYOUT-4.2", "PAYLOAD-1.1", "CHUNK-2.3"}
    assert routed <= covered
