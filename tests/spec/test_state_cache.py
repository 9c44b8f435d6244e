"""The state cache layouts place each state element where vLLM's strided views of a layer's
buffer put it [SLAYOUT-1, SLAYOUT-2]."""

import json

import pytest
import torch

from kvspec.cli import main
from kvspec.memory.presets import STATE_PRESETS
from kvspec.memory.state_cache import get_state_layout, state_offset, state_page, state_runs
from kvspec.tensors.dtypes import torch_dtype
from kvspec.topology.groups import GdnState, Mamba1State, Mamba2State
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import model_preset

MODELS = {
    "mamba2-one-group": ModelShape(
        2,
        2,
        4,
        groups=(Mamba2State(4, 2, 1, 3, 4, ssm_dtype="float32"),),
        layers=(0, 1),
    ),
    "gdn": ModelShape(2, 2, 4, groups=(GdnState(2, 4, 2, 3, 3, num_spec=1),), layers=(1, 0)),
    "mamba1": ModelShape(2, 2, 4, groups=(Mamba1State(8, 2, 3),), layers=(1, 0), dtype="float32"),
}


def _views(page, num_blocks: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A layer buffer and its state tensors, made the way vLLM's model runner makes them:
    each tensor ``as_strided((num_blocks, *shape))`` with block stride page_size and a
    storage offset of the bytes before it."""
    raw = torch.zeros(num_blocks * page.page_size, dtype=torch.uint8)
    views = {}
    for t in page.tensors:
        dtype = torch_dtype(t.dtype)
        size = dtype.itemsize
        inner = torch.empty(t.shape).stride()
        views[t.name] = torch.as_strided(
            raw.view(dtype),
            (num_blocks, *t.shape),
            (page.page_size // size, *inner),
            t.offset // size,
        )
    return raw, views


@pytest.mark.parametrize("layout", sorted(STATE_PRESETS))
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(("tp", "rank"), [(1, 0), (2, 1), (4, 2)])
@pytest.mark.parametrize("pad", [None, 64])
def test_every_element_is_where_the_strided_view_writes_it(layout, name, tp, rank, pad) -> None:
    model = MODELS[name]
    own = state_page(layout, model, 1, attn_tp=tp, attn_tp_rank=rank)
    size = None if pad is None else own.page_size + pad
    page = state_page(layout, model, 1, attn_tp=tp, attn_tp_rank=rank, page_size=size)
    raw, views = _views(page, 3)
    state = model.layer_groups[1]
    seen = set()
    for block in range(3):
        for part in state.parts():
            for local, unit in enumerate(page.units[part.name]):
                for element in range(part.unit_elements):
                    at = state_offset(
                        layout,
                        model,
                        1,
                        attn_tp=tp,
                        attn_tp_rank=rank,
                        page_size=size,
                        block=block,
                        part=part.name,
                        unit=unit,
                        element=element,
                    )
                    raw.zero_()
                    if part.name == "ssm":
                        view = views["ssm"].view(3, -1)
                        view[block, local * part.unit_elements + element] = 1
                    else:  # the kernels' logical order is (dim, state_len) [SLAYOUT-1]
                        conv = views["conv"]
                        logical = conv if page.layout.dim_first else conv.transpose(1, 2)
                        channel = page.channels[part.name].start + local * part.width
                        logical[block, channel + element // part.rows, element % part.rows] = 1
                    first = raw.nonzero().flatten().min().item()
                    item = views["ssm" if part.name == "ssm" else "conv"].element_size()
                    assert first - first % item == at  # the one element written starts there
                    seen.add(at)
    assert len(seen) == 3 * sum(len(page.units[p.name]) * p.unit_elements for p in state.parts())


def test_ds_reads_a_part_in_one_run_and_sd_in_one_per_row() -> None:
    model = MODELS["mamba2-one-group"]
    runs = {
        name: state_runs(
            name, model, 1, attn_tp=2, attn_tp_rank=0, block=1, part="x", units=range(0, 2)
        )
        for name in STATE_PRESETS
    }
    assert len(runs["vllm_conv_ds"]) == 1
    assert len(runs["vllm_conv_sd"]) == model.layer_groups[1].parts()[0].rows
    covered = {
        name: sorted(b for at, n in r for b in range(at, at + n)) for name, r in runs.items()
    }
    assert len(covered["vllm_conv_ds"]) == len(covered["vllm_conv_sd"])


def test_refusals_name_the_values() -> None:
    model = MODELS["mamba2-one-group"]
    with pytest.raises(ValueError, match="vllm_conv_sd, vllm_conv_ds"):
        get_state_layout("DS")
    own = state_page("vllm_conv_ds", model, 1).page_size
    with pytest.raises(ValueError, match=f"{own - 4} bytes cannot hold"):
        state_page("vllm_conv_ds", model, 1, page_size=own - 4)
    with pytest.raises(ValueError, match="unaligned"):
        state_page("vllm_conv_ds", model, 1, page_size=own + 2)
    where = {"block": 0, "part": "x", "element": 0}
    with pytest.raises(ValueError, match="not held"):
        state_offset("vllm_conv_ds", model, 1, attn_tp=2, attn_tp_rank=0, unit=3, **where)
    with pytest.raises(ValueError, match="outside a unit"):
        state_offset("vllm_conv_ds", model, 1, unit=0, **{**where, "element": 2 * 3})


def test_layouts_lists_the_state_layouts_and_a_presets_page(capsys) -> None:
    assert main(["layouts"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in STATE_PRESETS)
    args = ["layouts", "vllm_conv_ds", "--model", "qwen3-next-80b-a3b", "--tp", "4"]
    assert main([*args, "--rank", "1", "--json", "-"]) == 0
    (page,) = json.loads(capsys.readouterr().out)["pages"]
    model = model_preset("qwen3-next-80b-a3b")
    want = state_page("vllm_conv_ds", model, page["group"], attn_tp=4, attn_tp_rank=1)
    assert page["page_size"] == want.page_size == want.state_bytes
    assert {p["part"]: p["reads"] for p in page["parts"]} == {"Q": 1, "K": 1, "V": 1, "ssm": 1}
    assert main(["layouts", "vllm_conv_sd", "--model", "qwen3-next-80b-a3b", "--json", "-"]) == 0
    (page,) = json.loads(capsys.readouterr().out)["pages"]
    rows = want.rows
    assert {p["part"]: p["reads"] for p in page["parts"]} == {
        "Q": rows,
        "K": rows,
        "V": rows,
        "ssm": 1,
    }
