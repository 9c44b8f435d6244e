"""Hybrid models: layer groups, state parts, sliding windows, bytes per group, presets
[GROUP-1..3, STATE-1..2, WINDOW-1]."""

import pytest

from kvspec.cli import main
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import (
    ChunkedLocal,
    GdnState,
    Mamba2State,
    SlidingWindow,
    group_from_dict,
)
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS, model_preset
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import part_units, plan_state_reads
from kvspec.topology.windows import chunk_tokens, needed_tokens, window_tokens

FALCON_LIKE = Mamba2State(num_heads=4, head_dim=2, n_groups=1, d_state=3, conv_kernel=4)


def test_uniform_model_keeps_todays_plain_form() -> None:
    model = ModelShape(32, 8, 128)
    assert list(model.to_dict()) == [
        "num_layers",
        "num_kv_heads",
        "head_dim",
        "attention",
        "dtype",
        "scale_format",
    ]
    assert ModelShape.from_dict(model.to_dict()) == model
    assert model.layer_groups[0].num_kv_heads == 8 and model.group_layers(0) == tuple(range(32))


def test_hybrid_round_trips_and_refuses_bad_maps() -> None:
    model = ModelShape(3, 2, 4, groups=(FALCON_LIKE,), layers=(1, 0, 1))
    assert ModelShape.from_dict(model.to_dict()) == model
    assert model.group_layers(1) == (0, 2)
    with pytest.raises(ValueError, match="GROUP-1"):
        ModelShape(3, 2, 4, groups=(FALCON_LIKE,), layers=(1, 0))
    with pytest.raises(ValueError, match="GROUP-1"):
        ModelShape(3, 2, 4, groups=(FALCON_LIKE,), layers=(1, 0, 2))
    with pytest.raises(ValueError, match="GROUP-1"):
        ModelShape(3, 2, 4, groups=(FALCON_LIKE, FALCON_LIKE), layers=(1, 0, 1))
    with pytest.raises(ValueError, match="GROUP-2"):
        ModelShape.from_dict({**model.to_dict(), "groups": [{"kind": "chunked_attention"}]})
    with pytest.raises(ValueError, match="GROUP-2"):
        Mamba2State(num_heads=4, head_dim=2, n_groups=3, d_state=3, conv_kernel=4)
    with pytest.raises(ValueError, match="GROUP-3"):
        plan_transfer(StageLayout(1), StageLayout(2), model)


def test_mamba2_one_group_is_replicated_and_read_at_its_own_offset() -> None:
    """vllm#55208: with n_groups=1, P TP1 -> D TP2, B and C are replicated while x is split."""
    assert part_units(FALCON_LIKE, 2, 1) == {
        "x": range(2, 4),
        "B": range(0, 1),
        "C": range(0, 1),
        "ssm": range(2, 4),
    }
    model = ModelShape(2, 1, 4, groups=(FALCON_LIKE,), layers=(1, 0))
    rows, x_unit, group_unit = 3, 2 * 3, 3 * 3
    sender_b = 4 * x_unit  # the sender holds all 4 heads of x, then B
    reads = {
        r.part: r for r in plan_state_reads(StageLayout(1), StageLayout(2), model, 1) if r.dst == 1
    }
    assert rows == FALCON_LIKE.conv_kernel - 1
    assert reads["x"].src_offset == 2 * x_unit and reads["x"].length == 2 * x_unit
    assert reads["B"].src_offset == sender_b and reads["B"].length == group_unit
    assert reads["C"].src_offset == sender_b + group_unit


def test_gdn_state_bytes_follow_vllm_shapes_and_not_the_length() -> None:
    """Qwen3-Next GDN at TP1: conv (2*16*128 + 32*128) x 3 and temporal 32 x 128 x 128,
    bf16 (vLLM 0.33.0 gated_delta_net_state_shape)."""
    model = model_preset("qwen3-next-80b-a3b")
    per_layer = ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2
    for seq_len in (1, 5000):
        plan = plan_groups(StageLayout(1), StageLayout(1), model, seq_len=seq_len)
        assert plan.bytes_by_group()[1] == 36 * per_layer
    to_four = plan_groups(StageLayout(1), StageLayout(4), model, seq_len=64)
    assert to_four.bytes_by_group()[1] == 36 * per_layer  # each receiver its quarter
    assert isinstance(model.layer_groups[1], GdnState)


def test_sliding_window_receiver_gets_its_block_aligned_window() -> None:
    assert window_tokens(128, 1000, 16).ranges == (range(864, 1000),)
    assert window_tokens(128, 100, 16).ranges == (range(0, 100),)
    window = SlidingWindow(2, 4, window=10)
    model = ModelShape(2, 2, 4, groups=(window,), layers=(0, 1))
    plan = plan_groups(StageLayout(2), StageLayout(1), model, seq_len=100, block_size=8)
    cell = 2 * 4 * 2  # K and V x head_dim x bf16
    sliding = [e for e in plan.edges if e.group == 1]
    assert [e.tokens.ranges for e in sliding] == [(range(88, 100),)] * 2
    assert sum(e.nbytes for e in sliding) == 2 * 12 * cell
    assert plan.bytes_by_group()[0] == 2 * 100 * cell


@pytest.mark.parametrize(
    ("chunk", "seq_len", "block", "want"),
    [
        (8, 13, 1, "8-12"),  # vLLM's example: 13 computed, chunk 8, 8 skipped
        (8, 13, 16, "0-12"),  # the chunk's start back to its block
        (10, 25, 4, "20-24"),  # a window of 10 would start at 12
        (8, 7, 4, "0-6"),  # still in the first chunk
        (8, 8, 1, "none"),  # on a chunk boundary: nothing
        (10, 10, 4, "none"),  # a boundary that is not a block boundary: still nothing
        (8, 0, 4, "none"),
    ],
)
def test_a_chunked_layer_moves_its_current_chunk(
    chunk: int, seq_len: int, block: int, want: str
) -> None:
    """LOCAL-1: [floor(L/C)*C, L), the start back to a block, empty on a chunk boundary."""
    assert chunk_tokens(chunk, seq_len, block).describe() == want
    group = ChunkedLocal(2, 4, chunk=chunk)
    assert needed_tokens(group, seq_len, block) == chunk_tokens(chunk, seq_len, block)
    assert needed_tokens(SlidingWindow(2, 4, window=chunk), 25, 4) == window_tokens(chunk, 25, 4)


def test_a_chunk_below_one_token_is_refused() -> None:
    data = {"kind": "chunked", "num_kv_heads": 2, "head_dim": 4, "chunk": 8192}
    assert group_from_dict(data) == ChunkedLocal(2, 4, chunk=8192)
    assert group_from_dict(data).to_dict() == {**data, "attention": "mha"}
    with pytest.raises(ValueError, match="chunk"):
        group_from_dict({**data, "chunk": 0})


def test_draft_group_uses_its_own_heads() -> None:
    model = ModelShape(
        3,
        1,
        8,
        "mla",
        groups=({"kind": "draft", "num_kv_heads": 4, "head_dim": 2},),
        layers=(0, 0, 1),
    )
    plan = plan_groups(StageLayout(4), StageLayout(2), model, seq_len=10)
    assert plan.bytes_by_group() == {0: 2 * 2 * 10 * 8 * 2, 1: 4 * 10 * 2 * 2 * 2}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_plan_both_ways(name: str) -> None:
    model = model_preset(name)
    for source, target in ((1, 4), (4, 1)):
        plan = plan_groups(StageLayout(source), StageLayout(target), model, seq_len=256)
        totals = plan.bytes_by_group()
        assert set(totals) == set(range(len(model.layer_groups)))
        assert all(n > 0 for g, n in totals.items() if model.layer_groups[g].kind != "none")


def test_plan_cli_prints_bytes_per_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--source-tp", "1", "--target-tp", "4", "--model", "jamba-v0.1"]) == 0
    out = capsys.readouterr().out
    assert "mamba1" in out and "full" in out and "total" in out
    assert main(["plan", "--source-tp", "3", "--target-tp", "1", "--model", "jamba-v0.1"]) == 2
    assert "GROUP-3" in capsys.readouterr().err


def test_an_mla_indexer_moves_whole_with_its_latent() -> None:
    """INDEX-1: 128 fp8 values and one float32 scale per token and layer, to every receiver."""
    model = ModelShape(3, 1, 8, "mla", index_head_dim=128)
    assert model.to_dict()["index_head_dim"] == 128 and model.hybrid
    assert "index_head_dim" not in ModelShape(3, 1, 8, "mla").to_dict()
    assert ModelShape.from_dict(model.to_dict()) == model
    plan = plan_groups(StageLayout(1), StageLayout(4), model, seq_len=10)
    assert {e.dst: e.nbytes for e in plan.edges} == {d: 3 * 10 * (8 * 2 + 132) for d in range(4)}
    with pytest.raises(ValueError, match="group by group"):
        plan_transfer(StageLayout(1), StageLayout(4), model)


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"num_kv_heads": 2, "head_dim": 4, "index_head_dim": 128}, "MLA"),
        ({"num_kv_heads": 1, "head_dim": 4, "attention": "mla", "index_head_dim": 64}, "128"),
        ({"num_kv_heads": 1, "head_dim": 4, "attention": "mla", "index_head_dim": 200}, "128"),
    ],
)
def test_an_indexer_off_mla_or_of_partial_blocks_is_refused(
    facts: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        group_from_dict({"kind": "draft", **facts})
