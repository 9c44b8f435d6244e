"""The field adapters' translation code, on data alone: no engine package is needed.

Each adapter in kvspec/adapters keeps its kvspec <-> engine translation in pure
functions; these tests pin what those functions do. The adapters themselves run against
the installed engines in `make field` (field/run.sh); the last tests here run them too,
but only where an engine happens to be importable.
"""

import importlib
import sys

import pytest
import torch

from kvspec.adapters import _engine, sglang, vllm_nixl, vllm_omni
from kvspec.conformance import AdapterError, load_adapter
from kvspec.conformance.adapter import BUILTIN
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import payload_equal, payload_from_shipment

FIELD = ("vllm-omni", "vllm-nixl", "sglang", "vllm-mooncake", "vllm-moriio")
ENGINE = {name: "vllm" for name in FIELD} | {"vllm-omni": "vllm_omni", "sglang": "sglang"}
"""The package each field adapter imports."""


def case(s: int, t: int, heads: int, **kw) -> TransferCase:
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2, **kw)
    return TransferCase(StageLayout(s), StageLayout(t), model)


# -- the shared helpers -------------------------------------------------------------------


def test_invert_sources_lists_every_source_with_its_targets_ascending() -> None:
    assert _engine.invert_sources({1: [2, 0], 0: [0]}, range(4)) == {
        0: [0, 1],
        1: [],
        2: [1],
        3: [],
    }


def test_stage_coords_is_pp_rank_then_tp_rank() -> None:
    assert _engine.stage_coords(5, 2) == (2, 1)


def test_a_missing_engine_is_refused_with_what_to_install() -> None:
    with pytest.raises(AdapterError, match=r"needs thing 1\.0 installed.*make field"):
        _engine.import_engine("kvspec_no_such_engine.module", adapter="x", install="thing 1.0")


def test_an_unusable_package_gets_inert_modules_and_an_importable_one_does_not() -> None:
    assert not _engine.stand_in_if_unusable("json")  # imports: left alone
    name = "kvspec_test_absent_pkg"
    try:
        assert _engine.stand_in_if_unusable(name)
        module = importlib.import_module(f"{name}.transforms.functional")
        assert module.__version__ == "0.0.0"
        mode = module.InterpolationMode  # attributes resolve at import time ...
        with pytest.raises(RuntimeError, match="inert stand-in"):
            mode.BICUBIC()  # ... and any call refuses
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "root", None) != name]
        for key in [k for k in sys.modules if k.split(".")[0] == name]:
            del sys.modules[key]


@pytest.mark.parametrize("name", FIELD)
def test_field_adapters_are_built_in_and_load_lazily(name: str) -> None:
    module = importlib.import_module(BUILTIN[name].split(":")[0])  # kvspec alone imports it
    assert name == module.NAME
    engine = ENGINE[name]
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here; `make field` runs this adapter")
    with pytest.raises(AdapterError, match=f"the '{name}' adapter .* needs .*make field"):
        load_adapter(name)


# -- vLLM-Omni ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", [ModelShape(3, 2, 4), ModelShape.mla(3, 4)])
def test_omni_layer_blocks_round_trip(model: ModelShape) -> None:
    kv = random_request_kv(model, 5, seed=1)
    blocks = vllm_omni.layer_blocks_of(kv)
    assert [t.shape for t in blocks["key_cache"]] == [kv.data[0, 0].shape] * 3
    assert (blocks["value_cache"] == [None] * 3) == (model.attention == "mla")
    back = vllm_omni.request_kv_of(blocks, num_layers=3)
    assert torch.equal(back.data.view(torch.int16), kv.data.view(torch.int16))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b["key_cache"].pop(), "returned 2 layers of K, expected 3"),
        (lambda b: b["key_cache"].__setitem__(1, None), r"no K for layers \[1\]"),
        (lambda b: b["value_cache"].__setitem__(0, None), "V for some layers only"),
        (lambda b: b["value_cache"].__setitem__(0, torch.zeros(1, 1, 1)), "different shapes"),
    ],
)
def test_omni_results_that_are_no_shard_are_refused(edit, message: str) -> None:
    blocks = vllm_omni.layer_blocks_of(random_request_kv(ModelShape(3, 2, 4), 2))
    edit(blocks)
    with pytest.raises(ValueError, match=message):
        vllm_omni.request_kv_of(blocks, num_layers=3)


def test_omni_transfer_fields_are_what_extract_kv_cache_writes() -> None:
    kv = random_request_kv(ModelShape(2, 2, 4), 3)
    marker = HeadSlice(1, 2, 4, 1, 2, applied=True, side="sender")
    fields = vllm_omni.transfer_fields(kv, marker=marker)
    assert fields["metadata"] == {
        "block_size": 16,
        "num_layers": 2,
        "dtype": "bfloat16",
        "seq_len": 3,
        "tp_head_slice": marker.to_dict(),
    }
    assert set(fields) == {"request_id", "layer_blocks", "block_ids", "metadata"}
    assert "tp_head_slice" not in vllm_omni.transfer_fields(kv, marker=None)["metadata"]


def test_omni_payload_translation_round_trips_a_merged_shard() -> None:
    tc = case(4, 2, 8)
    plan = tc.plan()
    shards = shard(random_request_kv(tc.model, 2), tc.source, tc.model)
    shipment = send(plan, 0, shards[0], slicing="sender")[0]
    payload = payload_from_shipment(plan, shipment, "req-1")
    fields = vllm_omni.payload_fields(payload)
    assert set(fields) == {"request_id", "layer_blocks", "block_ids", "metadata"}
    # vLLM-Omni's own marker (with its extra source_rank) is not carried back.
    fields["metadata"]["tp_head_slice"] = {**fields["metadata"]["tp_head_slice"], "source_rank": 0}
    marker = vllm_omni.merged_marker(tc, 0)
    assert (marker.offset_in_shard, marker.num_slices, marker.side) == (0, 1, "receiver")
    back = vllm_omni.payload_of(fields, head_slice=marker)
    assert payload_equal(back, payload.__class__(**{**payload.__dict__, "head_slice": marker}))


def test_omni_none_marks_the_single_sender_rank_zero() -> None:
    assert vllm_omni.recv_sources([("k", None), ("j", 3)]) == [("k", 0), ("j", 3)]


def test_omni_domain_is_what_omni_does_no_pp_no_mla_no_fp8_and_vllm_030s_layouts() -> None:
    assert vllm_omni.DOMAIN.holds(case(4, 2, 2))  # replication: inside, nothing refuses it
    assert not vllm_omni.DOMAIN.holds(case(4, 2, 0))  # MLA: normalize_layer_kv has no latent
    assert not vllm_omni.DOMAIN.holds(case(4, 2, 8, dtype="float8_e4m3fn"))
    pp = TransferCase(StageLayout(1, 2), StageLayout(1), ModelShape(2, 2, 2))
    assert not vllm_omni.DOMAIN.holds(pp)
    # the per-layer views vLLM 0.30 hands a connector, not the 5-D stacks of vLLM <= 0.22
    assert vllm_omni.DOMAIN.layouts == ("vllm_packed_nhd", "vllm_packed_hnd")
    assert dict(vllm_omni.VLLM_LAYOUTS) == {"vllm_packed_nhd": "LBNHC", "vllm_packed_hnd": "LBHNC"}


def test_omni_contract_names_real_obligations_and_refuses_with_value_error() -> None:
    from kvspec.core.clauses import all_obligations

    known = all_obligations()
    assert set(vllm_omni.SERVING_NEVER_PRODUCES) <= set(known)
    assert vllm_omni.REFUSAL_TYPES[0] is ValueError and len(vllm_omni.REFUSAL_TYPES) == 1
    # every reason cites engine code, not an opinion
    assert all("(" in why and "_" in why for why in vllm_omni.SERVING_NEVER_PRODUCES.values())


def test_omni_shipments_translate_with_their_marker() -> None:
    tc = case(2, 4, 8)
    shipment = send(
        tc.plan(),
        0,
        shard(random_request_kv(tc.model, 2), tc.source, tc.model)[0],
        slicing="receiver",
    )[1]
    data = vllm_omni.shipment_payload(shipment)
    assert data["metadata"]["tp_head_slice"] == shipment.marker.to_dict()
    data["metadata"]["tp_head_slice"] = {
        **shipment.marker.to_dict(),
        "applied": True,
        "side": "receiver",
        "source_rank": 0,  # vLLM-Omni's extra key is dropped
    }
    back = vllm_omni.shipment_of(shipment, data)
    assert back.marker.applied and back.marker.side == "receiver"
    assert back.edge == shipment.edge
    assert torch.equal(back.kv.data.view(torch.int16), shipment.kv.data.view(torch.int16))
    del data["metadata"]["tp_head_slice"]
    assert vllm_omni.shipment_of(shipment, data).marker == shipment.marker


# -- vLLM NIXL ----------------------------------------------------------------------------


def test_nixl_domain_leaves_out_what_vllm_refuses() -> None:
    def inside(tc: TransferCase) -> bool:
        return vllm_nixl.DOMAIN.holds(tc) and not vllm_nixl.refuses_replicated_fan_in(tc)

    assert inside(case(2, 8, 2))  # decode replicates: supported
    assert inside(case(8, 2, 8))  # fan-in without replication
    assert not inside(case(8, 2, 4))  # prefill replicates on fan-in: asserted
    assert inside(case(8, 2, 0))  # MLA reads once
    assert not inside(case(2, 2, 2, dtype="float8_e5m2"))
    assert not inside(TransferCase(StageLayout(1), StageLayout(1, 2), ModelShape(2, 2, 2)))


def test_nixl_local_heads_is_max_one_heads_over_tp() -> None:
    assert vllm_nixl.local_heads(ModelShape(2, 8, 2), 4) == 2
    assert vllm_nixl.local_heads(ModelShape(2, 2, 2), 8) == 1
    assert vllm_nixl.local_heads(ModelShape.mla(2, 4), 8) == 1


def test_nixl_a_read_is_the_slot_of_local_width() -> None:
    whole = RequestKV(torch.arange(2 * 2 * 1 * 4 * 1).reshape(2, 2, 1, 4, 1))
    got = vllm_nixl.read_slice(whole, 1, 2)
    assert torch.equal(got.data, whole.data[:, :, :, 2:4])
    with pytest.raises(ValueError, match="runs past the prefill shard's 4 head"):
        vllm_nixl.read_slice(whole, 2, 2)


def test_nixl_reads_land_in_their_slots_exactly_once() -> None:
    a = RequestKV(torch.full((1, 2, 1, 1, 1), 1.0))
    b = RequestKV(torch.full((1, 2, 1, 1, 1), 2.0))
    out = vllm_nixl.place_reads({4: a, 6: b}, {4: 1, 6: 0}, heads=2)
    assert out.data[0, 0, 0, :, 0].tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="each must be once"):
        vllm_nixl.place_reads({4: a, 6: b}, {4: 0, 6: 0}, heads=2)
    with pytest.raises(ValueError, match="past local head 1"):
        vllm_nixl.place_reads({4: a}, {4: 2}, heads=2)


def test_nixl_config_holds_what_the_compatibility_hash_reads() -> None:
    config = vllm_nixl.vllm_config(ModelShape(3, 4, 8, dtype="float8_e4m3fn").to_dict())
    m = config.model_config
    facts = (m.get_total_num_kv_heads(), m.get_head_size(), m.get_total_num_hidden_layers())
    assert (*facts, m.dtype) == (4, 8, 3, "bfloat16")
    assert config.cache_config.cache_dtype == "fp8_e4m3"
    assert config.speculative_config is None
    with pytest.raises(ValueError, match="no KV cache dtype for 'int8'"):
        vllm_nixl.vllm_config({"dtype": "int8"})
    assert vllm_nixl.backend_name({"attention": "mla"}) != vllm_nixl.backend_name({})


# -- SGLang -------------------------------------------------------------------------------


def test_sglang_domain_follows_its_pp_assert_and_leaves_out_fp8() -> None:
    both = TransferCase(StageLayout(2, 2), StageLayout(2, 2), ModelShape(4, 2, 2))
    decode_one = TransferCase(StageLayout(2, 2), StageLayout(2), ModelShape(4, 2, 2))
    other = TransferCase(StageLayout(2, 2), StageLayout(2, 3), ModelShape(6, 2, 2))
    assert sglang.pp_pair_supported(both) and sglang.pp_pair_supported(decode_one)
    assert not sglang.pp_pair_supported(other)
    assert sglang.DOMAIN.holds(both)
    assert not sglang.DOMAIN.holds(case(2, 2, 2, dtype="float8_e4m3fn"))


def test_sglang_decode_manager_has_the_attributes_the_rank_mapping_reads() -> None:
    tc = TransferCase(StageLayout(4, 2), StageLayout(2, 2), ModelShape(4, 4, 2))
    m = sglang.decode_manager(tc, 3)
    assert (m.pp_rank, m.kv_args.engine_rank, m.attn_tp_size, m.pp_size) == (1, 1, 2, 2)
    assert not m.is_mla_backend and m.attn_cp_size == 1
    info = sglang.prefill_info_fields(tc)
    assert (info["attn_tp_size"], info["pp_size"], info["attn_cp_size"]) == (4, 2, 1)


def test_sglang_real_senders_are_stage_local_and_one_for_mla() -> None:
    info = type("Info", (), {"target_tp_ranks": [2, 3], "target_tp_rank": 2})()
    info.target_pp_ranks = [0, 1]
    assert sglang.real_senders(info, mla=False, source_tp=4) == [2, 3, 6, 7]
    assert sglang.real_senders(info, mla=True, source_tp=4) == [2, 6]


def test_sglang_takes_an_explicit_partition_as_its_environment_variable() -> None:
    assert sglang.partition_setting([1, 3]) == "1,3"
    assert sglang.partition_setting(None) is None


def test_sglang_slices_heads_only_for_unequal_tp_without_mla() -> None:
    assert sglang.sends_head_slices(case(4, 2, 8))
    assert not sglang.sends_head_slices(case(2, 2, 8))
    assert not sglang.sends_head_slices(case(4, 2, 0))


def test_sglang_layer_pointers_list_k_then_v() -> None:
    v = sglang.V_OFFSET
    assert sglang.layer_pointers([1, 2]) == [1, 2, v + 1, v + 2]
    assert sglang.layer_pointers([1, 2], kv=1) == [1, 2]
    assert sglang.pointer_target(v + 3) == (1, 3) and sglang.pointer_target(3) == (0, 3)


def test_sglang_writes_pair_lists_as_far_as_both_reach() -> None:
    v = sglang.V_OFFSET
    writes = sglang.paired_writes([[1, 2], [v + 1, v + 2]], [[5, v + 5], [v + 6]])
    # K of layer 2 lands in V of layer 5: the pairing decides, the adapter only reads it.
    assert writes == [((0, 1), (0, 5)), ((0, 2), (1, 5)), ((1, 1), (1, 6))]
    with pytest.raises(ValueError):
        sglang.paired_writes([[1]], [[1], [2]])


# -- the adapters themselves, where an engine is importable here ---------------------------


@pytest.mark.parametrize("name", FIELD)
def test_field_adapter_checks_a_common_case_when_its_engine_is_installed(name: str) -> None:
    engine = ENGINE[name]
    pytest.importorskip(engine, reason=f"{engine} is not installed; `make field` runs it")
    from kvspec.conformance import get_check, run_check

    adapter = load_adapter(name)
    routed = {**case(4, 2, 8).to_dict(), "policy": adapter.drawn_policies[0]}  # its own rule
    example = {"case": routed, "seq_len": 2, "seed": 0}
    result = run_check(get_check("RESHARD-2/round-trip"), adapter, replay=example)
    assert result.verdict == "passed", result.reason
