"""The vLLM-Omni adapter against the installed engine: what its serving path runs.

Needs vllm-omni 0.30.0 and vllm 0.30.0 importable (`make field` builds them into
.venv-field/engines/vllm-omni); run with that directory on PYTHONPATH, e.g.
`PYTHONPATH=.venv-field/engines/vllm-omni .venv/bin/python -m pytest`
`tests/suite/test_field_omni.py`.
Skipped where vllm_omni is not importable.
"""

import pytest
import torch

pytest.importorskip("vllm_omni", reason="vllm_omni is not installed; `make field` runs it")

from kvspec.adapters import vllm_omni
from kvspec.memory.cache_layout import CacheShape, empty_cache, kv_views
from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


def case(s: int, t: int, heads: int) -> TransferCase:
    return TransferCase(StageLayout(s), StageLayout(t), ModelShape(2, heads, 2))


@pytest.fixture(scope="module")
def omni() -> vllm_omni.VllmOmniAdapter:
    return vllm_omni.VllmOmniAdapter()


@pytest.fixture(scope="module")
def mixin() -> vllm_omni.VllmOmniMixinReceiverAdapter:
    return vllm_omni.VllmOmniMixinReceiverAdapter()


def test_the_v1_sender_has_the_mixins_hooks_and_sends_its_whole_shard(omni) -> None:
    tc = case(2, 4, 8)
    source_shard = shard(random_request_kv(tc.model, 3), tc.source, tc.model)[1]
    connector = vllm_omni.MemoryConnector()
    manager = omni._manager(tc, 1, connector)
    runner = omni._install_hooks(manager)
    assert manager.kv_send_key_builder == runner.get_rank_aware_kv_send_keys
    assert manager.kv_payload_slicer == runner._slice_rank_sharded_kv_payload
    assert manager.kv_payload_merger == runner._merge_rank_sharded_kv_payloads
    out = omni.sender_transform(tc, 1, source_shard, "receiver")
    assert sorted(out) == [2, 3]  # rank 1's targets, each given all 4 of its heads
    for kv in out.values():
        assert torch.equal(kv.data.view(torch.int16), source_shard.data.view(torch.int16))
    sliced = omni.sender_transform(tc, 1, source_shard, "sender")  # model runner v2
    assert [kv.data.shape[3] for kv in sliced.values()] == [2, 2]


def _unsliceable(tc: TransferCase):
    """TP2 -> TP8 with 4 KV heads: sender rank 0's whole 2-head shard, as the v1 sender
    puts it (no slicing) for receiver rank 1, which owns head 0 (a replica)."""
    full = random_request_kv(tc.model, 2)
    plan = tc.plan()
    shipment = send(plan, 0, shard(full, tc.source, tc.model)[0], slicing="receiver")[1]
    return shipment


def test_the_serving_receiver_refuses_an_unsliceable_shard_and_the_mixin_passes_it(
    omni, mixin
) -> None:
    tc = case(2, 8, 4)
    shipment = _unsliceable(tc)
    assert shipment.kv.data.shape[3] == 2  # the sender's two heads
    # the DiT receiver (no hooks): slice_kv_tensor_heads refuses, naming the counts
    with pytest.raises(ValueError, match=r"heads_in_shard=2, num_slices=4"):
        omni.apply_marker(tc, 1, shipment)
    with pytest.raises(ValueError, match=r"heads_in_shard=2, num_slices=4"):
        omni.receiver_combine(tc, 1, [shipment])
    # the mixin's slicer: 2 % 4 != 0, so the tensor passes through at full width
    got = mixin.receiver_combine(tc, 1, [shipment])
    assert got.data.shape[3] == 2  # receiver rank 1 owns one head
    assert torch.equal(got.data.view(torch.int16), shipment.kv.data.view(torch.int16))
    assert mixin.serving_accepts({"source": {"tp": 2}, "target": {"tp": 8}}).accepted is False


@pytest.mark.parametrize("layout", ["vllm_packed_nhd", "vllm_packed_hnd"])
def test_reads_the_per_layer_views_vllm_030_hands_the_connector(omni, layout) -> None:
    cache = empty_cache(layout, CacheShape(2, 3, 4, 2, 5), "float32", "cpu")
    cache.copy_(torch.randn(cache.shape))
    view = omni.vllm_view(cache, layout)
    assert list(view.shape) == [3, 2, 4, 10]  # [B, H, N, 2 * head_size], logical
    assert view.data_ptr() == cache.data_ptr()
    got = omni.read_layer(cache, layout)
    for have, want in zip(got, kv_views(cache, layout), strict=True):
        assert torch.equal(have, want)
    with pytest.raises(ValueError, match="flash_attn"):
        omni.read_layer(cache, "flash_attn")  # vLLM 0.30 allocates no such cache


def test_serving_accepts_runs_vllms_and_omnis_own_checks(omni) -> None:
    def config(s: int, t: int, heads: int) -> dict:
        model = {"num_layers": 2, "num_kv_heads": heads, "head_dim": 8}
        return {"source": {"tp": s}, "target": {"tp": t}, "model": model}

    ok = omni.serving_accepts(config(4, 2, 2))
    assert ok.accepted and "verify_with_parallel_config" in ok.evidence
    kv = omni.serving_accepts(config(2, 1, 3))  # 3 KV heads over TP2: QKVParallelLinear
    assert not kv.accepted and "3 is not divisible by 2" in kv.evidence
    pair = omni.serving_accepts(config(3, 2, 6))  # vLLM starts; vLLM-Omni refuses the pair
    assert not pair.accepted and "must be divisible" in pair.evidence
    mla = {**config(2, 2, 1), "model": {"num_layers": 2, "num_kv_heads": 1, "attention": "mla"}}
    assert omni.serving_accepts(mla) is None
