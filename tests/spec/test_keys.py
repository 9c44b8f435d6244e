"""KEY-1..4: connector keys are injective, parse is their inverse, both ends agree."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.naming.keys import (
    LegacyKey,
    RankAwareKey,
    key_kind,
    legacy_key,
    parse_key,
    rank_aware_key,
    recv_keys,
    send_keys,
)
from kvspec.testing.strategies import keys, request_ids, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

TP1_PP2_SENDER = TransferCase(StageLayout(1, 2), StageLayout(1), ModelShape(4, 2, 2))
"""Two TP1 ranks feed one receiver: the field's TP <= 1 rule would give both one legacy key."""

REPLICATED = TransferCase(StageLayout(8), StageLayout(2), ModelShape(2, 4, 2), "balanced")


@given(keys())
@example(LegacyKey("5_0_0_0_0", 0, 1))  # also reads as rank-aware key of 'omni_0_to_1_kv_cache_5'
@example(RankAwareKey("omni_0_to_1_kv", 0, 0, 0, 0))  # a prefix of the legacy head is fine
@example(RankAwareKey("a_1_2_3_4", 5, 6, 7, 8))
@example(LegacyKey("x", 10, 0))
def test_parse_inverts_every_key(key: RankAwareKey | LegacyKey) -> None:
    """KEY-3: parse_key(str(k)) == k on the whole domain, both kinds."""
    assert parse_key(str(key)) == key


@given(
    st.one_of(
        st.text(st.sampled_from("omni_tokvcache0123x"), max_size=40),
        st.text(max_size=20),
    )
)
@example("omni_0_to_1_kv_cache_5_0_0_0_0")
@example("omni_01_to_1_kv_cache_0_0_0_0")  # not canonical legacy, and its id is refused
@example("x_01_0_0_0")  # leading zero
@example("x_0_0_0")  # three numbers
@example("_0_0_0_0")  # empty request id
@example("x_١_0_0_0")  # an Arabic-Indic digit int() would accept
def test_every_accepted_string_is_formatted_back(text: str) -> None:
    """KEY-3: str(parse_key(s)) == s whenever s is accepted; otherwise ValueError."""
    try:
        key = parse_key(text)
    except ValueError:
        return
    assert str(key) == text


def test_the_ambiguous_pair_is_resolved() -> None:
    """KEY-3: the legacy key of '5_0_0_0_0' is legacy; the rank-aware twin is refused."""
    text = legacy_key("5_0_0_0_0", 0, 1)
    assert text == "omni_0_to_1_kv_cache_5_0_0_0_0"
    assert parse_key(text) == LegacyKey("5_0_0_0_0", 0, 1)
    with pytest.raises(ValueError, match=r"begins with a legacy key's head.*\[KEY-3\]"):
        rank_aware_key("omni_0_to_1_kv_cache_5", 0, 0, 0, 0)


def test_underscores_in_request_ids_are_fine() -> None:
    """KEY-1: the four trailing fields are integers, so the id may hold '_' and digits."""
    text = rank_aware_key("req_7_1", 2, 3, 4, 5)
    assert text == "req_7_1_2_3_4_5"
    assert parse_key(text) == RankAwareKey("req_7_1", 2, 3, 4, 5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", 0, 0, 0, 0), r"non-empty string, got ''"),
        (("a\nb", 0, 0, 0, 0), r"must be printable"),
        (("r", -1, 0, 0, 0), r"from_stage must be >= 0, got -1"),
        (("r", 0, True, 0, 0), r"chunk_id must be an integer, got True"),
        ((7, 0, 0, 0, 0), r"non-empty string, got 7"),
    ],
)
def test_outside_the_domain_is_refused(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rank_aware_key(*args)


def _all_keys(case: TransferCase, *, chunk_id: int = 0, chunked: bool = False):
    plan = case.plan()
    sent = {
        (src, dst, key)
        for src in case.source.ranks()
        for key, dst in send_keys(
            plan, "r_1", src, from_stage=1, to_stage=2, chunk_id=chunk_id, chunked=chunked
        )
    }
    expected = {
        (src, dst, key)
        for dst in case.target.ranks()
        for key, src in recv_keys(
            plan, "r_1", dst, from_stage=1, to_stage=2, chunk_id=chunk_id, chunked=chunked
        )
    }
    return plan, sent, expected


@given(transfer_cases(), st.integers(0, 3), st.booleans())
@example(TP1_PP2_SENDER, 0, False)
@example(REPLICATED, 0, False)
def test_send_keys_equal_receive_keys(case: TransferCase, chunk_id: int, chunked: bool) -> None:
    """KEY-4: what s sends to t is what t expects from s; all keys of a chunk are distinct."""
    if key_kind(case.source, case.target, chunked=chunked) == "legacy" and chunk_id:
        chunked = True
    plan, sent, expected = _all_keys(case, chunk_id=chunk_id, chunked=chunked)
    assert sent == expected
    assert {(s, d) for s, d, _ in sent} == {(e.src, e.dst) for e in plan.edges}
    assert len({key for _, _, key in sent}) == len(sent)
    for src, dst, key in sent:
        parsed = parse_key(key)
        if isinstance(parsed, RankAwareKey):
            assert (parsed.from_rank, parsed.to_rank, parsed.chunk_id) == (src, dst, chunk_id)


def test_legacy_keys_only_between_single_ranks() -> None:
    """KEY-2: TP1 -> TP1 uses the legacy key; PP2 x TP1 and chunked transfers do not."""
    single = TransferCase(StageLayout(1), StageLayout(1), ModelShape(2, 2, 2))
    _, sent, _ = _all_keys(single)
    assert sent == {(0, 0, "omni_1_to_2_kv_cache_r_1")}
    _, chunked, _ = _all_keys(single, chunk_id=1, chunked=True)
    assert chunked == {(0, 0, "r_1_1_1_0_0")}
    _, pp, _ = _all_keys(TP1_PP2_SENDER)
    assert pp == {(0, 0, "r_1_1_0_0_0"), (1, 0, "r_1_1_0_1_0")}
    with pytest.raises(ValueError, match=r"chunk_id 1 for an unchunked transfer.*\[KEY-2\]"):
        send_keys(single.plan(), "r", 0, from_stage=0, to_stage=1, chunk_id=1)


@given(request_ids())
def test_any_request_id_has_a_legacy_key(request_id: str) -> None:
    """KEY-3: legacy keys take every id of the domain, underscores and all."""
    assert parse_key(legacy_key(request_id, 3, 4)) == LegacyKey(request_id, 3, 4)
