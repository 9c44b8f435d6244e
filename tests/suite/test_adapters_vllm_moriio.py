"""vLLM MoRIIO's adapter (kvspec/adapters/vllm_moriio.py): its translation on data alone,
its contract, and, where vllm is installed (`make field`), the engine's WRITE path: right
on 0.33.0, and the vllm#47764 field (the decode TP size the write path reads) caught
when that size is wrong."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvspec.adapters import vllm_moriio as mo
from kvspec.memory.cache_layout import PRESETS, get_layout
from kvspec.memory.descriptors import RegisteredCache
from kvspec.tensors.kv import RequestKV
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import VLLM_MORIIO
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed; `make field` runs it")


def test_the_contract_is_data() -> None:
    cls = mo.VllmMoriioAdapter
    assert cls.policies == (VLLM_MORIIO,) and set(cls.policy_rules) == {VLLM_MORIIO}
    assert cls.replicas_write == "one"
    assert set(cls.serving_never_produces) == {"DESC-2.2", "RESHARD-3.2"}
    assert set(mo.DOMAIN.layouts) == {"vllm_packed_hnd", "vllm_packed_nhd", "vllm_mla"}


@pytest.mark.parametrize(
    ("layout", "strides"),
    [
        # [B, H, N, C] of bfloat16 with C = 2 * head_dim = 6: HND is the view itself ...
        ("vllm_packed_hnd", (2 * 3 * 6, 3 * 6, 6, 1)),
        # ... NHD stores [B, N, H, C]: heads step by one cell, tokens by a row of heads
        ("vllm_packed_nhd", (2 * 3 * 6, 6, 2 * 6, 1)),
    ],
)
def test_the_view_has_vllms_logical_shape_and_the_layouts_strides(layout, strides) -> None:
    view = mo.view_of(RegisteredCache(get_layout(layout), 2, 4, 3, 2, 3, "bfloat16"))
    assert tuple(view.shape) == (4, 2, 3, 6) and view.stride() == strides
    mla = mo.view_of(RegisteredCache(PRESETS["vllm_mla"], 1, 4, 2, 1, 5, "float32"))
    assert tuple(mla.shape) == (4, 1, 2, 5) and mla.dtype == torch.float32
    with pytest.raises(ValueError, match=r"not vLLM's per-layer \[B, H, N, C\] view"):
        mo.view_of(RegisteredCache(PRESETS["flash_attn"], 1, 4, 2, 2, 3, "bfloat16"))


def test_writes_land_at_their_heads_and_an_unwritten_head_keeps_old_bytes() -> None:
    like = RequestKV(torch.ones(1, 2, 2, 1, 2))
    out = mo.place_writes([(RequestKV(torch.full((1, 2, 2, 1, 2), 3.0)), 1)], heads=2, like=like)
    assert (out.data[:, :, :, 1] == 3).all() and (out.data[:, :, :, 0] == 0).all()
    with pytest.raises(RuntimeError, match="runs past"):
        mo.place_writes([(like, 2)], heads=2, like=like)


# -- the engine's own code, where vllm is installed ---------------------------------------


def _case(p: int, d: int, heads: int) -> TransferCase:
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2)
    return TransferCase(StageLayout(p), StageLayout(d), model, VLLM_MORIIO)


@needs_vllm
def test_the_write_path_reads_the_decode_tp_the_request_names() -> None:  # pragma: no cover
    adapter = mo.VllmMoriioAdapter()
    assert adapter._peer_tp_size(8) == 8
    case = _case(8, 8, 8)
    assert [list(adapter.sources(case, d)) for d in range(8)] == [[d] for d in range(8)]
    assert list(adapter.sources(_case(8, 2, 4), 1)) == [4, 6]  # first holders of heads 2, 3


@needs_vllm
def test_a_write_path_that_reads_tp_1_for_a_tp8_decode_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # pragma: no cover
    """vllm#47764: the size came from a key the producer's request lacks and defaulted to
    1, so every prefill rank wrote decode rank 0. The suite fails it, not quietly."""
    from kvspec.conformance import get_check, run_check

    adapter = mo.VllmMoriioAdapter()
    monkeypatch.setattr(adapter, "_peer_tp_size", lambda tp_d: 1)
    case = _case(8, 8, 8)
    assert list(adapter.sources(case, 0)) == list(range(8))
    result = run_check(get_check("PLAN-2/exact-cover"), adapter, replay=case.to_dict())
    assert result.verdict == "FAILED" and result.tier == "corrupts", result.reason


@needs_vllm
@pytest.mark.parametrize(
    ("p", "d", "heads", "accepted", "said"),
    [
        (8, 1, 4, True, "accepts"),
        (3, 2, 6, False, "one TP size to be a multiple of the other"),
        (4, 2, 6, False, "6 is not divisible by 4"),  # QKVParallelLinear
        (8, 2, 0, True, "accepts"),
    ],
)
def test_serving_accepts_runs_vllms_checks(p, d, heads, accepted, said) -> None:  # pragma: no cover
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2)
    config = {"source": {"tp": p, "pp": 1}, "target": {"tp": d, "pp": 1}, "model": model.to_dict()}
    verdict = mo.VllmMoriioAdapter().serving_accepts(config)
    assert verdict.accepted is accepted, verdict.evidence
    assert said in verdict.evidence


@needs_vllm
@pytest.mark.parametrize("layouts", [("vllm_packed_hnd", "vllm_packed_nhd"), ("vllm_mla",) * 2])
def test_the_engines_offsets_write_the_share_exactly(layouts) -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    case, edge = (_case(4, 2, 8), [3, 1]) if layouts[0] != "vllm_mla" else (_case(4, 2, 0), [2, 1])
    example = {
        "case": case.to_dict(),
        "edge": edge,
        "tokens": [1, 4],
        "sides": [
            {"layout": layouts[0], "block_size": 1, "num_blocks": 5, "block_ids": [3, 0, 4, 1]},
            {"layout": layouts[1], "block_size": 1, "num_blocks": 4, "block_ids": [2, 1, 3, 0]},
        ],
    }
    result = run_check(get_check("DESC-1/exact-effect"), mo.VllmMoriioAdapter(), replay=example)
    assert result.verdict == "passed", result.reason
