"""Each token-distribution rule kind owns the facts the suite asks of it [CP-1, CP-2]: its
obligation is a CP-1 obligation of the registry, no two kinds share one; every size it is
drawn at parses back to it; every near miss is refused by the parser; every cache block it
names as unfit is refused under its fit obligation, and every block it offers fits."""

from __future__ import annotations

import pytest

from kvspec.core.clauses import get_clause
from kvspec.topology.tokens import RULE_KINDS, CPRule, rule_kind

KINDS = [rule_kind(name) for name in RULE_KINDS]


def _obligations(clause: str) -> set[str]:
    return {o.id for o in get_clause(clause).obligations}


def test_each_kind_is_stated_by_its_own_cp1_obligation() -> None:
    owned = [kind.obligation for kind in KINDS]
    assert len(set(owned)) == len(owned), owned
    assert set(owned) <= _obligations("CP-1"), owned


@pytest.mark.parametrize("kind", KINDS, ids=RULE_KINDS)
def test_drawn_sizes_parse_back_to_the_kind(kind) -> None:  # type: ignore[no-untyped-def]
    assert kind.sample_sizes
    for size in kind.sample_sizes:
        rule = CPRule.parse(str(CPRule(kind.name, size)))
        assert (rule.kind, rule.size) == (kind.name, size)


@pytest.mark.parametrize("kind", KINDS, ids=RULE_KINDS)
def test_near_misses_are_refused(kind) -> None:  # type: ignore[no-untyped-def]
    for text in kind.near_misses:
        with pytest.raises(ValueError, match=r"\[CP-1\]"):
            CPRule.parse(text)


@pytest.mark.parametrize("kind", KINDS, ids=RULE_KINDS)
def test_unfit_blocks_are_refused_and_offered_blocks_fit(kind) -> None:  # type: ignore[no-untyped-def]
    assert (kind.fit_obligation is None) == (not kind.unfit_blocks)
    if kind.fit_obligation is not None:
        assert kind.fit_obligation in _obligations("CP-2")
    for size, block in kind.unfit_blocks:
        with pytest.raises(ValueError, match=r"\[CP-2\]"):
            CPRule(kind.name, size).check_block_size(block)
    for size in kind.sample_sizes:
        for block in CPRule(kind.name, size).block_sizes(3) or (1, 7, 16):
            CPRule(kind.name, size).check_block_size(block)


def test_an_unknown_kind_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown context-parallel rule 'ring'.*zigzag"):
        rule_kind("ring")
