"""Checks of the layouts engines run now: re-blocking, token pools, cross-layer tensors and
records with inline scales [LAYOUT-3, LAYOUT-5, LAYOUT-6].

Caches are filled with random bytes, so a misread byte is told apart from the right
one; comparisons are bit-exact [DTYPE-2]. Presets are drawn from the adapter's domain.
"""

from __future__ import annotations

from typing import cast

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.families.layouts.checks import (
    _cache_examples,
    _describe,
    _facts,
    _first_difference,
    _in_domain,
    _pool,
    _random_cache,
    _shape_dict,
    takes,
)
from kvspec.memory.cache_layout import (
    CacheShape,
    LayerCache,
    convert,
    empty_cache,
    field_views,
    kv_views,
    layer_views,
)
from kvspec.memory.layout_model import FIELD_DTYPES
from kvspec.tensors.dtypes import bits_view


def _storages(cache: LayerCache) -> set[int]:
    tensors = cache if isinstance(cache, tuple) else (cache,)
    return {t.untyped_storage().data_ptr() for t in tensors}


# re-blocking [LAYOUT-3.4] ---------------------------------------------------------------
@st.composite
def _reblocks(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A cache, a target of the same information and a target block size: one that divides
    the slots (larger or smaller than the source's), or one that does not [LAYOUT-3]."""
    example = draw(_cache_examples(adapter, min_blocks=1))
    spec = example_layout(example)
    same = [
        n
        for n in adapter.domain.plain_layouts()
        if adapter.domain.layout(n).kv_tensors in (None, example["shape"]["kv"])
        and adapter.domain.layout(n).cross_layer == spec.cross_layer
        and adapter.domain.layout(n).paged
    ]
    target = draw(st.sampled_from(same or [example["layout"]]))
    slots = example["shape"]["num_blocks"] * example["shape"]["block_size"]
    divisors = [b for b in range(1, slots + 1) if slots % b == 0]
    others = [b for b in range(2, slots + 2) if slots % b]
    block_size = draw(st.sampled_from(others if bool(others) and draw(st.booleans()) else divisors))
    return {**example, "target": target, "block_size": block_size}


@check(
    "LAYOUT-3",
    "reblock",
    "conversion to a larger or smaller block size moves every slot; one that does not divide "
    "the slots is refused",
    needs=("conversion",),
    strategy=_reblocks,
    examples=(
        {
            "layout": "flash_attn",
            "shape": _shape_dict(CacheShape(2, 3, 2, 2, 3)),
            "dtype": "bfloat16",
            "seed": 1,
            "target": "vllm_packed_hnd",
            "block_size": 4,
        },
        {
            "layout": "vllm_packed_nhd",
            "shape": _shape_dict(CacheShape(2, 2, 4, 2, 2)),
            "dtype": "float16",
            "seed": 2,
            "target": "sglang_mha_hnd",
            "block_size": 2,
        },
    ),
    covers=("LAYOUT-3.1", "LAYOUT-3.4"),
)
def reblock(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    if example["target"] not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    if not takes(ctx.adapter, "convert_layout", "block_size"):
        raise OutsideDomain
    cache = _random_cache(example, ctx.device)
    source, target, block_size = example["layout"], example["target"], example["block_size"]
    facts = _facts(ctx, "convert_layout", example)
    what = f"{_describe(example)} converted to {target} in blocks of {block_size}"
    try:
        expected = convert(
            cache, source, target, block_size=block_size, source_block_size=_pool(example)
        )
    except ValueError as why:
        expect_refused(
            "LAYOUT-3.4",
            f"{what} ({why})",
            lambda: ctx.adapter.convert_layout(
                cache, source, target, block_size=block_size, **facts
            ),
        )
        return
    got = ctx.adapter.convert_layout(cache, source, target, block_size=block_size, **facts)
    page = example_layout(example, "target").page_size(block_size)
    try:
        have_views = kv_views(got, target, block_size=page)
    except ValueError as error:
        fail(f"{what} is not a {target} cache: {error} [LAYOUT-3.1]")
    for want, have in zip(kv_views(expected, target, block_size=page), have_views, strict=True):
        if tuple(have.shape) != tuple(want.shape) or not torch.equal(
            bits_view(have.contiguous()), bits_view(want.contiguous())
        ):
            detail = (
                _first_difference(have, want)
                if have.shape == want.shape
                else f"reads {list(have.shape)}, not {list(want.shape)}"
            )
            fail(f"{what} misplaces slots: {detail} [LAYOUT-3.1]")


# token pools [LAYOUT-5.1, LAYOUT-5.3] ------------------------------------------------------
def _pools(adapter: Adapter) -> list[str]:
    return [n for n in adapter.domain.plain_layouts() if adapter.domain.layout(n).merged_tokens]


def _no_pools(adapter: Adapter) -> str | None:
    if not _pools(adapter):
        return "the adapter's domain holds no token pool"
    if not takes(adapter, "read_layer", "page_size"):
        return "the adapter's read_layer takes no page_size, so it reads no token pool"
    return None


@st.composite
def _pool_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    layout = draw(st.sampled_from(_pools(adapter)))
    kv = adapter.domain.layout(layout).tensors()
    blocks, block_size = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    heads = 1 if kv == 1 else draw(st.integers(1, 3))
    shape = CacheShape(kv, blocks, block_size, heads, draw(st.integers(1, 3)))
    rows = shape.slots
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": draw(st.sampled_from(adapter.domain.model_dtypes())),
        "seed": draw(st.integers(0, 2**16)),
        "bad_page": draw(st.sampled_from([p for p in range(2, rows + 2) if rows % p])),
    }


@check(
    "LAYOUT-5",
    "token-pool",
    "a token pool reads row block * page_size + slot; without a page size, or with one that "
    "does not divide its rows, it is refused",
    needs=("layouts",),
    strategy=_pool_examples,
    missing=_no_pools,
    examples=(
        {
            "layout": "sglang_mha",
            "shape": _shape_dict(CacheShape(2, 3, 2, 2, 2)),
            "dtype": "bfloat16",
            "seed": 3,
            "bad_page": 4,
        },
    ),
    covers=("LAYOUT-5.1", "LAYOUT-5.3"),
)
def token_pool(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    facts = _facts(ctx, "read_layer", example)
    cache = _random_cache(example, ctx.device)
    layout, page = example["layout"], example["shape"]["block_size"]
    rows = example["shape"]["num_blocks"] * page
    expected = kv_views(cache, layout, block_size=page)
    got = ctx.adapter.read_layer(cache, layout, **facts)
    for want, have in zip(expected, got, strict=True):
        if tuple(have.shape) != tuple(want.shape) or not torch.equal(
            bits_view(have.contiguous()), bits_view(want.contiguous())
        ):
            fail(
                f"{_describe(example)} ({rows} rows, pages of {page}) reads "
                f"{list(have.shape)}, not row block * {page} + slot of each block: "
                f"{_first_difference(have, want) if have.shape == want.shape else ''} "
                "[LAYOUT-5.1]"
            )
    expect_refused(
        "LAYOUT-5.3",
        f"a {layout} pool of {rows} rows read with no page size",
        lambda: ctx.adapter.read_layer(cache, layout),
    )
    bad = example["bad_page"]
    expect_refused(
        "LAYOUT-5.3",
        f"a {layout} pool of {rows} rows read in pages of {bad}, which does not divide {rows}",
        lambda: ctx.adapter.read_layer(cache, layout, page_size=bad),
        naming=(bad,),
    )


# cross-layer tensors [LAYOUT-5.2] --------------------------------------------------------
def _cross(adapter: Adapter) -> list[str]:
    return [n for n in adapter.domain.plain_layouts() if adapter.domain.layout(n).cross_layer]


@st.composite
def _cross_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    layout = draw(st.sampled_from(_cross(adapter)))
    shape = CacheShape(
        2,
        draw(st.integers(2, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        layers=draw(st.integers(2, 3)),
    )
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": draw(st.sampled_from(adapter.domain.model_dtypes())),
        "seed": draw(st.integers(0, 2**16)),
    }


@check(
    "LAYOUT-5",
    "cross-layer",
    "layer i of a cross-layer tensor is index i of its layers axis, read as its per-layer preset",
    needs=("layouts",),
    strategy=_cross_examples,
    missing=lambda adapter: None if _cross(adapter) else "the domain holds no cross-layer layout",
    examples=(
        {
            "layout": "vllm_packed_hnd_layers",
            "shape": _shape_dict(CacheShape(2, 3, 2, 2, 2, layers=2)),
            "dtype": "bfloat16",
            "seed": 4,
        },
        {
            "layout": "trtllm_pool",
            "shape": _shape_dict(CacheShape(2, 2, 3, 2, 2, layers=3)),
            "dtype": "float16",
            "seed": 5,
        },
        {  # a cross-layer token pool whose layers read as tuples (K, V): SGLang's page_major
            "layout": "sglang_page_major",
            "shape": _shape_dict(CacheShape(2, 3, 2, 2, 2, layers=2)),
            "dtype": "bfloat16",
            "seed": 6,
        },
    ),
    covers=("LAYOUT-5.2",),
)
def cross_layer(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    cache = _random_cache(example, ctx.device)
    spec = example_layout(example)
    facts = _facts(ctx, "read_layer", example)  # a cross-layer token pool's page size
    got = ctx.adapter.read_layer(cache, spec.name, **facts)
    expect(len(got) == 2, f"{_describe(example)}: read {len(got)} tensors, not K and V")
    page = _pool(example)
    # A cross-layer cache is one tensor.
    layers = layer_views(cast(torch.Tensor, cache), spec, block_size=page)
    for i, layer in enumerate(layers):
        want_kv = kv_views(layer, spec.layer_layout, block_size=page)
        for name, want, have in zip("KV", want_kv, got, strict=True):
            have = have[i] if have.dim() == 5 else have
            if tuple(have.shape) != tuple(want.shape) or not torch.equal(
                bits_view(have.contiguous()), bits_view(want.contiguous())
            ):
                detail = (
                    _first_difference(have, want)
                    if have.shape == want.shape
                    else f"[layers, ...] read as {list(got[0].shape)}"
                )
                fail(
                    f"{_describe(example)} with {example['shape']['layers']} layers: layer {i}'s "
                    f"{name} is not index {i} of the layers axis (at dim "
                    f"{spec.axes.index('layers')}) read as {spec.per_layer}: {detail} "
                    "[LAYOUT-5.2]"
                )


# records with inline scales [LAYOUT-6] -----------------------------------------------------
def _no_records(adapter: Adapter) -> str | None:
    return None if adapter.domain.record_layouts() else "the domain holds no inline-scale layout"


@st.composite
def _record_examples(draw: st.DrawFn, adapter: Adapter, *, aligned: bool = True) -> Example:
    layout = draw(st.sampled_from(adapter.domain.record_layouts()))
    spec = adapter.domain.layout(layout)
    kv = spec.tensors()
    if spec.fixed_head_dim is not None:
        head_dim = spec.fixed_head_dim
    elif aligned:
        head_dim = draw(st.sampled_from([4, 8]))
    else:
        head_dim = draw(st.sampled_from([1, 2, 3, 5, 6, 7]))
    shape = CacheShape(
        kv,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        1 if kv == 1 else draw(st.integers(1, 3)),
        head_dim,
    )
    assert spec.dtypes is not None
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": spec.dtypes[0],
        "seed": draw(st.integers(0, 2**16)),
    }


def _random_record(example: Example, device: str) -> torch.Tensor:
    """A record cache, every byte random (seeded); a misaligned head_dim is built raw."""
    spec = example_layout(example)
    shape = CacheShape(**example["shape"])
    try:
        cache = empty_cache(spec, shape, example["dtype"], device)
    except ValueError:  # a head_dim the layout refuses: the tensor an engine might hand over
        sizes = {
            "blocks": shape.num_blocks,
            "slots": shape.block_size,
            "heads": shape.heads,
            "dim": 2 * (shape.head_dim + 4),
        }
        dtype = example["dtype"] if spec.element is None else spec.element
        cache = torch.zeros([sizes[a] for a in spec.axes], dtype=FIELD_DTYPES[dtype], device=device)
    assert isinstance(cache, torch.Tensor)
    generator = torch.Generator().manual_seed(example["seed"])
    raw = cache.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
    return cache


def _fields_differ(want: dict, have: object, what: str, obligation: str) -> None:
    if not isinstance(have, dict) or sorted(have) != sorted(want):
        fail(
            f"{what}: read fields {sorted(have) if isinstance(have, dict) else type(have)}, "
            f"expected {sorted(want)} [{obligation}]"
        )
    for name, w in want.items():
        h = have[name]
        if h.dtype != w.dtype or tuple(h.shape) != tuple(w.shape):
            fail(
                f"{what}: field {name} reads as {h.dtype} {list(h.shape)}, expected {w.dtype} "
                f"{list(w.shape)} [num_blocks, block_size, heads, width] [{obligation}]"
            )
        if not torch.equal(bits_view(h.contiguous()), bits_view(w.contiguous())):
            fail(
                f"{what}: field {name} holds other bytes than the record puts there: "
                f"{_first_difference(h, w)} [{obligation}]"
            )


def _record_describe(example: Example) -> str:
    s = example["shape"]
    return (
        f"a {example['layout']} cache of {s['num_blocks']} blocks x {s['block_size']} slots, "
        f"{s['heads']} heads, head_dim {s['head_dim']}"
    )


@check(
    "LAYOUT-6",
    "read-fields",
    "every field of a record, inline scales included, reads as a view in its own dtype",
    needs=("fields",),
    strategy=_record_examples,
    missing=_no_records,
    examples=(
        {
            "layout": "vllm_pth_hnd",
            "shape": _shape_dict(CacheShape(2, 2, 3, 2, 4)),
            "dtype": "float8_e4m3fn",
            "seed": 6,
        },
        {
            "layout": "flashmla_fp8",
            "shape": _shape_dict(CacheShape(1, 2, 2, 1, 576)),
            "dtype": "float8_e4m3fn",
            "seed": 7,
        },
    ),
    covers=("LAYOUT-6.1",),
)
def read_fields(ctx: Context, example: Example) -> None:
    if example["layout"] not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    cache = _random_record(example, ctx.device)
    want = field_views(cache, example["layout"])
    have = ctx.adapter.read_fields(cache, example["layout"])
    _fields_differ(want, have, _record_describe(example), "LAYOUT-6.1")
    copied = [n for n, t in have.items() if t.untyped_storage().data_ptr() not in _storages(cache)]
    expect(not copied, f"{_record_describe(example)}: fields {copied} are copies [LAYOUT-6.1]")


@st.composite
def _record_conversions(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_record_examples(adapter))
    spec = example_layout(example)
    targets = [
        n
        for n in adapter.domain.layouts
        if adapter.domain.layout(n).kv_tensors == spec.kv_tensors
        and not adapter.domain.layout(n).cross_layer
    ]
    return {**example, "target": draw(st.sampled_from(targets))}


@check(
    "LAYOUT-6",
    "convert-records",
    "a record converts field by field, each scale with its token and head; into a layout "
    "without the same fields it is refused",
    needs=("conversion",),
    strategy=_record_conversions,
    missing=_no_records,
    examples=(
        {
            "layout": "vllm_pth_hnd",
            "shape": _shape_dict(CacheShape(2, 2, 3, 2, 4)),
            "dtype": "float8_e4m3fn",
            "seed": 8,
            "target": "vllm_pth_nhd",
        },
        {
            "layout": "vllm_pth_nhd",
            "shape": _shape_dict(CacheShape(2, 2, 2, 3, 8)),
            "dtype": "float8_e4m3fn",
            "seed": 9,
            "target": "vllm_packed_nhd",
        },
    ),
    covers=("LAYOUT-6.2", "LAYOUT-6.3"),
)
def convert_records(ctx: Context, example: Example) -> None:
    source, target = example["layout"], example["target"]
    if source not in ctx.adapter.domain.layouts or target not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    cache = _random_record(example, ctx.device)
    what = f"{_record_describe(example)} converted to {target}"
    try:
        expected = convert(cache, source, target)
    except ValueError as why:
        expect_refused(
            "LAYOUT-6.3",
            f"{what} ({why})",
            lambda: ctx.adapter.convert_layout(cache, source, target),
        )
        return
    got = ctx.adapter.convert_layout(cache, source, target)
    try:
        have = field_views(got, target)
    except ValueError as error:
        fail(f"{what} is not a {target} cache: {error} [LAYOUT-6.2]")
    _fields_differ(field_views(expected, target), have, what, "LAYOUT-6.2")


@check(
    "LAYOUT-6",
    "refuses-misaligned",
    "a head_dim that puts an inline scale off its alignment is refused",
    needs=("fields",),
    strategy=lambda adapter: _record_examples(adapter, aligned=False).filter(
        lambda e: example_layout(e).fixed_head_dim is None
    ),
    missing=lambda adapter: (
        None
        if any(
            adapter.domain.layout(n).fixed_head_dim is None for n in adapter.domain.record_layouts()
        )
        else "the domain holds no inline-scale layout with a free head_dim"
    ),
    examples=(
        {
            "layout": "vllm_pth_nhd",
            "shape": _shape_dict(CacheShape(2, 2, 2, 2, 3)),
            "dtype": "float8_e4m3fn",
            "seed": 10,
        },
    ),
    covers=("LAYOUT-6.4",),
)
def refuses_misaligned(ctx: Context, example: Example) -> None:
    if example["layout"] not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    cache = _random_record(example, ctx.device)
    expect_refused(
        "LAYOUT-6.4",
        f"{_record_describe(example)} ({list(cache.shape)}), whose K scale sits at byte "
        f"{example['shape']['head_dim']}, read by field",
        lambda: ctx.adapter.read_fields(cache, example["layout"]),
    )
