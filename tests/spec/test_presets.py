"""LAYOUT-5, LAYOUT-6: the presets engines run now, restated independently from the engines'
own shape code, their bytes, conversion between every pair that holds the same information,
and the refusals."""

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvspec.memory.cache_layout import (
    LAYOUTS,
    PRESETS,
    CacheShape,
    cache_shape,
    convert,
    detect_layout,
    empty_cache,
    field_views,
    get_layout,
    kv_views,
    layer_views,
)
from kvspec.memory.paged import empty_paged_cache
from kvspec.tensors.dtypes import bit_equal, raw_bits


def rand(shape, dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15 - 1, shape, generator=g, dtype=torch.int16)
    return bits.view(dtype) if dtype.itemsize == 2 else bits.view(torch.uint8)[..., : shape[-1]]


def kv(blocks=3, slots=4, heads=2, dim=3, seed=0):
    """K and V as [blocks, slots, heads, dim]."""
    return rand((blocks, slots, heads, dim), seed=seed), rand(
        (blocks, slots, heads, dim), seed=seed + 1
    )


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bit_equal(a.contiguous(), b.contiguous())


def test_vllm_packed_keeps_k_then_v_in_the_last_axis() -> None:
    """vLLM 0.33 flash_attn.py: [num_blocks, heads, block_size, 2*head_size], split(head_size)."""
    k, v = kv()
    hnd = torch.cat([k.transpose(1, 2), v.transpose(1, 2)], dim=-1)  # [B, H, N, 2D]
    nhd = torch.cat([k, v], dim=-1)  # stride order LBNHC: [B, N, H, 2D] in memory
    for cache, name in ((hnd, "vllm_packed_hnd"), (nhd, "vllm_packed_nhd")):
        got_k, got_v = kv_views(cache, name)
        assert same(got_k, k) and same(got_v, v), name
    assert get_layout("vllm_packed_nhd").stride_order == (0, 2, 1, 3)
    assert get_layout("vllm_packed_hnd").stride_order == (0, 1, 2, 3)


def test_cross_layer_tensors_are_read_layer_by_layer() -> None:
    """BLHNC / BLNHC keep blocks outermost; TensorRT-LLM's pool is [blocks, layers, 2, H, N, D]."""
    layers = [kv(seed=10 * i) for i in range(3)]
    blhnc = torch.stack(
        [torch.cat([k.transpose(1, 2), v.transpose(1, 2)], -1) for k, v in layers], 1
    )
    blnhc = torch.stack([torch.cat([k, v], -1) for k, v in layers], 1)
    trt = torch.stack(
        [torch.stack([k.transpose(1, 2), v.transpose(1, 2)], 1) for k, v in layers], 1
    )
    for cache, name in (
        (blhnc, "vllm_packed_hnd_layers"),
        (blnhc, "vllm_packed_nhd_layers"),
        (trt, "trtllm_pool"),
    ):
        got_k, got_v = kv_views(cache, name)
        assert got_k.shape == (3, 3, 4, 2, 3)
        for i, (k, v) in enumerate(layers):
            assert same(got_k[i], k) and same(got_v[i], v), (name, i)
            layer = layer_views(cache, name)[i]
            assert layer.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
            assert same(kv_views(layer, get_layout(name).per_layer)[0], k)
        assert cache_shape(cache, name).layers == 3


def test_lhbnc_keeps_heads_outside_blocks_in_a_layer() -> None:
    """vLLM 0.33 KVCacheLayout.LHBNC = (0, 2, 1, 3, 4): each layer is [H, B, N, 2D] in
    memory (layer_view_order (1, 0, 2, 3) of the per-layer [B, H, N, C] view)."""
    k, v = kv()  # [B, N, H, D]
    logical = torch.cat([k.transpose(1, 2), v.transpose(1, 2)], dim=-1)  # [B, H, N, 2D]
    lhbnc = logical.permute(1, 0, 2, 3).contiguous()  # [H, B, N, 2D]
    got_k, got_v = kv_views(lhbnc, "vllm_packed_lhbnc")
    assert same(got_k, k) and same(got_v, v)
    assert get_layout("vllm_packed_lhbnc").stride_order == (1, 0, 2, 3)
    # with as many heads as blocks it reads as vllm_packed_hnd too: only the name tells
    square = logical[:2].permute(1, 0, 2, 3).contiguous()  # 2 blocks, 2 heads
    with pytest.raises(ValueError, match=r"ambiguous.*vllm_packed_hnd.*vllm_packed_lhbnc"):
        detect_layout(square, heads=2, head_dim=3)


def test_bhlnc_and_sglang_page_head_are_read_layer_by_layer() -> None:
    """vLLM 0.33 KVCacheLayout.BHLNC = (1, 2, 0, 3, 4): physical [B, H, L, N, 2D] of the
    logical [L, B, H, N, C]; SGLang 0.5.23's HiCache host pool under page_head is one
    tensor (2, page_num, head_num, page_size, layer_num, head_dim), K at 0 and V at 1."""
    layers = [kv(seed=10 * i) for i in range(3)]  # each K, V [B, N, H, D]
    # [L, B, H, N, 2D] (logical) permuted by BHLNC into memory: [B, H, L, N, 2D]
    logical = torch.stack(
        [torch.cat([k.transpose(1, 2), v.transpose(1, 2)], -1) for k, v in layers], 0
    )
    bhlnc = logical.permute(1, 2, 0, 3, 4).contiguous()
    # [2, L, B, H, N, D] -> page_head's (2, pages, heads, page_size, layers, head_dim)
    stacked = torch.stack(
        [torch.stack([k.transpose(1, 2), v.transpose(1, 2)], 0) for k, v in layers], 1
    )
    page_head = stacked.permute(0, 2, 3, 4, 1, 5).contiguous()
    assert get_layout("vllm_packed_bhlnc").stride_order == (1, 2, 0, 3, 4)
    for cache, name in ((bhlnc, "vllm_packed_bhlnc"), (page_head, "sglang_host_page_head")):
        got_k, got_v = kv_views(cache, name)
        assert cache_shape(cache, name).layers == 3
        for i, (k, v) in enumerate(layers):
            assert same(got_k[i], k) and same(got_v[i], v), (name, i)
            layer = layer_views(cache, name)[i]
            assert layer.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
            assert same(kv_views(layer, get_layout(name).per_layer)[1], v)


def _sglang_host_buffers(layers, pages: int, page_size: int) -> dict[str, torch.Tensor]:
    """The one tensor SGLang 0.5.23 allocates for each host layout and the unified pool,
    built from ``layers`` (each K, V [pages, page_size, heads, dim]) as its source states
    its dims (pool_host/mha.py init_kv_buffer, pool_host/page_unified.py page_dims,
    layout/token_major.py's entry ``[K_0 | V_0 | K_1 | V_1 | ...]``)."""
    # [2, L, pages, page_size, H, D]: K and V of every layer, pages and slots apart
    kvl = torch.stack([torch.stack([k, v], 0) for k, v in layers], 1)
    heads, dim = kvl.shape[-2:]
    size = pages * page_size
    rows = kvl.reshape(2, len(layers), size, heads, dim)  # row = page * page_size + slot
    return {
        # (2, layer_num, size, head_num, head_dim)
        "sglang_host_layer_first": rows.contiguous(),
        # (2, size, layer_num, head_num, head_dim)
        "sglang_host_page_first": rows.permute(0, 2, 1, 3, 4).contiguous(),
        # (2, page_num, layer_num, page_size, head_num, head_dim)
        "sglang_host_pf_direct": kvl.permute(0, 2, 1, 3, 4, 5).contiguous(),
        # (page_num, head_group_num=1, layer_num, 2, page_size, heads, dim), squeezed
        "sglang_host_unified": kvl.permute(2, 1, 0, 3, 4, 5).unsqueeze(1).contiguous().squeeze(1),
        # one entry per token slot: every layer's K row then V row
        "sglang_page_major": rows.permute(2, 1, 0, 3, 4).contiguous(),
    }


def test_sglang_host_pools_and_the_page_major_pool_are_read_layer_by_layer() -> None:
    """SGLang 0.5.23: the HiCache host pool under layer_first, page_first, page_first_direct
    and page_unified (one head group), and the unified pool's page-major entries; layer i
    of each reads as its per-layer preset, a tuple (K, V) of views where that is
    sglang_mha (the host pool's k_buffer[i] / k_buffer.transpose(0, 1)[i])."""
    pages, page_size = 3, 2
    layers = [kv(blocks=pages, slots=page_size, seed=10 * i) for i in range(3)]
    entry = 3 * 2 * 2 * 3 * 2  # page_major: layers * (K row + V row) bytes, bfloat16
    for name, cache in _sglang_host_buffers(layers, pages, page_size).items():
        spec = get_layout(name)
        page = page_size if spec.merged_tokens else None
        got_k, got_v = kv_views(cache, name, block_size=page)
        assert cache_shape(cache, name, block_size=page).layers == 3, name
        per_layer = layer_views(cache, name, block_size=page)
        for i, (k, v) in enumerate(layers):
            assert same(got_k[i], k) and same(got_v[i], v), (name, i)
            layer = per_layer[i]
            tensors = layer if isinstance(layer, tuple) else (layer,)
            assert isinstance(layer, tuple) == get_layout(spec.per_layer).tuple_form, name
            assert all(t.untyped_storage().data_ptr() == cache.data_ptr() for t in tensors)
            assert same(kv_views(layer, spec.per_layer, block_size=page)[1], v), (name, i)
        if name == "sglang_page_major":  # slot t's entry is bytes [t * entry, (t+1) * entry)
            raw = cache.view(torch.uint8).reshape(-1)
            k1 = layers[1][0][2, 1]  # layer 1, page 2, slot 1: token row 5
            at = 5 * entry + 1 * (2 * 2 * 3 * 2)
            assert torch.equal(raw[at : at + 12], k1.contiguous().view(torch.uint8).reshape(-1))


def test_sglang_pools_keep_row_page_times_page_size_plus_slot() -> None:
    """SGLang 0.5.23 memory_pool.py: K and V [size + page_size, heads, head_dim] per layer."""
    k, v = kv(blocks=4, slots=2)
    pool = (k.reshape(8, 2, 3), v.reshape(8, 2, 3))
    got = kv_views(pool, "sglang_mha", block_size=2)
    assert same(got[0], k) and same(got[1], v)
    hnd = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    assert same(kv_views(hnd, "sglang_mha_hnd")[1], v)
    latent = rand((6, 1, 5))
    assert same(kv_views(latent, "sglang_mla", block_size=3)[0], latent.reshape(2, 3, 1, 5))
    with pytest.raises(ValueError, match=r"page size is not in the shape.*\[LAYOUT-5\]"):
        kv_views(pool, "sglang_mha")
    with pytest.raises(ValueError, match=r"3 does not divide 8 \[LAYOUT-5\]"):
        kv_views(pool, "sglang_mha", block_size=3)


def test_per_token_head_records_carry_a_scale_after_each_half() -> None:
    """vLLM 0.33 triton_attn.py: [K(hs) | K_scale(f32) | V(hs) | V_scale(f32)] per head slot."""
    blocks, heads, slots, dim = 2, 3, 2, 4
    g = torch.Generator().manual_seed(1)
    k8 = torch.randint(0, 256, (blocks, heads, slots, dim), generator=g, dtype=torch.uint8)
    v8 = torch.randint(0, 256, (blocks, heads, slots, dim), generator=g, dtype=torch.uint8)
    ks = torch.rand(blocks, heads, slots, 1, generator=g)
    vs = torch.rand(blocks, heads, slots, 1, generator=g)
    record = torch.cat([k8, ks.view(torch.uint8), v8, vs.view(torch.uint8)], dim=-1)
    cache = record.view(torch.float8_e4m3fn)  # [B, H, N, 2*(D+4)]
    fields = field_views(cache, "vllm_pth_hnd")
    assert fields["k_scale"].dtype == torch.float32
    assert same(fields["k_scale"], ks.transpose(1, 2))
    assert same(fields["v_scale"], vs.transpose(1, 2))
    assert same(raw_bits(fields["k"]), k8.transpose(1, 2))
    assert same(raw_bits(fields["v"]), v8.transpose(1, 2))
    nhd = convert(cache, "vllm_pth_hnd", "vllm_pth_nhd")
    assert nhd.shape == (blocks, slots, heads, 2 * (dim + 4))
    assert same(field_views(nhd, "vllm_pth_nhd")["v_scale"], vs.transpose(1, 2))
    with pytest.raises(ValueError, match=r"do not carry the same information.*\[LAYOUT-6\]"):
        convert(cache, "vllm_pth_hnd", "vllm_packed_hnd")
    odd = torch.zeros(blocks, heads, slots, 2 * (3 + 4), dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"k_scale \(float32\) at byte 3.*\[LAYOUT-6\]"):
        field_views(odd, "vllm_pth_hnd")


def test_flashmla_fp8_record_is_656_bytes() -> None:
    """vLLM 0.33 flashmla_sparse.py: 512 fp8 NoPE | 4 float32 scales | 64 bfloat16 RoPE."""
    g = torch.Generator().manual_seed(2)
    nope = torch.randint(0, 256, (2, 1, 3, 512), generator=g, dtype=torch.uint8)
    scales = torch.rand(2, 1, 3, 4, generator=g)
    rope = torch.rand(2, 1, 3, 64, generator=g).to(torch.bfloat16)
    cache = torch.cat([nope, scales.view(torch.uint8), rope.view(torch.uint8)], dim=-1)
    assert cache.shape[-1] == 656
    fields = field_views(cache, "flashmla_fp8")
    assert same(fields["nope_scale"], scales.transpose(1, 2))
    assert same(fields["rope"], rope.transpose(1, 2))
    assert fields["nope"].dtype == torch.float8_e4m3fn
    assert cache_shape(cache, "flashmla_fp8").head_dim == 576
    with pytest.raises(ValueError, match=r"K and V or one latent"):
        kv_views(cache, "flashmla_fp8")


def test_every_engine_preset_cites_its_source() -> None:
    """LAYOUT-5: a preset names the engine file and release; what was not confirmed is said."""
    own = {"kv_tuple", "token_major"}
    for name, layout in PRESETS.items():
        if name in own:
            assert layout.source is None
            continue
        assert layout.source is not None, name
        assert layout.source.project and layout.source.file and layout.source.version, name
        assert any(c.isdigit() for c in layout.source.version), name
    assert set(LAYOUTS) < set(PRESETS)


def _fill(cache) -> None:
    tensors = cache if isinstance(cache, tuple) else (cache,)
    for i, t in enumerate(tensors):
        raw = t.view(torch.uint8)
        g = torch.Generator().manual_seed(i)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))


def _shape_for(name: str, blocks: int, block_size: int, layers: int) -> tuple[CacheShape, str]:
    spec = get_layout(name)
    kv_count = spec.kv_tensors or 2
    head_dim = spec.fixed_head_dim or spec.head_dim_multiple or 4
    heads = 1 if kv_count == 1 else 2
    dtype = spec.dtypes[0] if spec.dtypes else "float8_e4m3fn"
    units = [p.unit for p in (*spec.planes, *(s.plane for s in spec.side)) if p.unit]
    block_size = spec.fixed_block_size or max([block_size, *units])  # LAYOUT-8: whole units
    if not spec.paged:
        blocks, block_size = blocks * block_size, 1
    return CacheShape(
        kv_count, blocks, block_size, heads, head_dim, layers if spec.cross_layer else 1
    ), dtype


PAIRS = [
    (a, b)
    for a, b in itertools.product(PRESETS, PRESETS)
    if get_layout(a).cross_layer == get_layout(b).cross_layer
]


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=lambda p: p)
def test_every_pair_converts_bit_for_bit_or_is_refused(source: str, target: str) -> None:
    """LAYOUT-3, LAYOUT-6: same information converts and round-trips; other is refused."""
    shape, dtype = _shape_for(source, 2, 2, 2)
    src, dst = get_layout(source), get_layout(target)
    if get_layout(source).kv_tensors is None and dst.kv_tensors == 1:
        shape = CacheShape(1, shape.num_blocks, 1, 1, shape.head_dim)
    cache = empty_cache(source, shape, dtype)
    _fill(cache)
    page = shape.block_size if src.merged_tokens else None
    same_info = src.information(dtype, shape.head_dim, shape.kv) == dst.information(
        dtype, shape.head_dim, shape.kv
    ) and (dst.kv_tensors in (None, shape.kv))
    block = dst.fixed_block_size or (1 if not dst.paged else 4)
    if not same_info:
        with pytest.raises(ValueError, match=r"\[LAYOUT-[36]\]"):
            convert(cache, source, target, block_size=block, source_block_size=page)
        return
    out = convert(cache, source, target, block_size=block, source_block_size=page)
    back = convert(
        out,
        target,
        source,
        block_size=shape.block_size,
        source_block_size=block if dst.merged_tokens else None,
    )
    have = field_views(back, source, block_size=page)
    for name, want in field_views(cache, source, block_size=page).items():
        assert same(raw_bits(have[name]), raw_bits(want)), (source, target, name)


@given(
    layout=st.sampled_from([n for n, spec in PRESETS.items() if spec.cross_layer and spec.plain]),
    layers=st.integers(1, 3),
    blocks=st.integers(1, 4),
)
def test_a_paged_cache_over_one_cross_layer_tensor(layout: str, layers: int, blocks: int) -> None:
    """LAYOUT-5.2: each layer of the paged cache is a view of the one tensor."""
    cache = empty_paged_cache(
        layout,
        num_layers=layers,
        num_blocks=blocks,
        block_size=2,
        heads=2,
        head_dim=3,
        dtype="bfloat16",
    )
    assert cache.base is not None and cache.num_layers == layers
    for i, layer in enumerate(cache.layers):
        k = cache.views(layer)[0]
        k.view(torch.int16).fill_(i + 1)
        page = 2 if get_layout(layout).merged_tokens else None  # a token pool's page size
        assert same(kv_views(cache.base, layout, block_size=page)[0][i], k)


def test_vllms_six_stride_orders_are_six_presets() -> None:
    """vLLM 0.33.0 vllm/v1/kv_cache_layout.py: KVCacheLayout's six members are stride
    permutations of the logical [L, B, H, N, C]; each is a preset, per layer where L is
    outermost (is_layer_compact), one cross-layer tensor where it is not."""
    members = {  # member: its value, as the source states it
        "LBHNC": (0, 1, 2, 3, 4),
        "LBNHC": (0, 1, 3, 2, 4),
        "LHBNC": (0, 2, 1, 3, 4),
        "BLHNC": (1, 0, 2, 3, 4),
        "BLNHC": (1, 0, 3, 2, 4),
        "BHLNC": (1, 2, 0, 3, 4),
    }
    presets = {
        "LBHNC": "vllm_packed_hnd",
        "LBNHC": "vllm_packed_nhd",
        "LHBNC": "vllm_packed_lhbnc",
        "BLHNC": "vllm_packed_hnd_layers",
        "BLNHC": "vllm_packed_nhd_layers",
        "BHLNC": "vllm_packed_bhlnc",
    }
    letter = {"layers": "L", "blocks": "B", "heads": "H", "slots": "N", "dim": "C"}
    for member, order in members.items():
        spec = get_layout(presets[member])
        physical = "".join(letter[a] for a in spec.axes)
        if not spec.cross_layer:
            physical = "L" + physical  # a per-layer tensor: the layers are its list
        assert physical == "".join("LBHNC"[i] for i in order) == member, member
        assert [f.name for f in spec.record] == ["k", "v"] and spec.plain, member
        assert spec.cross_layer == (order[0] != 0), member
