"""A hybrid's attention block size per TP, as vLLM derives it [BLOCK-1], and plans whose
sender and receiver block sizes differ by construction [WINDOW-2]."""

from __future__ import annotations

import pytest

from kvspec.cli import main
from kvspec.topology.block_size import (
    attention_token_bytes,
    hybrid_block_size,
    state_page_bytes,
)
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import Mamba2State, SlidingWindow
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS, model_preset
from kvspec.topology.stage import StageLayout


def test_qwen3_next_block_size_halves_from_tp2_to_tp4() -> None:
    """hybrids.md §2's worked numbers: a state page of 1,097,728 B at TP1 and 274,432 B at
    TP4; one token's attention page 2048 B at TP1, 1024 B at TP2 and TP4 (one replicated
    head), so 16 x ceil(S / (16 x P)) is 544, 544, 272."""
    qwen = model_preset("qwen3-next-80b-a3b")
    assert [state_page_bytes(qwen, t) for t in (1, 2, 4)] == [1097728, 548864, 274432]
    assert [attention_token_bytes(qwen, t) for t in (1, 2, 4)] == [2048, 1024, 1024]
    assert [hybrid_block_size(qwen, t) for t in (1, 2, 4)] == [544, 544, 272]


def test_every_preset_block_holds_its_state_page() -> None:
    """The attention page of the derived block holds the largest state page, and one
    alignment less would not [BLOCK-1.1]."""
    for name in PRESETS:
        model = model_preset(name)
        for tp in (1, 2, 4):
            block = hybrid_block_size(model, tp)
            state = state_page_bytes(model, tp)
            if state == 0:
                assert block == 16
                continue
            page = attention_token_bytes(model, tp)
            assert block % 16 == 0 and block * page >= state > (block - 16) * page, name


def test_user_block_size_is_kept_or_raised() -> None:
    """BLOCK-1.2: a user block size at least the derived one is kept, a smaller one raised;
    a model without state keeps the user's; the alignment and KV dtype are inputs."""
    qwen = model_preset("qwen3-next-80b-a3b")
    assert hybrid_block_size(qwen, 4, block_size=16) == 272
    assert hybrid_block_size(qwen, 4, block_size=300) == 300
    assert hybrid_block_size(model_preset("gpt-oss-120b"), 4, block_size=8) == 8
    assert hybrid_block_size(qwen, 4, alignment=64) == 320
    assert hybrid_block_size(qwen, 4, kv_cache_dtype="float8_e4m3fn") == 544
    with pytest.raises(ValueError, match="alignment"):
        hybrid_block_size(qwen, 4, alignment=0)


WINDOWED = ModelShape(
    4,
    2,
    256,
    groups=(
        SlidingWindow(2, 256, window=128),
        Mamba2State(num_heads=32, head_dim=64, n_groups=2, d_state=64, conv_kernel=4),
    ),
    layers=(0, 1, 2, 2),
)
"""A window beside a Mamba-2 state: its block size changes with TP like Qwen3-Next's."""


def test_a_window_hybrid_plans_tp4_to_tp1_and_refuses_tp1_to_tp4() -> None:
    """WINDOW-2: the block sizes 144 (TP1) and 80 (TP4) do not divide each other. After
    1000 tokens the window starts at 872: the TP1 receiver needs 864-999 and the TP4
    sender still holds 800-999, so TP4 -> TP1 plans; the TP4 receiver needs 800-999, of
    which the TP1 sender evicted 800-863, so TP1 -> TP4 is refused with both block sizes
    and the range."""
    big, small = hybrid_block_size(WINDOWED, 1), hybrid_block_size(WINDOWED, 4)
    assert (big, small) == (144, 80)
    plan = plan_groups(
        StageLayout(4),
        StageLayout(1),
        WINDOWED,
        seq_len=1000,
        source_block_size=small,
        target_block_size=big,
    )
    assert {e.tokens.describe() for e in plan.edges if e.group == 1} == {"864-999"}
    assert plan.to_dict()["source_block_size"] == 80 and plan.to_dict()["block_size"] == 144
    with pytest.raises(ValueError) as refused:
        plan_groups(
            StageLayout(1),
            StageLayout(4),
            WINDOWED,
            seq_len=1000,
            source_block_size=big,
            target_block_size=small,
        )
    message = str(refused.value)
    assert "receiver's blocks of 80" in message and "sender's blocks of 144" in message
    assert "tokens 800-863 are evicted" in message and "[WINDOW-2]" in message


def test_kvspec_plan_aligns_windows_to_the_target_and_refuses_evicted_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """WINDOW-2 from the CLI: gpt-oss-120b's window of 128 after 1000 tokens starts at 872;
    a target with blocks of 64 needs 832-999, a source with blocks of 16 holds 864-999."""
    argv = ["plan", "--source-tp", "1", "--target-tp", "4", "--model", "gpt-oss-120b"]
    argv += ["--seq-len", "1000", "--source-block-size", "16"]
    assert main([*argv, "--target-block-size", "64"]) == 2
    err = capsys.readouterr().err
    assert "blocks of 64" in err and "blocks of 16" in err and "832-863 are evicted" in err
    assert main(["plan", *argv[1:-1], "64", "--target-block-size", "16"]) == 0
    assert "blocks 64 -> 16 tokens" in capsys.readouterr().out
