"""LAYOUT-1..4: named layouts, reads as views, conversion of every pair, unambiguous detection."""

import itertools

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.memory.cache_layout import (
    LAYOUTS,
    CacheShape,
    LayerCache,
    cache_shape,
    convert,
    detect_layout,
    empty_cache,
    kv_views,
)
from kvspec.tensors.dtypes import DTYPES, raw_bits
from kvspec.testing.strategies import cache_shapes
from tests.strategies import random_bits, same_cache

MHA = ("flash_attn", "flash_attn_hnd", "flashinfer", "flashinfer_hnd", "kv_tuple", "token_major")
MLA = ("mla", "token_major")
PAIRS = [(a, b, 2) for a, b in itertools.product(MHA, MHA)] + [
    (a, b, 1) for a, b in itertools.product(MLA, MLA)
]


def build(layout: str, tensors: tuple[torch.Tensor, ...]) -> LayerCache:
    """LAYOUT-1 restated independently: the layout of K, V (or the latent) [blocks, slots, h, d]."""
    if layout in ("flash_attn", "flashinfer"):
        return torch.stack(tensors, dim=0 if layout == "flash_attn" else 1)
    if layout in ("flash_attn_hnd", "flashinfer_hnd"):
        return torch.stack([t.transpose(1, 2) for t in tensors], dim=0 if "attn" in layout else 1)
    if layout == "kv_tuple":
        return tuple(tensors)
    if layout == "mla":
        return tensors[0][:, :, 0, :]
    assert layout == "token_major"
    return tuple(t.reshape(-1, t.shape[2], t.shape[3]) for t in tensors)


def canonical(shape: CacheShape, dtype: str, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    dims = (shape.num_blocks, shape.block_size, shape.heads, shape.head_dim)
    return tuple(random_bits(dims, dtype, seed + k).to(device) for k in range(shape.kv))


def storages(cache: LayerCache) -> set[int]:
    tensors = (cache,) if isinstance(cache, torch.Tensor) else cache
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


@st.composite
def conversions(draw: st.DrawFn, *, kv: int, source: str) -> tuple[CacheShape, int]:
    """A cache shape readable as ``source`` and a target block size dividing its slots."""
    shape = draw(cache_shapes(kv=kv))
    if source == "token_major":
        shape = CacheShape(shape.kv, shape.slots, 1, shape.heads, shape.head_dim)
    divisors = [b for b in range(1, shape.slots + 1) if shape.slots % b == 0] or [1]
    return shape, draw(st.sampled_from(divisors))


@given(
    pair=st.sampled_from(PAIRS),
    data=st.data(),
    dtype=st.sampled_from(tuple(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_conversion_matches_the_layouts_and_round_trips(
    device: str, pair: tuple[str, str, int], data: st.DataObject, dtype: str, seed: int
) -> None:
    """LAYOUT-3: slot s stays slot s, bit for bit, in any block size, and back again."""
    source, target, kv = pair
    shape, block_size = data.draw(conversions(kv=kv, source=source))
    if target == "token_major":
        block_size = 1
    tensors = canonical(shape, dtype, seed, device)
    cache = build(source, tensors)
    out = convert(cache, source, target, block_size=block_size)
    reblocked = tuple(t.reshape(-1, block_size, shape.heads, shape.head_dim) for t in tensors)
    assert same_cache(out, build(target, reblocked))
    assert not storages(out) & storages(cache), "a conversion shares no storage with its input"
    back = convert(out, target, source, block_size=shape.block_size)
    assert same_cache(back, cache)


def test_every_pair_in_every_dtype(device: str) -> None:
    """LAYOUT-3 on one small shape: the full grid of layout pairs x dtypes, NaN bits included."""
    for (source, target, kv), dtype in itertools.product(PAIRS, DTYPES):
        blocks, block = (4, 1) if source == "token_major" else (2, 2)
        shape = CacheShape(kv, blocks, block, 3 if kv == 2 else 1, 2)
        tensors = canonical(shape, dtype, 7, device)
        block_size = 1 if target == "token_major" else 4
        out = convert(build(source, tensors), source, target, block_size=block_size)
        reblocked = tuple(t.reshape(-1, block_size, shape.heads, shape.head_dim) for t in tensors)
        assert same_cache(out, build(target, reblocked)), (source, target, dtype)


@given(
    layout=st.sampled_from(list(LAYOUTS)),
    shape=cache_shapes(min_blocks=1),
    dtype=st.sampled_from(tuple(DTYPES)),
)
def test_reading_is_a_view(device: str, layout: str, shape: CacheShape, dtype: str) -> None:
    """LAYOUT-2: K and V are views of the cache's own storage; writing them writes the cache."""
    holds = LAYOUTS[layout].kv_tensors or shape.kv
    pool = shape.block_size if LAYOUTS[layout].merged_tokens else None  # not in the shape
    shape = CacheShape(
        holds,
        shape.slots if layout == "token_major" else shape.num_blocks,
        1 if layout == "token_major" else shape.block_size,
        1 if holds == 1 else shape.heads,
        shape.head_dim,
    )
    cache = empty_cache(layout, shape, dtype, device)
    views = kv_views(cache, layout, block_size=pool)
    assert len(views) == shape.kv
    for k, view in enumerate(views):
        assert view.shape == (shape.num_blocks, shape.block_size, shape.heads, shape.head_dim)
        assert view.untyped_storage().data_ptr() in storages(cache)
        view.view(raw_bits(view).dtype)[-1, -1, -1, -1] = k + 1  # a bit pattern, not a value
    for k, view in enumerate(kv_views(cache, layout, block_size=pool)):
        assert raw_bits(view)[-1, -1, -1, -1].item() == k + 1
    assert cache_shape(cache, layout, block_size=pool) == shape


@given(
    layout=st.sampled_from(list(LAYOUTS)),
    shape=cache_shapes(min_blocks=1),
    state=st.sampled_from(("heads", "all", "nothing")),
)
@example(layout="flash_attn", shape=CacheShape(2, 2, 16, 4, 8), state="all")
@example(layout="flashinfer_hnd", shape=CacheShape(2, 5, 2, 2, 8), state="all")
def test_detection_is_right_or_refuses_listing_the_truth(
    layout: str, shape: CacheShape, state: str
) -> None:
    """LAYOUT-4: detection never names a wrong layout; a refusal lists the true one."""
    kv = LAYOUTS[layout].kv_tensors or shape.kv
    heads = 1 if kv == 1 else shape.heads
    if layout == "token_major":
        shape = CacheShape(kv, shape.slots, 1, heads, shape.head_dim)
    shape = CacheShape(kv, shape.num_blocks, shape.block_size, heads, shape.head_dim)
    cache = empty_cache(layout, shape, "float16", "meta")
    known = {
        "heads": {"heads": shape.heads, "head_dim": shape.head_dim},
        "all": {"heads": shape.heads, "head_dim": shape.head_dim, "block_size": shape.block_size},
        "nothing": {},
    }[state]
    try:
        assert detect_layout(cache, **known) == layout
    except ValueError as refused:
        assert "is ambiguous" in str(refused) and repr(layout) in str(refused)


def test_ambiguous_shapes_are_refused_by_name() -> None:
    """LAYOUT-4: the known traps — 2 blocks, heads == block_size — and unambiguous neighbours."""
    two_blocks = torch.empty(2, 2, 16, 4, 8, device="meta")
    with pytest.raises(
        ValueError, match=r"fits 2 layouts: flash_attn .* flashinfer .*\[LAYOUT-4\]"
    ):
        detect_layout(two_blocks, heads=4, head_dim=8, block_size=16)
    assert detect_layout(torch.empty(2, 3, 16, 4, 8, device="meta"), heads=4, head_dim=8) == (
        "flash_attn"
    )
    square = torch.empty(5, 2, 4, 4, 8, device="meta")
    with pytest.raises(ValueError, match=r"'flashinfer', 'flashinfer_hnd'"):
        detect_layout(square, heads=4, head_dim=8, block_size=4)
    assert detect_layout(torch.empty(5, 2, 4, 16, 8, device="meta"), heads=4) == "flashinfer_hnd"
    with pytest.raises(ValueError, match=r"fits no cache layout"):
        detect_layout(torch.empty(3, 3, 16, 4, 8, device="meta"), heads=4, head_dim=8)
    latent = torch.empty(7, 16, 576, device="meta")
    assert detect_layout(latent, heads=1, head_dim=576) == "mla"
    request = torch.empty(9, 16, 128, device="meta")
    # A (K, V) pair of [rows, heads, head_dim] is also an SGLang token pool, whose page size
    # is not in the shape: only a stated page size that does not divide the rows rules it out.
    with pytest.raises(ValueError, match=r"'token_major', 'sglang_mha'"):
        detect_layout((request, request), heads=16, head_dim=128)
    assert detect_layout((request, request), heads=16, head_dim=128, block_size=16) == (
        "token_major"
    )


def test_a_named_layout_must_fit() -> None:
    """LAYOUT-1: the K/V axis, the container and stated facts are checked, with the shape."""
    with pytest.raises(
        ValueError, match=r"K/V axis of size 2 at dim 1; got tensor of shape \[3, 3"
    ):
        cache_shape(torch.empty(3, 3, 4, 2, 8), "flashinfer")
    with pytest.raises(ValueError, match=r"is one tensor; got tuple of 2"):
        cache_shape((torch.empty(3, 4, 2, 8),) * 2, "flash_attn")
    with pytest.raises(ValueError, match=r"heads 2 != stated 4"):
        cache_shape(torch.empty(2, 3, 4, 2, 8), "flash_attn", heads=4)
    with pytest.raises(ValueError, match=r"unknown cache layout 'vllm'"):
        kv_views(torch.empty(2, 3, 4, 2, 8), "vllm")
