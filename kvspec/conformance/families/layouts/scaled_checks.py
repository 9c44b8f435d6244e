"""Checks of block-scaled layouts: fields in per-block planes, split slot axes and side
tensors [LAYOUT-8], and the oracle's fp4 and e8m0 values [ORACLE-8].

Caches are filled with random bytes (seeded), so a field read from the wrong plane,
the wrong slot of a 4-token group or 32 x 4 interleave, or the wrong side tensor is
told apart from the right one; comparisons are bit-exact [DTYPE-2]. Layouts come from
the adapter's domain (vLLM's NVFP4 pages, SGLang's MXFP8 pool), each with a head_dim
and block size it holds.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws.records import (
    no_scaled,
    scaled_dtype,
    scaled_geometry,
)
from kvspec.conformance.families.layouts.checks import _shape_dict
from kvspec.memory.cache_layout import CacheLayout, CacheShape, LayerCache, empty_cache, field_views
from kvspec.tensors.dtypes import bits_view


@st.composite
def _scaled_caches(draw: st.DrawFn, adapter: Adapter) -> Example:
    layout = draw(st.sampled_from(adapter.domain.scaled_layouts()))
    head_dims, block_sizes = scaled_geometry(adapter.domain.layout(layout))
    shape = CacheShape(
        2,
        draw(st.integers(1, 3)),
        draw(st.sampled_from(block_sizes)),
        draw(st.integers(1, 3)),
        draw(st.sampled_from(head_dims)),
    )
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": scaled_dtype(adapter, layout),
        "seed": draw(st.integers(0, 2**16)),
    }


def _random_bytes(cache: LayerCache, seed: int) -> LayerCache:
    generator = torch.Generator().manual_seed(seed)
    for tensor in cache if isinstance(cache, tuple) else (cache,):
        raw = tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
    return cache


def _page(example: Example) -> int | None:
    return example_layout(example).page_size(example["shape"]["block_size"])


def _what(example: Example) -> str:
    s = example["shape"]
    return (
        f"a {example['layout']} cache of {s['num_blocks']} blocks x {s['block_size']} slots, "
        f"{s['heads']} heads, head_dim {s['head_dim']}"
    )


_READ_PINS: tuple[Example, ...] = (
    {
        "layout": "vllm_nvfp4_hnd",
        "shape": _shape_dict(CacheShape(2, 2, 8, 2, 64)),
        "dtype": "bfloat16",
        "seed": 3,
    },
    {
        "layout": "sglang_mxfp8",
        "shape": _shape_dict(CacheShape(2, 2, 128, 2, 128)),
        "dtype": "float8_e4m3fn",
        "seed": 4,
    },
)


def _obligation(spec: CacheLayout, field: str) -> str:
    """Which LAYOUT-8 obligation a wrong field breaks: a split field's slots (8.2), a
    side field's tensor (8.3), a plane's place (8.1)."""
    plane = spec.placement(field)
    if plane is not None and plane.split:
        return "LAYOUT-8.2"
    if any(s.field.name == field for s in spec.side):
        return "LAYOUT-8.3"
    return "LAYOUT-8.1"


@check(
    "LAYOUT-8",
    "read-planes",
    "every field of a block-scaled cache reads from its plane, split slot axis or side "
    "tensor, as a view in its own dtype",
    needs=("fields",),
    strategy=_scaled_caches,
    examples=_READ_PINS,
    missing=no_scaled,
    covers=("LAYOUT-8.1", "LAYOUT-8.2", "LAYOUT-8.3"),
)
def read_planes(ctx: Context, example: Example) -> None:
    layout = example["layout"]
    if layout not in ctx.adapter.domain.scaled_layouts():
        raise OutsideDomain
    shape = CacheShape(**example["shape"])
    cache = _random_bytes(empty_cache(layout, shape, example["dtype"], ctx.device), example["seed"])
    want = field_views(cache, layout, block_size=_page(example))
    have = ctx.adapter.read_fields(cache, layout, page_size=_page(example))
    what = _what(example)
    if not isinstance(have, dict) or sorted(have) != sorted(want):
        fail(
            f"{what}: read fields {sorted(have) if isinstance(have, dict) else type(have)}, "
            f"expected {sorted(want)} [LAYOUT-8.1]"
        )
    for name, w in want.items():
        h, rule = have[name], _obligation(ctx.adapter.domain.layout(layout), name)
        if tuple(h.shape) != tuple(w.shape) or h.element_size() != w.element_size():
            fail(
                f"{what}: field {name} reads as {h.dtype} {list(h.shape)}, expected {w.dtype} "
                f"{list(w.shape)} [{rule}]"
            )
        differs = bits_view(h.contiguous()) != bits_view(w.contiguous())
        if bool(differs.any()):
            at = [int(i) for i in differs.nonzero()[0].tolist()]
            fail(
                f"{what}: field {name} holds other bytes than its "
                f"{'side tensor' if rule == 'LAYOUT-8.3' else 'plane'} puts there: "
                f"{int(differs.sum())} of {differs.numel()} differ, the first at index {at} "
                f"([blocks, {'slots/unit, unit' if w.dim() == 5 else 'slots'}, heads, width]) "
                f"[{rule}]"
            )
    mine = {
        t.untyped_storage().data_ptr() for t in (cache if isinstance(cache, tuple) else (cache,))
    }
    copied = [n for n, t in have.items() if t.untyped_storage().data_ptr() not in mine]
    expect(not copied, f"{what}: fields {copied} are copies, not views [LAYOUT-8.1]")


@st.composite
def _unholdable(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A block-scaled cache of a block size its unit does not divide (or not its fixed
    one), of a head_dim off its multiple, or with a side tensor of another shape."""
    example = draw(_scaled_caches(adapter))
    spec = example_layout(example)
    units = [p.unit for p in (*spec.planes, *(s.plane for s in spec.side)) if p.unit]
    kinds = (
        (["block"] if units or spec.fixed_block_size else [])
        + ["head_dim"]
        + (["side"] if spec.side else [])
    )
    return {**example, "bad": draw(st.sampled_from(kinds))}


def _bad_cache(example: Example, device: str) -> tuple[LayerCache, int | None]:
    """The tensors an engine might hand over that the layout cannot hold."""
    spec = example_layout(example)
    shape = CacheShape(**example["shape"])
    page = _page(example)
    if example["bad"] == "head_dim":  # a multiple of 16 that is not one of 32 (or 64)
        if spec.planes:
            full = 48 // 2 + 48 // 16  # the page's last axis at head_dim 48
            raw = torch.zeros(
                shape.num_blocks, 2 * shape.heads, shape.block_size, full, dtype=torch.uint8
            )
            return raw.to(device), page
        cache = empty_cache(spec, shape, example["dtype"], device)
        assert isinstance(cache, tuple)
        k, v, *side = cache
        wrong = 48 if shape.head_dim > 48 else 16
        return (k[..., :wrong].contiguous(), v[..., :wrong].contiguous(), *side), page
    if example["bad"] == "side":
        cache = empty_cache(spec, shape, example["dtype"], device)
        assert isinstance(cache, tuple)
        k, v, ks, vs = cache
        return (k, v, ks.transpose(2, 3).contiguous(), vs), page  # [.., 4, 32, ..]
    if spec.fixed_block_size:
        cache = empty_cache(spec, shape, example["dtype"], device)
        return cache, spec.fixed_block_size // 2
    units = [p.unit for p in (*spec.planes, *(s.plane for s in spec.side)) if p.unit]
    odd = CacheShape(2, shape.num_blocks, max(units) + 2, shape.heads, shape.head_dim)
    full = spec.dim_size(example["dtype"], shape.head_dim)
    raw = torch.zeros(
        odd.num_blocks, 2 * odd.heads, odd.block_size, full, dtype=torch.uint8, device=device
    )
    return raw, page


@check(
    "LAYOUT-8",
    "refuses-unholdable",
    "a block-scaled cache of a block size its unit does not divide (or not its fixed one), a "
    "head_dim off its multiple, or side tensors of another shape is refused",
    needs=("fields",),
    strategy=_unholdable,
    examples=(
        {**_READ_PINS[0], "bad": "block"},
        {**_READ_PINS[1], "bad": "side"},
        {**_READ_PINS[1], "bad": "block"},
    ),
    missing=no_scaled,
    covers=("LAYOUT-8.4",),
)
def refuses_unholdable(ctx: Context, example: Example) -> None:
    if example["layout"] not in ctx.adapter.domain.scaled_layouts():
        raise OutsideDomain
    cache, page = _bad_cache(example, ctx.device)
    shown = [list(t.shape) for t in (cache if isinstance(cache, tuple) else (cache,))]
    expect_refused(
        "LAYOUT-8.4",
        f"{_what(example)} handed over with its {example['bad']} wrong ({shown}, page size "
        f"{page}), read by field",
        lambda: ctx.adapter.read_fields(cache, example["layout"], page_size=page),
    )
