"""STAGE-1: stage-local rank numbering."""

from hypothesis import given
from hypothesis import strategies as st

from kvspec.topology.stage import StageLayout


@given(tp=st.integers(1, 16), pp=st.integers(1, 8), data=st.data())
def test_rank_is_pp_rank_times_tp_plus_tp_rank(tp: int, pp: int, data: st.DataObject) -> None:
    layout = StageLayout(tp, pp)
    pp_rank = data.draw(st.integers(0, pp - 1))
    tp_rank = data.draw(st.integers(0, tp - 1))
    rank = layout.rank(pp_rank, tp_rank)
    assert rank == pp_rank * tp + tp_rank
    assert layout.coords(rank) == (pp_rank, tp_rank)


@given(tp=st.integers(1, 16), pp=st.integers(1, 8))
def test_ranks_are_zero_to_world_size(tp: int, pp: int) -> None:
    layout = StageLayout(tp, pp)
    assert list(layout.ranks()) == list(range(tp * pp))
    assert sorted(layout.rank(*layout.coords(r)) for r in layout.ranks()) == list(layout.ranks())


def test_describe_names_the_layout() -> None:
    assert StageLayout(8).describe() == "TP8"
    assert StageLayout(2, 2, (31, 30)).describe() == "PP2xTP2 layers=[31, 30]"


def test_partition_given_as_list_is_stored_as_tuple() -> None:
    assert StageLayout(1, 2, [3, 4]).layer_partition == (3, 4)  # type: ignore[arg-type]
