"""vLLM's canonical offloading map and layout registry through their adapters
(kvspec/adapters/vllm_canonical.py, vllm_layouts.py): translation on data alone, and,
where vllm is installed (`make field`), the engine's code against kvspec's CP rules and
layout presets, with a one-bug variant of each claim told apart."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from kvspec.adapters import vllm_canonical as vc
from kvspec.adapters import vllm_layouts as vl
from kvspec.memory.cache_layout import PRESETS as KVSPEC_PRESETS
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed; `make field` runs it")


def run(offset: int, size: int, n: int = 1, stride: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        canonical_offset=offset, fragment_size=size, num_fragments=n, canonical_stride=stride
    )


def test_canonical_cells_read_heads_then_tokens_of_an_lbhnc_page() -> None:
    # [H, span=4, cell=2 bytes]: offset 10 is head 1, token 1; a fragment of 2 cells
    assert vc.canonical_cells([run(10, 4)], 2, 4, mla=False) == [(1, 1), (1, 2)]
    # two fragments 8 bytes apart: tokens 0 and 0 of heads 0 and 1
    assert vc.canonical_cells([run(0, 2, 2, 8)], 2, 4, mla=False) == [(0, 0), (1, 0)]
    assert vc.canonical_cells([run(6, 3)], 3, 4, mla=True) == [(0, 2)]  # MLA: [span, cell]


def test_canonical_domain_is_interleave_and_powers_of_two() -> None:
    assert vc.DOMAIN.cp_rules == ("interleave",)
    assert all(t & (t - 1) == 0 for t in vc.DOMAIN.tp_sizes)
    assert max(vc.DOMAIN.dcp_sizes) > 1 and max(vc.DOMAIN.cp_sizes) > 1


def test_every_vllm_stride_order_names_a_kvspec_preset() -> None:
    assert set(vl.PRESETS) <= set(KVSPEC_PRESETS)
    assert sorted(vl.PRESETS.values()) == sorted(
        ["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]
    )


def test_a_cache_not_of_its_presets_shape_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'HND'"):
        vl.sizes_of(torch.zeros(2, 2, 2, 4), "HND")
    with pytest.raises(ValueError, match=r"4 axes\); got \[2, 2, 4\]"):
        vl.sizes_of(torch.zeros(2, 2, 4), "vllm_packed_hnd")
    with pytest.raises(ValueError, match="odd"):
        vl.sizes_of(torch.zeros(2, 2, 2, 3), "vllm_packed_hnd")
    assert vl.sizes_of(torch.zeros(3, 2, 4, 6), "vllm_packed_nhd") == {
        "blocks": 3,
        "slots": 2,
        "heads": 4,
        "dim": 6,
    }


# -- the engine's own code, where vllm is installed ---------------------------------------


@needs_vllm
def test_dcp_ranks_of_a_head_fill_alternate_canonical_tokens() -> None:  # pragma: no cover
    adapter = vc.VllmCanonicalAdapter()
    layout, model = StageLayout(8, dcp=2, cp_rule="interleave:1"), ModelShape(2, 4, 2)
    assert [adapter.owned(layout, model, r)[0] for r in (0, 1, 2)] == [range(0, 1)] * 2 + [
        range(1, 2)
    ]
    tokens = [[list(r) for r in adapter.owned_tokens(layout, model, r, 5)] for r in (0, 1)]
    assert tokens == [[[0], [2], [4]], [[1], [3]]]


@needs_vllm
def test_a_layer_vllm_cannot_certify_is_refused_not_read() -> None:  # pragma: no cover
    # 2 heads over TP6 with DCP2: 3 replicas a head, not a multiple of DCP
    layout = StageLayout(6, dcp=2, cp_rule="interleave:1")
    with pytest.raises(ValueError, match="cannot certify"):
        vc.VllmCanonicalAdapter().owned(layout, ModelShape(2, 2, 2), 0)


@needs_vllm
def test_cp_checks_pass_and_a_swapped_dcp_rank_is_caught(monkeypatch) -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    adapter = vc.VllmCanonicalAdapter()
    example = {
        "layout": StageLayout(8, dcp=2, cp_rule="interleave:1").to_dict(),
        "model": ModelShape(2, 4, 2).to_dict(),
        "seq_len": 9,
    }
    assert run_check(get_check("CP-3/dcp-tokens"), adapter, replay=example).verdict == "passed"
    # one bug: every rank reads its tokens as DCP rank 0's
    real = adapter.mapping._RankContext
    monkeypatch.setattr(
        adapter.mapping,
        "_RankContext",
        lambda **kw: real(**{**kw, "rank": kw["rank"] - kw["rank"] % kw["dcp_size"]}),
    )
    adapter._mappings.cache_clear()
    result = run_check(get_check("CP-3/dcp-tokens"), adapter, replay=example)
    assert result.verdict == "FAILED", result.reason


@needs_vllm
@pytest.mark.parametrize("preset", sorted(vl.PRESETS))
def test_each_stride_order_reads_its_preset(preset, monkeypatch) -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    adapter = vl.VllmLayoutsAdapter()
    example = {
        "layout": preset,
        "shape": {"kv": 2, "num_blocks": 3, "block_size": 2, "heads": 3, "head_dim": 2}
        | ({"layers": 2} if "layers" in preset or "bhlnc" in preset else {}),
        "dtype": "bfloat16",
        "seed": 1,
    }
    check = get_check("LAYOUT-1/read-named")
    assert run_check(check, adapter, replay=example).verdict == "passed"
    swapped = {"LBHNC": "LBNHC", "LBNHC": "LBHNC", "LHBNC": "LBHNC", "BLHNC": "BLNHC"}
    swapped |= {"BLNHC": "BLHNC", "BHLNC": "BLHNC"}
    monkeypatch.setattr(vl, "PRESETS", {**vl.PRESETS, preset: swapped[vl.PRESETS[preset]]})
    assert run_check(check, adapter, replay=example).verdict == "FAILED"
