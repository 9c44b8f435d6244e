"""Block-scaled layouts restated from their sources [LAYOUT-8, ORACLE-8, DESC-1].

vLLM 0.33.0's NVFP4 page and SGLang 0.5.23's MXFP8 scales are written here again from
the engines' own formulas — vllm/utils/torch_utils.py ``nvfp4_split_data_scale`` (each
side [data | scale]), ``swizzle_scale_offset`` (csrc/libtorch_stable/
nvfp4_kv_cache_kernels.cu), SGLang's ``store_sf_interleaved`` (u32 position
(t % 32) * 4 + t // 32) — and compared with kvspec's field views, descriptors and sim.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvspec.memory.cache_layout import CacheShape, convert, empty_cache, field_views
from kvspec.memory.descriptors import (
    RegisteredCache,
    execute_descriptors,
    plan_descriptors,
    region_buffers,
)
from kvspec.memory.layout_files import LayoutFileError, layout_from_json
from kvspec.memory.paged import empty_paged_cache
from kvspec.memory.presets import PRESETS
from kvspec.memory.records import gather_fields, record_fill, scatter_fields, verify_fields
from kvspec.tensors.oracle import oracle_hashes, oracle_scales
from kvspec.tensors.scaled_oracle import unpack_fp4
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout


def _random(cache, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for t in cache if isinstance(cache, tuple) else (cache,):
        raw = t.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))
    return cache


def _vllm_swizzle(t: int, s: int, scale_dim: int) -> int:
    """vLLM's swizzle_scale_offset, as its kernel computes it."""
    s_group = scale_dim // 4
    swizzled_t = (t // 4) * 4 + (s // s_group)
    swizzled_s = (s % s_group) * 4 + (t % 4)
    return swizzled_t * scale_dim + swizzled_s


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("swizzled", [True, False])
def test_nvfp4_page_is_vllms(head_dim: int, swizzled: bool) -> None:
    """LAYOUT-8.1/8.2: [K data | K scale | V data | V scale] per block, K scales linear, V
    scales at swizzle_scale_offset on SM100 and linear on the FlashInfer FA2 path."""
    name = "vllm_nvfp4_hnd" if swizzled else "vllm_nvfp4_fa2_hnd"
    blocks, n, h = 3, 8, 2
    cache = _random(empty_cache(name, CacheShape(2, blocks, n, h, head_dim), "bfloat16"))
    assert cache.shape == (blocks, 2 * h, n, head_dim // 2 + head_dim // 16)  # customize_spec
    views = field_views(cache, name)
    flat = cache.view(blocks, -1)
    data, sdim = head_dim // 2, head_dim // 16
    side = h * n * (data + sdim)  # one side (K or V) of a page
    for b in range(blocks):
        for kv, part in enumerate("kv"):
            base = kv * side
            for head in range(h):
                for t in range(n):
                    at = base + (head * n + t) * data
                    got = views[part][b, t, head]
                    assert torch.equal(got, flat[b, at : at + data]), (part, b, head, t)
                    for s in range(sdim):
                        plane = base + h * n * data + head * n * sdim
                        linear = t * sdim + s
                        where = _vllm_swizzle(t, s, sdim) if (swizzled and part == "v") else linear
                        field = views[f"{part}_scale"]
                        got_s = (
                            field[b, t // 4, t % 4, head, s]
                            if field.dim() == 5
                            else field[b, t, head, s]
                        )
                        assert int(got_s.view(torch.uint8)) == int(flat[b, plane + where])


def test_mxfp8_scales_are_sglangs_interleave() -> None:
    """LAYOUT-8.2/8.3: slot t of page p, head h, scale s at [p, h, t % 32, t // 32, s]:
    byte ((t % 32) * 4 + t // 32) * 4 + s of the (page, head) row (store_sf_interleaved)."""
    shape = CacheShape(2, 2, 128, 2, 128)
    k, v, ks, vs = _random(empty_cache("sglang_mxfp8", shape, "float8_e4m3fn"))
    views = field_views((k, v, ks, vs), "sglang_mxfp8", block_size=128)
    for part, tensor in (("k_scale", ks), ("v_scale", vs)):
        rows = tensor.view(2, 2, -1)
        for p in range(2):
            for head in range(2):
                for t in range(128):
                    at = ((t % 32) * 4 + t // 32) * 4
                    want = rows[p, head, at : at + 4]
                    assert torch.equal(views[part][p, t // 32, t % 32, head], want)
    assert views["k"].data_ptr() == k.data_ptr()  # K and V are the pool's rows, as views
    assert torch.equal(views["v"][1, 5, 1].view(torch.uint8), v[128 + 5, 1].view(torch.uint8))


def test_swizzled_and_linear_pages_convert_and_differ_only_in_v_scales() -> None:
    """The SM100 page and the SM120 page hold the same information: a converted cache
    reads the same fields, and only V scale bytes moved [LAYOUT-3, LAYOUT-8.2]."""
    shape = CacheShape(2, 2, 8, 2, 64)
    cache = _random(empty_cache("vllm_nvfp4_hnd", shape, "bfloat16"))
    out = convert(cache, "vllm_nvfp4_hnd", "vllm_nvfp4_fa2_hnd")
    a, b = field_views(cache, "vllm_nvfp4_hnd"), field_views(out, "vllm_nvfp4_fa2_hnd")
    for name in a:
        have = a[name].flatten(1, 2) if a[name].dim() == 5 else a[name]
        assert torch.equal(have.view(torch.uint8), b[name].view(torch.uint8))  # bits [DTYPE-2]
    moved = (cache != out).view(2, -1).any(0).nonzero().flatten()
    v_scales = 2 * 2 * 8 * 32 + 2 * 8 * 4  # after K data, K scales and V data
    assert int(moved.min()) >= v_scales and bool((moved != 0).any())


def test_fp4_values_are_oracle1_hashes_two_a_byte() -> None:
    """ORACLE-8.1-8.3: fp4 k holds ORACLE-1's K hashes, h & 15 with a zero magnitude made
    0.5, value 2i in the low nibble; e8m0 bytes are 123 + ((h >> 1) & 7)."""
    model = ModelShape(2, 2, 64, dtype="bfloat16")
    fill = record_fill(model, "vllm_nvfp4_hnd", "r", tokens=range(3, 7))
    h = oracle_hashes(model, "r", tokens=range(3, 7))
    codes = h & 15
    codes = torch.where((codes & 7) == 0, codes | 1, codes)
    assert torch.equal(unpack_fp4(fill["k"]).long(), codes[:, 0])
    assert torch.equal(unpack_fp4(fill["v"]).long(), codes[:, 1])
    assert torch.equal(fill["k"] & 15, codes[:, 0, ..., 0::2].to(torch.uint8))
    mx = record_fill(ModelShape(1, 1, 64, dtype="float8_e4m3fn"), "sglang_mxfp8", "r", tokens=9)
    assert int(mx["k_scale"].min()) >= 123 and int(mx["k_scale"].max()) <= 130


@pytest.mark.parametrize(
    ("src", "dst", "dtype", "head_dim", "blocks"),
    [
        ("vllm_nvfp4_hnd", "vllm_nvfp4_hnd", "bfloat16", 64, (8, 4)),
        ("vllm_nvfp4_fa2_hnd", "vllm_nvfp4_hnd", "float16", 128, (4, 8)),
        ("sglang_mxfp8", "sglang_mxfp8", "float8_e4m3fn", 128, (128, 128)),
    ],
)
def test_descriptors_move_exactly_the_share_even_inside_a_group(src, dst, dtype, head_dim, blocks):
    """DESC-1 over block-scaled caches: a token range ending inside a 4-token group (or a
    32 x 4 interleave) is moved byte by byte, exactly: every field of the share right,
    no other byte of the receiver written."""
    model = ModelShape(2, 4, head_dim, dtype=dtype)
    plan = plan_transfer(StageLayout(4), StageLayout(2), model)
    edge = plan.edge(3, 1)
    seq = 2 * blocks[0] + 3  # a partial last group
    scales = oracle_scales(model)
    ns, nd = -(-seq // blocks[0]), -(-seq // blocks[1])
    sender = empty_paged_cache(
        src,
        num_layers=2,
        num_blocks=ns + 1,
        block_size=blocks[0],
        heads=1,
        head_dim=head_dim,
        dtype=dtype,
        scales=scales,
    )
    receiver = empty_paged_cache(
        dst,
        num_layers=2,
        num_blocks=nd + 2,
        block_size=blocks[1],
        heads=2,
        head_dim=head_dim,
        dtype=dtype,
        scales=scales,
    )
    for layer in receiver.layers:
        for t in layer if isinstance(layer, tuple) else (layer,):
            t.view(torch.uint8).fill_(0xA5)
    before = {k: v.clone() for k, v in region_buffers(receiver).items()}
    sids, dids = list(range(ns))[::-1], list(range(2, nd + 2))
    scatter_fields(record_fill(model, src, "q", tokens=seq, heads=range(3, 4)), sender, sids)
    made = plan_descriptors(
        plan,
        edge,
        RegisteredCache.of(sender),
        sids,
        RegisteredCache.of(receiver),
        dids,
        range(1, seq),
    )
    execute_descriptors(made.descriptors, region_buffers(sender), region_buffers(receiver))
    got = {k: v[:, 1:, 1:2] for k, v in gather_fields(receiver, dids, seq).items()}
    verdict = verify_fields(got, model, dst, "q", tokens=range(1, seq), heads=range(3, 4))
    assert verdict.ok, verdict.message
    written = sum(int((before[k] != v).sum()) for k, v in region_buffers(receiver).items())
    assert written <= made.share_bytes  # nothing outside the share changed
    untouched = gather_fields(receiver, dids, seq)
    assert all(bool((v[:, :, 0].view(torch.uint8) == 0xA5).all()) for v in untouched.values())


def test_a_layout_file_that_splits_slots_or_plants_planes_wrongly_is_refused() -> None:
    """LAYOUT-5/8: planes name every record field once; a split needs its unit; side
    fields belong with a tuple."""
    data = json.loads(
        (
            __import__("importlib.resources").resources.files("kvspec.memory")
            / "layouts/presets/vllm_nvfp4_hnd.json"
        ).read_text()
    )
    data["name"] = "mine"
    del data["planes"][3]["unit"]
    with pytest.raises(LayoutFileError, match=r"planes\[3\]\.unit' is missing"):
        layout_from_json(json.dumps(data), "mine.json", known=PRESETS)
    data["planes"][3]["unit"] = 4
    data["planes"] = data["planes"][:3]
    with pytest.raises(LayoutFileError, match=r"each field of the record"):
        layout_from_json(json.dumps(data), "mine.json", known=PRESETS)
    mx = json.loads(
        (
            __import__("importlib.resources").resources.files("kvspec.memory")
            / "layouts/presets/sglang_mxfp8.json"
        ).read_text()
    )
    mx["name"], mx["tuple_form"], mx["axes"] = "mine", False, ["kv", "tokens", "heads", "dim"]
    with pytest.raises(LayoutFileError, match=r"side"):
        layout_from_json(json.dumps(mx), "mine.json", known=PRESETS)
