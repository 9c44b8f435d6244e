"""The sim moves block-scaled caches — vLLM's NVFP4 pages, SGLang's MXFP8 pool with its
side scales — and verifies every byte of every field [LAYOUT-8, ORACLE-8, DESC-1]; what it
cannot carry it refuses naming the rule."""

from __future__ import annotations

import pytest

from kvspec.memory.cache_layout import get_layout
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.harness.cluster import run_simulation, validate
from sim.run.config import SimConfig

NVFP4 = ModelShape(2, 4, 64, dtype="bfloat16")
MXFP8 = ModelShape(2, 2, 128, dtype="float8_e4m3fn")


def _config(src, dst, model, transfer, stages, block_sizes) -> SimConfig:
    return SimConfig(
        stages=stages,
        model=model,
        src_layout=get_layout(src),
        dst_layout=get_layout(dst),
        src_block_size=block_sizes[0],
        dst_block_size=block_sizes[1],
        transfer=transfer,
        requests=2,
        seq_len=(5, 30) if block_sizes[0] < 128 else (100, 300),
        ports="os",
    )


@pytest.mark.parametrize(
    ("src", "dst", "model", "transfer", "stages", "blocks"),
    [
        # SM100's swizzled V scales into SM120's linear page, through a CP sender whose
        # token shards cut every 4-token group
        (
            "vllm_nvfp4_hnd",
            "vllm_nvfp4_fa2_hnd",
            NVFP4,
            "pull",
            (StageLayout(4, cp=2, cp_rule="interleave:1"), StageLayout(2)),
            (8, 4),
        ),
        (
            "vllm_nvfp4_fa2_hnd",
            "vllm_nvfp4_hnd",
            NVFP4,
            "write",
            (StageLayout(2), StageLayout(4)),
            (4, 8),
        ),
        (
            "sglang_mxfp8",
            "sglang_mxfp8",
            MXFP8,
            "push",
            (StageLayout(2), StageLayout(1)),
            (128, 128),
        ),
        (
            "sglang_mxfp8",
            "sglang_mxfp8",
            MXFP8,
            "pull",
            (StageLayout(1), StageLayout(2)),
            (128, 128),
        ),
    ],
)
def test_block_scaled_caches_move_and_verify(src, dst, model, transfer, stages, blocks) -> None:
    report = run_simulation(_config(src, dst, model, transfer, stages, blocks))
    assert report.ok, report.render()
    assert report.verified == 2


def test_nvfp4_push_is_refused_naming_the_rule() -> None:
    """A bfloat16 model's NVFP4 record cannot travel as one-byte rows [LAYOUT-7]."""
    config = _config(
        "vllm_nvfp4_hnd", "vllm_nvfp4_hnd", NVFP4, "push", (StageLayout(2), StageLayout(1)), (4, 4)
    )
    with pytest.raises(ValueError, match=r"one-byte elements \[LAYOUT-7\]"):
        validate(config)


def test_a_block_size_the_swizzle_cannot_hold_is_refused() -> None:
    config = _config(
        "vllm_nvfp4_hnd", "vllm_nvfp4_hnd", NVFP4, "pull", (StageLayout(2), StageLayout(1)), (6, 4)
    )
    with pytest.raises(ValueError, match=r"groups of 4.*\[LAYOUT-8\]"):
        validate(config)
