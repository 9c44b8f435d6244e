"""vLLM Mooncake's adapter (kvspec/adapters/vllm_mooncake.py): its translation on data
alone, its contract, and, where vllm is installed (`make field`), the engine's own plan:
the vllm#52516 case right on 0.33.0 and caught when the plan is run without the fix's
argument (how releases before it call the same function)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvspec.adapters import vllm_mooncake as mc
from kvspec.memory.cache_layout import PRESETS
from kvspec.memory.descriptors import RegisteredCache
from kvspec.tensors.kv import RequestKV
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import VLLM_MOONCAKE
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed; `make field` runs it")


def test_the_contract_is_data() -> None:
    cls = mc.VllmMooncakeAdapter
    assert cls.policies == (VLLM_MOONCAKE,) and set(cls.policy_rules) == {VLLM_MOONCAKE}
    assert cls.replicas_write == "one"
    assert {AssertionError, RuntimeError} <= set(cls.refusal_types)
    assert set(cls.serving_never_produces) == {"DESC-2.2", "RESHARD-3.2"}
    assert mc.DOMAIN.pp_sizes == (1,) and mc.DOMAIN.block_sizes == (1,)
    assert not any(d.startswith("float8") for d in mc.DOMAIN.dtypes)


def test_local_heads_and_head_bytes_follow_the_lbhnc_block() -> None:
    assert mc.local_heads(ModelShape(2, 8, 4), 4) == 2
    assert mc.local_heads(ModelShape(2, 4, 4), 8) == 1  # replicated: max(1, 4 // 8)
    assert mc.local_heads(ModelShape.mla(2, 8), 4) == 1
    # [N, 2 * head_size] of bfloat16 per head; MLA's latent is one tensor
    assert mc.head_bytes(ModelShape(2, 8, 4), 16) == 16 * 2 * 4 * 2
    assert mc.head_bytes(ModelShape.mla(2, 8, dtype="float32"), 2) == 2 * 8 * 4


def test_a_plan_in_bytes_is_a_copy_in_heads_or_refused() -> None:
    assert mc.heads_of((True, 0, 3 * 64, 64), 64) == mc.HeadCopy(0, 3, 1)
    assert mc.heads_of((True, 128, 0, 256), 64) == mc.HeadCopy(2, 0, 4)
    assert mc.heads_of((False, 0, 0, 64), 64) is None  # another replica writes it
    with pytest.raises(RuntimeError, match="cuts a head"):
        mc.heads_of((True, 32, 0, 64), 64)


def test_writes_land_at_their_heads_and_an_unwritten_head_keeps_old_bytes() -> None:
    like = RequestKV(torch.ones(2, 2, 3, 1, 2))
    a, b = RequestKV(torch.full((2, 2, 3, 1, 2), 5.0)), RequestKV(torch.full((2, 2, 3, 2, 2), 7.0))
    out = mc.place_writes([(a, 3), (b, 0)], heads=4, like=like).data
    assert (out[:, :, :, 3] == 5).all() and (out[:, :, :, :2] == 7).all()
    assert (out[:, :, :, 2] == 0).all()  # no write reached head 2: not the KV
    with pytest.raises(RuntimeError, match="runs past"):
        mc.place_writes([(b, 3)], heads=4, like=like)


def test_regions_are_one_block_contiguous_tensor_per_layer() -> None:
    cache = RegisteredCache(PRESETS["vllm_packed_hnd"], 3, 4, 2, 2, 3, "bfloat16")
    plan = mc.region_plan(cache, 5)
    block = 2 * 2 * 2 * 3 * 2  # heads x slots x (K | V) x head_dim x 2 bytes
    assert plan["block_lens"] == plan["kv_block_lens"] == [block] * 3
    assert plan["layer_indices"] == [5, 6, 7]
    assert plan["layer_names"][0] == "model.layers.5.self_attn.attn"
    ptrs = ([plan["base_addrs"][1] + 8], [plan["base_addrs"][2] + 4], [16])
    assert mc.descriptors_of(ptrs, cache, cache) == [("L1", 8, "L2", 4, 16)]
    with pytest.raises(ValueError, match="one block-contiguous tensor per layer"):
        mc.region_plan(RegisteredCache(PRESETS["kv_tuple"], 1, 2, 2, 2, 2, "bfloat16"), 0)


# -- the engine's own code, where vllm is installed ---------------------------------------


def _case(p: int, d: int, heads: int) -> TransferCase:
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2)
    return TransferCase(StageLayout(p), StageLayout(d), model, VLLM_MOONCAKE)


@needs_vllm
def test_tp8_into_tp1_with_4_heads_is_written_by_one_replica_per_head() -> None:  # pragma: no cover
    adapter = mc.VllmMooncakeAdapter()
    assert list(adapter.sources(_case(8, 1, 4), 0)) == [0, 2, 4, 6]  # vllm#52516's fix


@needs_vllm
def test_the_plan_without_the_fix_argument_loses_heads_and_the_suite_says_corrupts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # pragma: no cover
    """A release before vllm#52516 calls the plan without ``total_num_kv_heads``: the
    adapter calls what the release takes, and PLAN-2 then finds heads 1..3 never written."""
    from kvspec.conformance import get_check, run_check

    adapter = mc.VllmMooncakeAdapter()
    fixed = adapter.conn._compute_sender_transfer_plan

    def before_the_fix(
        local_tp_rank: int,
        local_tp_size: int,
        remote_tp_rank: int,
        remote_tp_size: int,
        local_kv_block_len: int,
        remote_kv_block_len: int,
        producer_cache_replicated: bool,
    ) -> tuple[bool, int, int, int]:
        return fixed(
            local_tp_rank,
            local_tp_size,
            remote_tp_rank,
            remote_tp_size,
            local_kv_block_len,
            remote_kv_block_len,
            producer_cache_replicated,
        )

    monkeypatch.setattr(adapter.conn, "_compute_sender_transfer_plan", before_the_fix)
    adapter._writers.cache_clear()
    case = _case(8, 1, 4)
    assert list(adapter.sources(case, 0)) == [0]
    result = run_check(get_check("PLAN-2/exact-cover"), adapter, replay=case.to_dict())
    assert result.verdict == "FAILED" and result.tier == "corrupts", result.reason
    assert "never receives" in result.reason


@needs_vllm
@pytest.mark.parametrize(
    ("p", "d", "heads", "accepted", "said"),
    [
        (8, 1, 4, True, "accepts"),
        (4, 2, 8, True, "accepts"),
        (3, 2, 6, False, "not divisible"),
        (4, 2, 6, False, "6 is not divisible by 4"),  # QKVParallelLinear
        (8, 2, 0, True, "accepts"),
    ],
)
def test_serving_accepts_runs_vllms_checks(p, d, heads, accepted, said) -> None:  # pragma: no cover
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2)
    config = {"source": {"tp": p, "pp": 1}, "target": {"tp": d, "pp": 1}, "model": model.to_dict()}
    verdict = mc.VllmMooncakeAdapter().serving_accepts(config)
    assert verdict.accepted is accepted, verdict.evidence
    assert said in verdict.evidence


@needs_vllm
def test_the_engines_transfer_list_writes_the_share_exactly() -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    example = {
        "case": _case(8, 2, 4).to_dict(),
        "edge": [2, 0],
        "tokens": [1, 4],
        "sides": [
            {"layout": "vllm_packed_hnd", "block_size": 1, "num_blocks": n, "block_ids": ids}
            for n, ids in ((5, [3, 0, 4, 1]), (4, [2, 1, 3, 0]))
        ],
    }
    result = run_check(get_check("DESC-1/exact-effect"), mc.VllmMooncakeAdapter(), replay=example)
    assert result.verdict == "passed", result.reason
