"""The content kind of a run, chosen once (sim.run.content): plain KV, record rows or
layer-group parts, and every reader of it asks the one choice."""

from __future__ import annotations

import pytest

from kvspec.memory.cache_layout import PRESETS
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import model_preset
from kvspec.topology.stage import StageLayout
from sim.run.config import SimConfig
from sim.run.content import content_kind

PLAIN = ModelShape(num_layers=2, num_kv_heads=4, head_dim=64)
STAGES = (StageLayout(tp=2), StageLayout(tp=1))


def test_plain_layouts_carry_plain_kv() -> None:
    assert content_kind(PLAIN, PRESETS["flash_attn"], PRESETS["flash_attn"]) == "kv"
    config = SimConfig(stages=STAGES, model=PLAIN)
    assert config.content == "kv" and not config.records


@pytest.mark.parametrize("side", ["src", "dst"])
def test_a_record_cache_on_either_side_makes_record_rows(side: str) -> None:
    layouts = {
        "src_layout": PRESETS["flash_attn"],
        "dst_layout": PRESETS["flash_attn"],
        f"{side}_layout": PRESETS["vllm_pth_hnd"],
    }
    assert content_kind(PLAIN, layouts["src_layout"], layouts["dst_layout"]) == "records"


def test_a_hybrid_preset_is_group_parts_and_the_rank_loop_refuses_it_by_name() -> None:
    model = model_preset("gpt-oss-120b")
    assert content_kind(model, PRESETS["flash_attn"], PRESETS["flash_attn"]) == "groups"
    with pytest.raises(ValueError, match=r"layer-group parts.*--model NAME"):
        SimConfig(stages=STAGES, model=model)
