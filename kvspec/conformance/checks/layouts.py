"""Checks of reading, converting and detecting cache layouts [LAYOUT-1..4].

Caches are filled with random bits, so a misread element is told apart from the
right one; comparisons are bit-exact [DTYPE-2].
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvspec.cache_layout import (
    LAYOUTS,
    CacheShape,
    convert,
    detect_layout,
    empty_cache,
    get_layout,
    kv_views,
)
from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, fail
from kvspec.dtypes import DTYPES, bits_view
from kvspec.strategies import cache_shapes


def _random_cache(example: Example, device: str):
    """The example's cache, every element random bits (seeded)."""
    shape = CacheShape(**example["shape"])
    cache = empty_cache(example["layout"], shape, example["dtype"], device)
    generator = torch.Generator().manual_seed(example["seed"])
    for view in kv_views(cache, example["layout"]):
        bits = bits_view(view)
        info = torch.iinfo(bits.dtype)
        bits.copy_(
            torch.randint(info.min, info.max, bits.shape, generator=generator, dtype=bits.dtype)
        )
    return cache


@st.composite
def _cache_examples(draw: st.DrawFn, *, min_blocks: int = 0) -> Example:
    layout = draw(st.sampled_from(list(LAYOUTS)))
    spec = get_layout(layout)
    kv = spec.kv_tensors or draw(st.sampled_from([1, 2]))
    shape = draw(cache_shapes(kv=kv, min_blocks=min_blocks))
    if not spec.paged:
        shape = CacheShape(kv, shape.num_blocks, 1, shape.heads, shape.head_dim)
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": draw(st.sampled_from(list(DTYPES))),
        "seed": draw(st.integers(0, 2**16)),
    }


def _shape_dict(shape: CacheShape) -> dict[str, int]:
    return {
        "kv": shape.kv,
        "num_blocks": shape.num_blocks,
        "block_size": shape.block_size,
        "heads": shape.heads,
        "head_dim": shape.head_dim,
    }


def _examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    return _cache_examples()


def _describe(example: Example) -> str:
    s = example["shape"]
    return (
        f"a {example['layout']} {example['dtype']} cache of {s['num_blocks']} blocks x "
        f"{s['block_size']} slots, {s['heads']} heads x {s['head_dim']}, kv={s['kv']}"
    )


def _pin(layout: str, kv: int, blocks: int, block_size: int, heads: int, dim: int) -> Example:
    shape = CacheShape(kv, blocks, block_size, heads, dim)
    return {"layout": layout, "shape": _shape_dict(shape), "dtype": "bfloat16", "seed": 0}


LAYOUT_PINS = (
    _pin("flash_attn", 2, 2, 4, 2, 3),  # exactly 2 blocks: reads like flashinfer by shape
    _pin("flashinfer", 2, 2, 4, 2, 3),
    _pin("flash_attn_hnd", 2, 3, 2, 2, 3),  # heads == block_size: NHD and HND look alike
    _pin("mla", 1, 3, 2, 1, 4),
)


@check(
    "LAYOUT-1",
    "read-named",
    "each named layout reads K and V from the right axes",
    needs=("layouts",),
    strategy=_examples,
    examples=LAYOUT_PINS,
)
def read_named(ctx: Context, example: Example) -> None:
    cache = _random_cache(example, ctx.device)
    expected = kv_views(cache, example["layout"])
    got = ctx.adapter.read_layer(cache, example["layout"])
    expect(
        len(got) == len(expected),
        f"{_describe(example)}: read {len(got)} tensors, expected {len(expected)} [LAYOUT-1]",
    )
    for name, want, have in zip(("K", "V"), expected, got, strict=False):
        expect(
            tuple(have.shape) == tuple(want.shape)
            and torch.equal(bits_view(have.contiguous()), bits_view(want.contiguous())),
            f"{_describe(example)}: {name if len(expected) == 2 else 'latent'} read as "
            f"{list(have.shape)} differs from [num_blocks, block_size, heads, head_dim] = "
            f"{list(want.shape)} of the named layout [LAYOUT-1]",
        )


@check(
    "LAYOUT-2",
    "views-alias",
    "reading a cache copies nothing",
    needs=("layouts",),
    strategy=_examples,
    examples=LAYOUT_PINS,
)
def views_alias(ctx: Context, example: Example) -> None:
    cache = _random_cache(example, ctx.device)
    tensors = cache if isinstance(cache, tuple) else (cache,)
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    for view in ctx.adapter.read_layer(cache, example["layout"]):
        if view.numel() == 0:
            continue
        expect(
            view.untyped_storage().data_ptr() in storages,
            f"{_describe(example)}: reading it returned a copy, not a view of the cache's "
            "storage [LAYOUT-2]",
        )


@st.composite
def _conversions(draw: st.DrawFn) -> Example:
    example = draw(_cache_examples())
    kv = example["shape"]["kv"]
    candidates = [name for name, spec in LAYOUTS.items() if spec.kv_tensors in (None, kv)]
    return {**example, "target": draw(st.sampled_from(candidates))}


@check(
    "LAYOUT-3",
    "convert",
    "conversion moves every slot bit for bit into a new cache",
    needs=("conversion",),
    strategy=lambda adapter: _conversions(),
    examples=tuple({**p, "target": "flashinfer_hnd"} for p in LAYOUT_PINS[:3]),
)
def converts(ctx: Context, example: Example) -> None:
    cache = _random_cache(example, ctx.device)
    source, target = example["layout"], example["target"]
    try:
        expected = convert(cache, source, target)
    except ValueError:
        try:
            ctx.adapter.convert_layout(cache, source, target)
        except Exception:
            return
        fail(f"{_describe(example)}: converting it to {target} was accepted [LAYOUT-3]")
    got = ctx.adapter.convert_layout(cache, source, target)
    for want, have in zip(kv_views(expected, target), kv_views(got, target), strict=True):
        expect(
            torch.equal(bits_view(have.contiguous()), bits_view(want.contiguous())),
            f"{_describe(example)} converted to {target} misplaces slots [LAYOUT-3]",
        )
    inputs = {
        t.untyped_storage().data_ptr() for t in (cache if isinstance(cache, tuple) else (cache,))
    }
    outputs = {t.untyped_storage().data_ptr() for t in (got if isinstance(got, tuple) else (got,))}
    expect(
        not inputs & outputs or not any(t.numel() for t in kv_views(got, target)),
        f"{_describe(example)} converted to {target} shares storage with the input [LAYOUT-3]",
    )


@st.composite
def _detections(draw: st.DrawFn) -> Example:
    example = draw(_cache_examples(min_blocks=1))
    s = example["shape"]
    known = draw(st.sets(st.sampled_from(["heads", "head_dim", "block_size"])))
    return {**example, "known": {k: s[k] for k in sorted(known)}}


@check(
    "LAYOUT-4",
    "detect-unambiguous",
    "detection answers only when one layout fits, and then correctly",
    needs=("detection",),
    strategy=lambda adapter: _detections(),
    examples=tuple(
        {**p, "known": {"heads": p["shape"]["heads"], "head_dim": p["shape"]["head_dim"]}}
        for p in LAYOUT_PINS
    ),
)
def detect_unambiguous(ctx: Context, example: Example) -> None:
    cache = _random_cache(example, ctx.device)
    shape = list(cache.shape) if isinstance(cache, torch.Tensor) else [list(t.shape) for t in cache]
    known = example["known"]
    try:
        expected = detect_layout(cache, **known)
    except ValueError as why:
        try:
            answer = ctx.adapter.detect_layout(cache, **known)
        except Exception:
            return
        fail(
            f"a cache of shape {shape} (knowing {known or 'nothing'}) is ambiguous, yet "
            f"detection answered {answer!r}; it must refuse and ask for the layout by name "
            f"[LAYOUT-4]. The spec's refusal: {why}"
        )
    try:
        answer = ctx.adapter.detect_layout(cache, **known)
    except Exception as error:
        fail(
            f"a cache of shape {shape} (knowing {known}) is {expected}; detection raised {error!r}"
        )
    expect(
        answer == expected,
        f"a cache of shape {shape} (knowing {known or 'nothing'}) is {expected}; detection "
        f"said {answer!r} [LAYOUT-4]",
    )
