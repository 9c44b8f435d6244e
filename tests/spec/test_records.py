"""ORACLE-6, LAYOUT-7: record caches filled field by field by coordinate, moved by block
table and as rows of bytes, and verified field by field, inline scales included."""

from __future__ import annotations

import pytest
import torch

from kvspec.memory.cache_layout import field_views
from kvspec.memory.paged import empty_model_cache
from kvspec.memory.records import (
    carrier_model,
    cell_bytes,
    gather_fields,
    gather_rows,
    record_fill,
    record_rows,
    row_fields,
    scatter_fields,
    scatter_rows,
    verify_fields,
)
from kvspec.tensors.dtypes import bits_view
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.topology.model import ModelShape

PTH = ModelShape(2, 4, 8, dtype="float8_e4m3fn")
FLASHMLA = ModelShape.mla(2, 576, dtype="float8_e4m3fn")


def _cache(layout: str, model: ModelShape, block_size: int = 4, num_blocks: int = 6):
    return empty_model_cache(
        layout,
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        scales=oracle_scales(model),
    )


def test_k_and_v_of_a_record_are_the_oracle_s_and_scales_are_positive() -> None:
    fields = record_fill(PTH, "vllm_pth_hnd", "r-1", tokens=range(3, 9), heads=range(1, 3))
    kv = oracle_kv(PTH, "r-1", tokens=range(3, 9), heads=range(1, 3)).data
    assert torch.equal(bits_view(fields["k"]), bits_view(kv[:, 0]))
    assert torch.equal(bits_view(fields["v"]), bits_view(kv[:, 1]))
    for name in ("k_scale", "v_scale"):
        scale = fields[name]
        assert scale.dtype == torch.float32 and scale.shape == (2, 6, 2, 1)
        assert bool((scale > 0).all()) and bool(torch.isfinite(scale).all())
    assert not torch.equal(fields["k_scale"], fields["v_scale"]), "the name is hashed"


def test_a_region_s_fill_is_that_part_of_the_whole_request_s() -> None:
    whole = record_fill(FLASHMLA, "flashmla_fp8", "r", tokens=10)
    part = record_fill(FLASHMLA, "flashmla_fp8", "r", tokens=range(4, 7), layers=range(1, 2))
    for name, value in part.items():
        assert torch.equal(bits_view(value), bits_view(whole[name][1:2, 4:7])), name


@pytest.mark.parametrize(
    ("layout", "model"),
    [("vllm_pth_hnd", PTH), ("vllm_pth_nhd", PTH), ("flashmla_fp8", FLASHMLA)],
)
def test_scatter_gather_and_verify_every_field(layout: str, model: ModelShape) -> None:
    cache = _cache(layout, model)
    fields = record_fill(model, layout, "r", tokens=10, seed=3)
    scatter_fields(fields, cache, [5, 0, 3])
    assert verify_fields(
        gather_fields(cache, [5, 0, 3], 10), model, layout, "r", tokens=10, seed=3
    ).ok
    # One bit of one inline scale in the cache's memory: the verifier names that field.
    scale = next(name for name in fields if name.endswith("scale"))
    bits_view(cache.fields(cache.layers[1])[scale])[0, 2, 0, 0] ^= 1
    verdict = verify_fields(
        gather_fields(cache, [5, 0, 3], 10), model, layout, "r", tokens=10, seed=3
    )
    assert verdict.mismatches == 1 and verdict.first is not None
    assert verdict.first.field == scale and (verdict.first.layer, verdict.first.token) == (1, 6)
    assert scale in verdict.message and "[ORACLE-6]" in verdict.message


def test_only_the_request_s_slots_are_written() -> None:
    cache = _cache("vllm_pth_nhd", PTH)
    before = [t.clone() for t in cache.layers]
    scatter_fields(record_fill(PTH, "vllm_pth_nhd", "r", tokens=5), cache, [2, 4])
    for old, new in zip(before, cache.layers, strict=True):
        changed = (bits_view(old) != bits_view(new)).any(dim=(2, 3))  # [blocks, slots]
        assert changed.nonzero().tolist() == [[2, 0], [2, 1], [2, 2], [2, 3], [4, 0]]


def test_rows_are_vllm_s_widened_head_size_and_read_back_bit_for_bit() -> None:
    """A pth cell's K row is K's bytes then its scale's, as vLLM's widened page holds them."""
    fields = record_fill(PTH, "vllm_pth_hnd", "r", tokens=5)
    rows = record_rows(fields, PTH, "vllm_pth_hnd")
    assert carrier_model(PTH, "vllm_pth_hnd").head_dim == 8 + 4 == rows.shape[-1]
    assert cell_bytes("vllm_pth_hnd", PTH) == 2 * (8 + 4)
    cache = _cache("vllm_pth_hnd", PTH)
    scatter_fields(fields, cache, [1, 3])
    page = field_views(cache.layers[0], "vllm_pth_hnd")["k"]  # a view into the page
    record = cache.layers[0][1, 2, 3].view(torch.uint8)  # block 1, head 2, slot 3
    assert torch.equal(record[:12], rows[0, 0, 3, 2].view(torch.uint8))
    assert torch.equal(bits_view(page[1, 3, 2]), bits_view(fields["k"][0, 3, 2]))
    back = row_fields(rows, PTH, "vllm_pth_hnd")
    for name, value in fields.items():
        assert torch.equal(bits_view(back[name]), bits_view(value)), name


def test_rows_move_between_hnd_and_nhd_and_block_sizes() -> None:
    src = _cache("vllm_pth_hnd", PTH, block_size=4)
    dst = _cache("vllm_pth_nhd", PTH, block_size=3, num_blocks=5)
    scatter_fields(record_fill(PTH, "vllm_pth_hnd", "r", tokens=7), src, [4, 1])
    scatter_rows(gather_rows(src, PTH, [4, 1], 7), dst, PTH, [0, 3, 2])
    assert verify_fields(gather_fields(dst, [0, 3, 2], 7), PTH, "vllm_pth_nhd", "r", tokens=7).ok


def test_refusals_name_the_values() -> None:
    with pytest.raises(ValueError, match=r"holds float8_e4m3fn caches, not bfloat16.*ORACLE-6"):
        record_fill(ModelShape(2, 4, 8), "vllm_pth_hnd", "r", tokens=3)
    with pytest.raises(ValueError, match=r"latent of 576, not 512.*ORACLE-6"):
        record_fill(ModelShape.mla(2, 512, dtype="float8_e4m3fn"), "flashmla_fp8", "r", tokens=3)
    with pytest.raises(ValueError, match=r"travel as themselves.*LAYOUT-7"):
        carrier_model(PTH, "vllm_packed_hnd")
    kv = gather_rows(_scattered(), PTH, [0, 1], 5)
    other = kv.scales.clone()
    other[1, 1] *= 2
    with pytest.raises(ValueError, match=r"layer 1 .*PAGED-5"):
        scatter_rows(type(kv)(kv.data, other), _cache("vllm_pth_hnd", PTH), PTH, [0, 1])
    with pytest.raises(ValueError, match=r"rows of shape .*LAYOUT-7"):
        row_fields(kv.data[..., :-1], PTH, "vllm_pth_hnd")


def _scattered():
    cache = _cache("vllm_pth_hnd", PTH)
    scatter_fields(record_fill(PTH, "vllm_pth_hnd", "r", tokens=5), cache, [0, 1])
    return cache
