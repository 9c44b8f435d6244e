"""HEAD-1..3 and LAYER-1..2: which rank owns which heads and layers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.testing.strategies import TP_SIZES, head_counts_for, stage_layouts
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import (
    default_layer_partition,
    head_replicas,
    layer_ranges,
    owned_heads,
    rank_ownership,
)
from kvspec.topology.stage import StageLayout


@st.composite
def heads_and_tp(draw: st.DrawFn) -> tuple[int, int]:
    tp = draw(st.sampled_from(TP_SIZES))
    return draw(st.sampled_from(head_counts_for((tp,)))), tp


# Values worked out by hand from the clause texts.
@pytest.mark.parametrize(
    ("heads", "tp", "expected"),
    [
        (8, 2, [range(0, 4), range(4, 8)]),  # HEAD-1
        (12, 3, [range(0, 4), range(4, 8), range(8, 12)]),  # HEAD-1, TP not a power of two
        (4, 8, [range(r // 2, r // 2 + 1) for r in range(8)]),  # HEAD-2: each head on 2 ranks
        (2, 6, [range(0, 1)] * 3 + [range(1, 2)] * 3),  # HEAD-2 with TP 6
        (1, 4, [range(0, 1)] * 4),  # HEAD-3: an MLA latent is on every rank
    ],
)
def test_owned_heads_examples(heads: int, tp: int, expected: list[range]) -> None:
    assert [owned_heads(heads, tp, r) for r in range(tp)] == expected


@given(heads_and_tp())
def test_heads_are_split_or_replicated_evenly(case: tuple[int, int]) -> None:
    heads, tp = case
    owners: dict[int, list[int]] = {h: [] for h in range(heads)}
    for rank in range(tp):
        owned = owned_heads(heads, tp, rank)
        assert len(owned) == max(1, heads // tp)
        for head in owned:
            owners[head].append(rank)
    for head, ranks in owners.items():
        # HEAD-1: one owner; HEAD-2: tp/H consecutive owners.
        assert ranks == list(range(ranks[0], ranks[0] + max(1, tp // heads)))
        assert head_replicas(heads, tp, head) == range(ranks[0], ranks[-1] + 1)


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [
        (61, 2, (31, 30)),  # remainder to partition -2, i.e. the first of two
        (10, 4, (2, 3, 3, 2)),  # remainders to -2 then -3; the last never gets one
        (8, 3, (3, 3, 2)),
        (7, 3, (2, 3, 2)),
        (6, 3, (2, 2, 2)),
        (3, 3, (1, 1, 1)),
    ],
)
def test_default_partition_examples(layers: int, pp: int, expected: tuple[int, ...]) -> None:
    assert default_layer_partition(layers, pp) == expected


@given(layers=st.integers(1, 200), pp=st.integers(1, 16))
def test_default_partition_rule(layers: int, pp: int) -> None:
    if layers < pp:
        with pytest.raises(ValueError, match=f"{layers} layers cannot be partitioned over PP {pp}"):
            default_layer_partition(layers, pp)
        return
    counts = default_layer_partition(layers, pp)
    base, extra = divmod(layers, pp)
    assert sum(counts) == layers
    assert counts[-1] == base  # the last partition never gets an extra layer
    with_extra = [i - pp for i, c in enumerate(counts) if c == base + 1]
    assert with_extra == list(range(-1 - extra, -1))  # partitions -2, -3, ..., -(extra+1)


@given(data=st.data(), layers=st.integers(1, 40), tp=st.sampled_from(TP_SIZES))
def test_layer_ranges_are_contiguous_and_cover_every_layer(
    data: st.DataObject, layers: int, tp: int
) -> None:
    layout = data.draw(stage_layouts(tp=tp, num_layers=layers, max_pp=6))
    ranges = layer_ranges(layout, layers)
    assert len(ranges) == layout.pp
    assert [layer for r in ranges for layer in r] == list(range(layers))
    assert all(len(r) >= 1 for r in ranges)
    if layout.layer_partition is not None:
        assert tuple(len(r) for r in ranges) == layout.layer_partition


def test_rank_ownership_combines_heads_and_layers() -> None:
    layout = StageLayout(tp=2, pp=2)
    model = ModelShape(num_layers=61, num_kv_heads=8, head_dim=128)
    owner = rank_ownership(layout, model, 3)
    assert (owner.pp_rank, owner.tp_rank) == (1, 1)
    assert owner.heads == range(4, 8)
    assert owner.layers == range(31, 61)
