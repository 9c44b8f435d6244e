"""The SGLang transfer-backend adapters (kvspec/adapters/sglang_mooncake.py,
sglang_nixl.py, _sglang_backend.py): their translation on data alone, and, where sglang
is installed (the field venv), each backend's own sender judged by DESC-1, with a field
bug of each sender put back and caught."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import numpy as np
import pytest

from kvspec.adapters import _sglang_backend as backend
from kvspec.adapters import sglang_nixl
from kvspec.conformance.adapter import BUILTIN
from kvspec.memory.cache_layout import PRESETS, get_layout
from kvspec.memory.descriptors import RegisteredCache, judge_descriptors, plan_descriptors
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import SGLANG
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


def test_both_backends_have_built_in_names() -> None:
    assert BUILTIN["sglang-mooncake"].endswith("sglang_mooncake:SglangMooncakeAdapter")
    assert BUILTIN["sglang-nixl"].endswith("sglang_nixl:SglangNixlAdapter")


def test_pointers_follow_sglangs_order_k_of_every_layer_then_v() -> None:
    mha = RegisteredCache(PRESETS["sglang_mha"], 2, 3, 1, 2, 2, "bfloat16")
    plan = backend.AddressPlan.of(mha)
    assert plan.names == ("L0.K", "L1.K", "L0.V", "L1.V")
    assert plan.locate(plan.ptrs[2] + 5) == ("L0.V", 5)
    assert plan.item_lens == [2 * 2 * 2] * 4  # one slot: 2 heads x 2 dims x 2 bytes
    mla = RegisteredCache(PRESETS["sglang_mla"], 2, 3, 1, 1, 2, "bfloat16", tensors_per_layer=1)
    assert backend.AddressPlan.of(mla).names == ("L0", "L1")
    with pytest.raises(ValueError, match="vllm_packed_hnd"):
        backend.AddressPlan.of(
            RegisteredCache(PRESETS["vllm_packed_hnd"], 1, 2, 1, 1, 2, "bfloat16")
        )


def test_pages_of_a_token_range() -> None:
    assert backend.page_indices([7, 3, 5, 1], range(1, 3), 1).tolist() == [3, 5]
    assert backend.page_indices([7, 3, 5], range(3, 7), 2).tolist() == [3, 5]


def test_a_copy_past_a_registered_region_is_refused_naming_it() -> None:
    short = RegisteredCache(
        PRESETS["sglang_mha"], 1, 2, 1, 1, 2, "bfloat16", region_bytes={"L0.V": 5}
    )
    plan = backend.AddressPlan.of(short)
    assert backend.descriptors_of([(plan.ptrs[0], plan.ptrs[1], 4)], plan, plan)[0].length == 4
    with pytest.raises(ValueError, match=r"'L0.V'.*5 registered bytes"):
        backend.descriptors_of([(plan.ptrs[0], plan.ptrs[1] + 4, 4)], plan, plan)


def test_the_sender_choice_is_slices_only_for_mha_between_unequal_tp() -> None:
    mha = ModelShape(2, 4, 2)
    assert backend.sends_slices(TransferCase(StageLayout(2), StageLayout(1), mha))
    assert not backend.sends_slices(TransferCase(StageLayout(2), StageLayout(2), mha))
    assert not backend.sends_slices(
        TransferCase(StageLayout(2), StageLayout(1), ModelShape.mla(2, 4))
    )


def test_strided_runs_expand_to_one_descriptor_each() -> None:
    runs = np.array([[100, 4, 0, 10, 3]], dtype=np.uint64)
    assert sglang_nixl.expand_descs(runs) == [(100, 4), (110, 4), (120, 4)]
    assert sglang_nixl.expand_descs(np.array([[5, 2, 0]], dtype=np.uint64)) == [(5, 2)]


def test_the_recording_agent_resolves_prepped_writes_and_refuses_unequal_lengths() -> None:
    agent = sglang_nixl.RecordingAgent([(100, 8)], {"d": [(0, 3), (900, 16)]})
    src = agent.prep_xfer_dlist("", np.array([[100, 4, 0, 4, 2]], dtype=np.uint64), "VRAM")
    dst = agent.prep_xfer_dlist("d", np.array([[900, 4, 0, 8, 2]], dtype=np.uint64), "VRAM")
    agent.make_prepped_xfer("WRITE", src, [1, 0], dst, [0, 1])
    assert agent.copies == [(104, 900, 4), (100, 908, 4)]
    odd = agent.prep_xfer_dlist("d", np.array([[0, 3, 0]], dtype=np.uint64), "VRAM")
    with pytest.raises(ValueError, match="lengths differ"):
        agent.make_prepped_xfer("WRITE", src, [0], odd, [0])
    with pytest.raises(ValueError, match="2 source and 1 destination"):
        agent.make_prepped_xfer("WRITE", src, [0, 1], dst, [0])


def test_the_recording_agent_refuses_a_list_outside_the_memory_registered_for_its_side() -> None:
    # NIXL's prep_xfer_dlist: every descriptor inside a region registered by the agent the
    # list names (local: its own; a peer: that peer's metadata), else NIXL_ERR_NOT_FOUND.
    agent = sglang_nixl.RecordingAgent([(100, 8)], {"d": [(900, 16)]})
    assert agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([[104, 4, 0]], np.uint64), "") == 0
    with pytest.raises(sglang_nixl.NixlNotFound, match=r"descriptor 1 \(4 bytes at 0x6c\)"):
        agent.prep_xfer_dlist("", np.array([[100, 4, 0, 8, 2]], np.uint64), "VRAM")  # 108+4 > 108
    with pytest.raises(sglang_nixl.NixlNotFound, match="no local registered"):
        agent.prep_xfer_dlist("", np.array([[900, 4, 0]], np.uint64), "VRAM")  # the peer's
    with pytest.raises(sglang_nixl.NixlNotFound, match="agent 'd''s registered"):
        agent.prep_xfer_dlist("d", np.array([[912, 8, 0]], np.uint64), "VRAM")  # past its end
    with pytest.raises(sglang_nixl.NixlNotFound, match="'e'"):
        agent.prep_xfer_dlist("e", np.array([[900, 4, 0]], np.uint64), "VRAM")
    assert len(agent.lists) == 1  # a refused list is not kept


# -- the engines' own senders (field venv only) ---------------------------------------------

installed = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not installed, reason="sglang is not installed (field venv)")
BACKENDS = ("sglang-mooncake", "sglang-nixl")

PINS = [
    # (prefill TP, decode TP, KV heads, edge, layout): equal TP, fan-in, fan-out, a
    # replicated prefill (TP4 over 2 heads, sglang#19086) and decode (sglang#31968)
    (2, 2, 4, (1, 1), "sglang_mha"),
    (4, 2, 4, (3, 1), "sglang_mha"),
    (1, 2, 4, (0, 1), "sglang_mha"),
    (4, 1, 2, (2, 0), "sglang_mha"),
    (1, 4, 2, (0, 3), "sglang_mha"),
    (2, 1, 0, (0, 0), "sglang_mla"),
]


def judged(adapter, s, t, heads, edge, layout):  # pragma: no cover - field venv only
    model = ModelShape.mla(2, 2) if heads == 0 else ModelShape(2, heads, 2)
    case = TransferCase(StageLayout(s), StageLayout(t), model, policy=SGLANG)
    plan = case.plan(adapter.policy_rules.get(case.policy))
    caches = [
        RegisteredCache.of_rank(get_layout(layout), stage, model, rank, num_blocks=6, block_size=1)
        for stage, rank in ((case.source, edge[0]), (case.target, edge[1]))
    ]
    ids, tokens = ([3, 0, 5, 1, 2], [4, 2, 0, 5, 1]), range(1, 5)
    got = adapter.descriptors(case, *edge, caches[0], ids[0], caches[1], ids[1], tokens)
    reference = plan_descriptors(
        plan, plan.edge(*edge), caches[0], ids[0], caches[1], ids[1], tokens
    )
    return judge_descriptors(got, reference)


@pytest.fixture(scope="module", params=BACKENDS)
def adapter(request):  # pragma: no cover - field venv only
    from kvspec.conformance.adapter import load_adapter

    return load_adapter(request.param)


@needs_sglang
@pytest.mark.parametrize("pin", PINS, ids=lambda p: f"TP{p[0]}-TP{p[1]}-{p[2]}heads")
def test_each_backends_sender_writes_exactly_the_share(adapter, pin) -> None:  # pragma: no cover
    verdict = judged(adapter, *pin)
    assert verdict.ok, verdict.problems


@needs_sglang
def test_the_total_heads_bug_of_mooncakes_slice_sender_is_caught() -> None:  # pragma: no cover
    # sglang#19086 (field/history/bugs/sglang-mooncake-gather-total-heads.json): before
    # the fix, send_kvcache_slice had no total_kv_head_num and back-computed it as
    # kv_head_num x TP, 4 for 2 heads over prefill TP4; the fixed sender still falls
    # back to that product when the field is absent, so removing it puts the bug back.
    from kvspec.adapters.sglang_mooncake import SglangMooncakeAdapter

    class Before19086(SglangMooncakeAdapter):
        def _bare_manager(self, case, src, plan):
            manager = super()._bare_manager(case, src, plan)
            del manager.kv_args.total_kv_head_num
            return manager

    assert judged(SglangMooncakeAdapter(), 4, 1, 2, (2, 0), "sglang_mha").ok
    verdict = judged(Before19086(), 4, 1, 2, (2, 0), "sglang_mha")
    assert not verdict.ok
    assert judged(Before19086(), 2, 1, 4, (1, 0), "sglang_mha").ok  # no replication: right


def sglang_release() -> tuple[int, ...] | None:
    """The importable sglang's release as numbers, None without one."""
    try:
        return tuple(int(p) for p in importlib.metadata.version("sglang").split(".")[:3])
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(sglang_release() != (0, 5, 16), reason="needs sglang 0.5.16 (PYTHONPATH)")
def test_the_replicated_decode_groups_bug_of_nixls_prep_is_caught() -> None:  # pragma: no cover
    # sgl-project/sglang#31968 (field/history/bugs/sglang-nixl-replicated-decode-groups.json):
    # 0.5.16's _init_hetero_tp_prep_handle interleaves decode_tp // prefill_tp = 4 head groups
    # over 2 KV heads (prefill TP1 -> decode TP4), so the shared source list runs past the
    # registered region and NIXL refuses it, for every decode rank: breaks.
    from kvspec.adapters.sglang_nixl import SglangNixlAdapter

    nixl = SglangNixlAdapter()
    for decode in range(4):
        with pytest.raises(sglang_nixl.NixlNotFound, match="no local registered memory"):
            judged(nixl, 1, 4, 2, (0, decode), "sglang_mha")
    assert judged(nixl, 1, 4, 4, (0, 3), "sglang_mha").ok  # 4 heads: no replication, right


@pytest.mark.skipif(
    (sglang_release() or (0,)) < (0, 5, 17), reason="needs sglang 0.5.17 or newer (PYTHONPATH)"
)
def test_the_replicated_decode_groups_fix_passes_every_decode_rank() -> None:  # pragma: no cover
    # sgl-project/sglang#31968's fix (0.5.17): num_groups = decode_tp // prefill_tp //
    # dst_replication, 2 groups for 2 heads, inside the registered region.
    from kvspec.adapters.sglang_nixl import SglangNixlAdapter

    nixl = SglangNixlAdapter()
    for decode in range(4):
        verdict = judged(nixl, 1, 4, 2, (0, decode), "sglang_mha")
        assert verdict.ok, verdict.problems
