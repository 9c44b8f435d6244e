"""Checks of reading, converting and detecting cache layouts [LAYOUT-1..4].

Caches are filled with random bits, so a misread element is told apart from the
right one; comparisons are bit-exact [DTYPE-2]. Layouts, dtypes and block sizes are
drawn from the adapter's domain.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, vacuous
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.tiers import BREAKS
from kvspec.memory.cache_layout import (
    PRESETS,
    CacheShape,
    LayerCache,
    convert,
    detect_layout,
    empty_cache,
    kv_views,
)
from kvspec.memory.cache_layout.detection import read_as
from kvspec.memory.layout_refs import is_layout_file
from kvspec.tensors.dtypes import bits_view
from kvspec.testing.strategies import cache_shapes


def _pool(example: Example, key: str = "layout") -> int | None:
    """A token pool's page size, which its shape does not say [LAYOUT-5], for the layout
    ``example`` names under ``key``; else None (and for a name no layout has, drawn to be
    refused)."""
    ref = example[key]
    if ref not in PRESETS and not is_layout_file(ref):
        return None
    return example_layout(example, key).page_size(example["shape"]["block_size"])


def _facts(ctx: Context, method: str, example: Example, key: str = "layout") -> dict:
    """The keyword a token pool needs (its page size), for an adapter method that takes it;
    an adapter whose method does not is not asked to read token pools [LAYOUT-5]."""
    page = _pool(example, key)
    if page is None:
        return {}
    if not takes(ctx.adapter, method, "page_size"):
        raise OutsideDomain
    return {"page_size": page}


def takes(adapter: Adapter, method: str, keyword: str) -> bool:
    """Whether ``adapter.method`` accepts the keyword argument ``keyword``."""
    parameters = inspect.signature(getattr(adapter, method)).parameters
    return keyword in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _random_cache(example: Example, device: str) -> LayerCache:
    """The example's cache, every element random bits (seeded)."""
    shape = CacheShape(**example["shape"])
    cache = empty_cache(example["layout"], shape, example["dtype"], device)
    generator = torch.Generator().manual_seed(example["seed"])
    for view in kv_views(cache, example["layout"], block_size=_pool(example)):
        bits = bits_view(view)
        info = torch.iinfo(bits.dtype)
        bits.copy_(
            torch.randint(info.min, info.max, bits.shape, generator=generator, dtype=bits.dtype)
        )
    return cache


@st.composite
def _cache_examples(draw: st.DrawFn, adapter: Adapter, *, min_blocks: int = 0) -> Example:
    domain = adapter.domain
    layout = draw(st.sampled_from(domain.plain_layouts() or domain.layouts))
    spec = domain.layout(layout)
    kinds = [k for k in (2, 1) if "mha" in domain.attention or k == 1]
    kinds = [k for k in kinds if "mla" in domain.attention or k == 2] or [2]
    kv = spec.kv_tensors or draw(st.sampled_from(kinds))
    shape = draw(cache_shapes(kv=kv, min_blocks=min_blocks))
    block_sizes = [b for b in domain.block_sizes if b <= 4] or [min(domain.block_sizes)]
    block_size = draw(st.sampled_from(block_sizes)) if spec.paged else 1
    layers = draw(st.integers(1, 3)) if spec.cross_layer else 1
    shape = CacheShape(kv, shape.num_blocks, block_size, shape.heads, shape.head_dim, layers)
    return {
        "layout": layout,
        "shape": _shape_dict(shape),
        "dtype": draw(st.sampled_from(domain.model_dtypes())),
        "seed": draw(st.integers(0, 2**16)),
    }


def _shape_dict(shape: CacheShape) -> dict[str, int]:
    return {
        "kv": shape.kv,
        "num_blocks": shape.num_blocks,
        "block_size": shape.block_size,
        "heads": shape.heads,
        "head_dim": shape.head_dim,
        **({"layers": shape.layers} if shape.layers > 1 else {}),
    }


def _in_domain(ctx: Context, example: Example) -> None:
    """A pinned example in a layout or dtype the adapter's domain does not hold is outside."""
    domain = ctx.adapter.domain
    if example["layout"] not in domain.layouts or example["dtype"] not in domain.model_dtypes():
        raise OutsideDomain


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
    _pin("flashinfer_hnd", 2, 3, 4, 2, 3),
    _pin("kv_tuple", 2, 3, 2, 2, 3),
    _pin("token_major", 2, 3, 1, 2, 3),
    _pin("mla", 1, 3, 2, 1, 4),
    _pin("vllm_packed_nhd", 2, 2, 3, 2, 2),  # stride order NHD under a logical HND shape
    _pin("vllm_packed_hnd", 2, 2, 2, 3, 2),
)


def _first_difference(have: torch.Tensor, want: torch.Tensor) -> str:
    """Where two equal-shaped tensors first differ, in [block, slot, head, dim]."""
    differs = bits_view(have.contiguous()) != bits_view(want.contiguous())
    index = [int(i) for i in differs.nonzero()[0].tolist()]
    return (
        f"{int(differs.sum())} of {differs.numel()} elements differ; the first at "
        f"[block, slot, head, dim] = {index}"
    )


@check(
    "LAYOUT-1",
    "read-named",
    "each named layout reads K and V from the right axes",
    needs=("layouts",),
    strategy=_cache_examples,
    examples=LAYOUT_PINS,
    covers=("LAYOUT-1.1", "LAYOUT-2.2", "LAYOUT-5.1"),
)
def read_named(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    cache = _random_cache(example, ctx.device)
    expected = kv_views(cache, example["layout"], block_size=_pool(example))
    got = ctx.adapter.read_layer(cache, example["layout"], **_facts(ctx, "read_layer", example))
    expect(
        len(got) == len(expected),
        f"{_describe(example)}: read {len(got)} tensors, expected {len(expected)} [LAYOUT-1.1]",
    )
    for name, want, have in zip(("K", "V"), expected, got, strict=False):
        what = name if len(expected) == 2 else "latent"
        if tuple(have.shape) != tuple(want.shape):
            reshaped = example["layout"] in ("token_major", "mla")
            fail(
                f"{_describe(example)}: {what} read as {list(have.shape)}; the named layout "
                f"reads [num_blocks, block_size, heads, head_dim] = {list(want.shape)} "
                f"[{'LAYOUT-2.2' if reshaped else 'LAYOUT-1.1'}]"
            )
        if not torch.equal(bits_view(have.contiguous()), bits_view(want.contiguous())):
            fail(
                f"{_describe(example)}: {what} read as {list(have.shape)} has the right shape but "
                f"not the right elements: {_first_difference(have, want)} [LAYOUT-1.1]"
            )


UNKNOWN_LAYOUTS = ("flash_attention", "FlashInfer", "flashinfer_nhd", "paged", "", "HND")


@check(
    "LAYOUT-1",
    "refuses-unknown-name",
    "an unknown layout name is refused, never read as a known one",
    needs=("layouts",),
    strategy=lambda adapter: st.tuples(_cache_examples(adapter), st.sampled_from(UNKNOWN_LAYOUTS)),
    covers=("LAYOUT-1.2",),
)
def refuses_unknown_name(ctx: Context, example: tuple[Example, str]) -> None:
    base, name = example
    cache = _random_cache(base, ctx.device)
    expect_refused(
        "LAYOUT-1.2",
        f"{_describe(base)} read under the unknown layout name {name!r}",
        lambda: ctx.adapter.read_layer(cache, name),
        naming=(name,),
    )


@st.composite
def _misshapen(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A cache that breaks its named layout in one way: the K/V axis not of size 2, one
    dimension more or less, or K and V of different shapes [LAYOUT-1]."""
    example = draw(_cache_examples(adapter, min_blocks=1))
    spec = example_layout(example)
    defects = ["rank"]
    if spec.kv_axis is not None:
        defects.append("kv-axis")
    if spec.tuple_form and (spec.kv_tensors == 2 or example["shape"]["kv"] == 2):
        defects.append("kv-shapes")
    return {**example, "defect": draw(st.sampled_from(defects))}


def _break(cache: Any, example: Example) -> LayerCache:  # cache: a tensor or a tuple
    spec = example_layout(example)
    defect = example["defect"]
    if defect == "kv-axis":  # a third slice on the K/V axis
        axis = cast(int, spec.kv_axis)  # _misshapen draws kv-axis only where there is one
        return torch.cat([cache, cache.narrow(axis, 0, 1)], dim=axis)
    if defect == "kv-shapes":  # V one head_dim longer than K
        k, v = cache
        return (k, torch.cat([v, v[..., :1]], dim=-1))
    if isinstance(cache, tuple):
        return tuple(t.unsqueeze(0) for t in cache)
    return cache.unsqueeze(0)


@check(
    "LAYOUT-1",
    "refuses-misshapen",
    "a cache that does not have the named layout's shape is refused, not read",
    needs=("layouts",),
    strategy=_misshapen,
    examples=({**LAYOUT_PINS[0], "defect": "kv-axis"}, {**LAYOUT_PINS[4], "defect": "kv-shapes"}),
    covers=("LAYOUT-1.3",),
)
def refuses_misshapen(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    bad = _break(_random_cache(example, ctx.device), example)
    shapes = [list(t.shape) for t in bad] if isinstance(bad, tuple) else list(bad.shape)
    tensors = bad if isinstance(bad, tuple) else (bad,)
    expect_refused(
        "LAYOUT-1.3",
        f"a cache of shape {shapes} ({example['defect']}) read as {example['layout']} "
        f"{example_layout(example).shape}",
        lambda: ctx.adapter.read_layer(
            bad, example["layout"], **_facts(ctx, "read_layer", example)
        ),
        # "refused with its shape": a tensor's, as a list or a tuple
        naming=[form(t.shape) for t in tensors for form in (list, tuple)],
    )


@check(
    "LAYOUT-2",
    "views-alias",
    "reading a cache copies nothing",
    needs=("layouts",),
    strategy=_cache_examples,
    examples=LAYOUT_PINS,
    covers=("LAYOUT-2.1",),
)
def views_alias(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    cache = _random_cache(example, ctx.device)
    tensors = cache if isinstance(cache, tuple) else (cache,)
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    views = [
        v
        for v in ctx.adapter.read_layer(
            cache, example["layout"], **_facts(ctx, "read_layer", example)
        )
        if v.numel()
    ]
    if not views:
        vacuous()
    for view in views:
        expect(
            view.untyped_storage().data_ptr() in storages,
            f"{_describe(example)}: reading it returned a copy, not a view of the cache's "
            "storage [LAYOUT-2.1]",
        )


@st.composite
def _conversions(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A cache and a target layout of the domain; sometimes one of other information."""
    example = draw(_cache_examples(adapter))
    kv = example["shape"]["kv"]
    plain = adapter.domain.plain_layouts()
    tensors = {n: adapter.domain.layout(n).kv_tensors for n in plain}
    same = [n for n in plain if tensors[n] in (None, kv)]
    other = [n for n in plain if tensors[n] not in (None, kv)]
    target = draw(st.sampled_from(other)) if other and draw(st.integers(0, 4)) == 0 else None
    return {**example, "target": target or draw(st.sampled_from(same))}


@check(
    "LAYOUT-3",
    "convert",
    "conversion moves every slot bit for bit into a new cache; other information is refused",
    needs=("conversion",),
    strategy=_conversions,
    examples=(
        *({**p, "target": "flashinfer_hnd"} for p in LAYOUT_PINS[:3]),
        {**LAYOUT_PINS[0], "target": "flash_attn"},
        {**LAYOUT_PINS[0], "target": "mla"},
    ),
    covers=("LAYOUT-3.1", "LAYOUT-3.2", "LAYOUT-3.3", "DTYPE-2.1"),
)
def converts(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    cache = _random_cache(example, ctx.device)
    source, target = example["layout"], example["target"]
    if target not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    try:
        expected = convert(cache, source, target, source_block_size=_pool(example))
    except ValueError as why:
        expect_refused(
            "LAYOUT-3.3",
            f"{_describe(example)} converted to {target} ({why})",
            lambda: ctx.adapter.convert_layout(
                cache, source, target, **_facts(ctx, "convert_layout", example)
            ),
        )
        return
    got = ctx.adapter.convert_layout(
        cache, source, target, **_facts(ctx, "convert_layout", example)
    )
    page = _pool(example, "target")
    for want, have in zip(
        kv_views(expected, target, block_size=page),
        kv_views(got, target, block_size=page),
        strict=True,
    ):
        if tuple(have.shape) != tuple(want.shape):
            fail(
                f"{_describe(example)} converted to {target} reads as {list(have.shape)}, not "
                f"{list(want.shape)} [LAYOUT-3.1]"
            )
        if not torch.equal(bits_view(have.contiguous()), bits_view(want.contiguous())):
            fail(
                f"{_describe(example)} converted to {target} misplaces slots (random bits, NaN "
                f"payloads included, compared bit for bit): {_first_difference(have, want)} "
                "[LAYOUT-3.1, DTYPE-2.1]"
            )
    inputs = {
        t.untyped_storage().data_ptr() for t in (cache if isinstance(cache, tuple) else (cache,))
    }
    outputs = {t.untyped_storage().data_ptr() for t in (got if isinstance(got, tuple) else (got,))}
    expect(
        not inputs & outputs or not any(t.numel() for t in kv_views(got, target, block_size=page)),
        f"{_describe(example)} converted to {target} shares storage with the input; the "
        "result is a new cache [LAYOUT-3.2]",
    )


@st.composite
def _detections(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A cache and what the caller knows of it; sometimes a stated fact is wrong, or the
    cache is bent so that no layout fits [LAYOUT-4]."""
    example = draw(_cache_examples(adapter, min_blocks=1))
    s = example["shape"]
    known = {
        k: s[k] for k in sorted(draw(st.sets(st.sampled_from(["heads", "head_dim", "block_size"]))))
    }
    twist = draw(st.sampled_from(["none", "none", "none", "wrong-fact", "no-fit"]))
    if twist == "wrong-fact":
        fact = draw(st.sampled_from(["heads", "head_dim", "block_size"]))
        known[fact] = s[fact] + 1
    return {**example, "known": known, "twist": twist}


def _detection_cache(example: Example, device: str) -> LayerCache:
    cache = _random_cache(example, device)
    if example.get("twist") == "no-fit":  # a sixth dimension no layout has
        return tuple(t.unsqueeze(0) for t in cache) if isinstance(cache, tuple) else cache[None]
    return cache


def _candidates(cache: LayerCache, known: dict[str, int]) -> tuple[object, ...]:
    """What an ambiguous detection must name, "listing every candidate": the layouts the
    cache fits, given what is known of it [LAYOUT-4]."""
    facts = {k: known.get(k) for k in ("heads", "head_dim", "block_size")}
    return tuple(
        name
        for name, spec in PRESETS.items()
        if not spec.cross_layer and read_as(cache, spec, **facts) is not None
    )


def _unfit(cache: LayerCache) -> tuple[object, ...]:
    """What a detection no layout fits must name: the cache's shape (a tensor's as a list
    or a tuple), or the layouts it lists [LAYOUT-4]."""
    tensors = cache if isinstance(cache, tuple) else (cache,)
    shapes = [form(t.shape) for t in tensors for form in (list, tuple)]
    return (*shapes, *(name for name, spec in PRESETS.items() if not spec.cross_layer))


@check(
    "LAYOUT-4",
    "detect-unambiguous",
    "detection answers only when one layout fits, and then correctly",
    needs=("detection",),
    strategy=_detections,
    examples=(
        *(
            {**p, "known": {"heads": p["shape"]["heads"], "head_dim": p["shape"]["head_dim"]}}
            for p in LAYOUT_PINS
        ),
        {**LAYOUT_PINS[2], "known": {"block_size": 2}},
        {**_pin("flash_attn", 2, 3, 4, 2, 3), "known": {"block_size": 4}},
        {**LAYOUT_PINS[0], "known": {"heads": 3}, "twist": "wrong-fact"},
        # [3, 4, 5] fits mla alone by shape (a token pool's middle axis is 1): the stated
        # head_dim contradicts it
        {**_pin("mla", 1, 3, 4, 1, 5), "known": {"head_dim": 6}, "twist": "wrong-fact"},
    ),
    covers=("LAYOUT-4.1", "LAYOUT-4.2", "LAYOUT-4.3", "LAYOUT-4.4"),
)
def detect_unambiguous(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    cache = _detection_cache(example, ctx.device)
    shape = list(cache.shape) if isinstance(cache, torch.Tensor) else [list(t.shape) for t in cache]
    known = example["known"]
    try:
        expected = detect_layout(cache, **known)
    except ValueError as why:
        ambiguous = "ambiguous" in str(why)
        expect_refused(
            "LAYOUT-4.2" if ambiguous else "LAYOUT-4.4",
            f"detection of a cache of shape {shape} (knowing {known or 'nothing'}), which "
            f"{'fits several layouts' if ambiguous else 'no layout fits'} ({why})",
            lambda: ctx.adapter.detect_layout(cache, **known),
            naming=_candidates(cache, known) if ambiguous else _unfit(cache),
        )
        return
    try:
        answer = ctx.adapter.detect_layout(cache, **known)
    except Exception as error:
        fail(
            f"a cache of shape {shape} (knowing {known}) is {expected}: the stated facts leave "
            f"only it; detection raised {error!r} [{'LAYOUT-4.3' if known else 'LAYOUT-4.1'}]",
            tier=BREAKS,
        )
    expect(
        answer == expected,
        f"a cache of shape {shape} (knowing {known or 'nothing'}) is {expected}; detection "
        f"said {answer!r} [LAYOUT-4.1]",
    )
