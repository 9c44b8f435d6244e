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
from sim.run.faults import parse_faults
from sim.run.workload import Workload

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


def test_a_hybrid_preset_is_group_parts_and_what_they_do_not_carry_is_refused_by_name() -> None:
    model = model_preset("gpt-oss-120b")
    assert content_kind(model, PRESETS["flash_attn"], PRESETS["flash_attn"]) == "groups"
    assert SimConfig(stages=STAGES, model=model).content == "groups"
    with pytest.raises(ValueError, match=r"--chunks 2, --faults abort: a hybrid model moves as"):
        SimConfig(stages=STAGES, model=model, chunks=2, faults=parse_faults("abort=0.1"))


def test_a_hybrid_moves_by_group_plans_never_by_a_uniform_plan() -> None:
    """One choice: a groups run's plan book gives group plans; a uniform plan of the
    hybrid's top-level shape would be a second, wrong, way to move it [GROUP-3]."""
    workload = Workload(SimConfig(stages=STAGES, model=model_preset("gpt-oss-120b")), 0)
    request = workload.requests[0]
    assert workload.plans(0).groups_of(request).edges
    with pytest.raises(ValueError, match="moves by group plans"):
        workload.plans(0).of(request)
