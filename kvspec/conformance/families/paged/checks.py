"""Checks of gathering a request from paged blocks and scattering it [PAGED-1..5].

Caches are filled from the coordinate-hash oracle, so every token of every layer is
distinguishable; other blocks hold other values and must be left alone. Every refused
scatter must leave the cache exactly as it was [PAGED-4]. Models, layouts and block
sizes are drawn from the adapter's domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, vacuous
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws import no_fp8
from kvspec.memory.paged import PagedCache, blocks_needed, empty_model_cache, gather_request
from kvspec.memory.paged import scatter_request as spec_scatter
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES, bits_view
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.testing.strategies import models
from kvspec.topology.model import ModelShape


@st.composite
def _side(draw: st.DrawFn, adapter: Adapter, *, attention: str, seq_len: int) -> dict:
    """A layout and block size of the domain, and a block table for ``seq_len`` tokens."""
    layout = draw(st.sampled_from(adapter.domain.cache_layouts(attention)))
    paged = adapter.domain.layout(layout).paged
    block_size = draw(st.sampled_from(adapter.domain.block_sizes)) if paged else 1
    needed = blocks_needed(seq_len, block_size)
    num_blocks = needed + draw(st.integers(0 if needed else 1, 3))
    ids = draw(st.permutations(range(num_blocks)))
    return {
        "layout": layout,
        "block_size": block_size,
        "num_blocks": num_blocks,
        "block_ids": list(ids[:needed]),
    }


@st.composite
def paged_examples(
    draw: st.DrawFn, adapter: Adapter, *, dtypes: tuple[str, ...] | None = None
) -> Example:
    domain = adapter.domain
    attention = tuple(a for a in domain.attention if domain.cache_layouts(a)) or domain.attention
    model = draw(
        models(
            max_layers=3,
            max_head_dim=3,
            max_heads=3,
            dtypes=domain.model_dtypes(dtypes),
            attention=attention,
        )
    )
    seq_len = draw(st.integers(1, 12))
    sides = [draw(_side(adapter, attention=model.attention, seq_len=seq_len)) for _ in range(2)]
    return {
        "model": model.to_dict(),
        "seq_len": seq_len,
        "sides": sides,
        "seed": draw(st.integers(0, 2**16)),
    }


def _in_domain(ctx: Context, example: Example) -> None:
    domain = ctx.adapter.domain
    model = ModelShape.from_dict(example["model"])
    if (
        model.dtype not in domain.model_dtypes()
        or model.attention not in domain.attention
        or any(s["layout"] not in domain.layouts for s in example["sides"])
        or any(
            s["block_size"] not in domain.block_sizes
            for s in example["sides"]
            if example_layout(s).paged
        )
    ):
        raise OutsideDomain


def _oracle(model: ModelShape, request_id: str, tokens: int, seed: int, device: str) -> RequestKV:
    """Oracle data for ``seed``, with the scales every cache here shares (seed 0) [PAGED-5]."""
    data = oracle_kv(model, request_id, tokens=tokens, seed=seed, device=device).data
    scales = oracle_scales(model, device=device) if model.dtype in FP8_DTYPES else None
    return RequestKV(data, scales)


def _cache(model: ModelShape, side: dict, device: str, *, fill_seed: int | None) -> PagedCache:
    """A paged cache for ``side``; with ``fill_seed``, every block holds oracle values."""
    scales = oracle_scales(model, device=device) if model.dtype in FP8_DTYPES else None
    cache = empty_model_cache(
        side["layout"],
        model,
        num_blocks=side["num_blocks"],
        block_size=side["block_size"],
        scales=scales,
        device=device,
    )
    if fill_seed is not None:
        slots = side["num_blocks"] * side["block_size"]
        filler = _oracle(model, "other-requests", slots, fill_seed, device)
        spec_scatter(filler, cache, list(range(side["num_blocks"])))
    return cache


def _filled_side(ctx: Context, example: Example, index: int) -> tuple[ModelShape, dict, PagedCache]:
    """The example's model, its side ``index`` and that side's cache filled with oracle
    values; outside the adapter's domain, the example is skipped."""
    _in_domain(ctx, example)
    model = ModelShape.from_dict(example["model"])
    side = example["sides"][index]
    return model, side, _cache(model, side, ctx.device, fill_seed=example["seed"])


def _cache_bits(cache: PagedCache, *, scales: bool = True) -> list[torch.Tensor]:
    """Every layer's K and V (or latent) as raw bits, then (with ``scales``) the scales."""
    bits = [bits_view(v).clone() for layer in cache.layers for v in cache.views(layer)]
    if scales and cache.scales is not None:
        bits.append(bits_view(cache.scales).clone())
    return bits


def _describe(example: Example, side: dict) -> str:
    m = ModelShape.from_dict(example["model"])
    return (
        f"{m.describe()}, a {example['seq_len']}-token request in a {side['layout']} cache of "
        f"{side['num_blocks']} blocks x {side['block_size']}, block ids {side['block_ids']}"
    )


def _pin(
    layout_a: str,
    bs_a: int,
    ids_a: list[int],
    layout_b: str,
    bs_b: int,
    ids_b: list[int],
    seq_len: int,
    blocks: int = 4,
    dtype: str = "bfloat16",
) -> Example:
    model = ModelShape(2, 2, 2, dtype=dtype)
    return {
        "model": model.to_dict(),
        "seq_len": seq_len,
        "sides": [
            {"layout": layout_a, "block_size": bs_a, "num_blocks": blocks, "block_ids": ids_a},
            {"layout": layout_b, "block_size": bs_b, "num_blocks": blocks * 4, "block_ids": ids_b},
        ],
        "seed": 0,
    }


PAGED_PINS = (
    _pin("flash_attn", 4, [3, 0], "flashinfer_hnd", 1, [9, 2, 7, 0, 1, 4, 5], 7),  # 4 -> 1
    _pin("flashinfer", 2, [1, 3, 0], "kv_tuple", 4, [5, 2], 5),  # partial last block
    _pin("flash_attn_hnd", 3, [2, 0], "flash_attn_hnd", 2, [6, 1, 3], 5, dtype="float8_e4m3fn"),
)


def _paged_check(
    clause: str, slug: str, title: str, *, covers: tuple[str, ...]
) -> Callable[[Callable[[Context, Example], None]], Callable[[Context, Example], None]]:
    """A check over the paged examples: the pins, then drawn ones [PAGED-1..4]."""
    return check(
        clause,
        slug,
        title,
        needs=("paged",),
        strategy=paged_examples,
        examples=PAGED_PINS,
        covers=covers,
    )


@_paged_check(
    "PAGED-1",
    "gather",
    "a request is gathered from its blocks, in block-table order, with the cache's scales",
    covers=("PAGED-1.1", "PAGED-4.1"),
)
def gather(ctx: Context, example: Example) -> None:
    _, side, cache = _filled_side(ctx, example, 0)
    expected = gather_request(cache, side["block_ids"], example["seq_len"])
    got = ctx.adapter.gather(cache, list(side["block_ids"]), example["seq_len"])
    if tuple(got.data.shape) != tuple(expected.data.shape):
        fail(
            f"{_describe(example, side)}: gathered {list(got.data.shape)}; the request is "
            f"{list(expected.data.shape)} [layers, kv, seq, heads, head_dim] [PAGED-4.1]"
        )
    differs = bits_view(got.data.contiguous()) != bits_view(expected.data)
    if bool(differs.any()):
        layer, kv, token, head, dim = (int(i) for i in differs.nonzero()[0].tolist())
        b = side["block_size"]
        fail(
            f"{_describe(example, side)}: {int(differs.sum())} gathered element(s) differ; the "
            f"first at layer {layer}, {'KV'[kv]}, token {token} (block id "
            f"{side['block_ids'][token // b]}, slot {token % b}), head {head}, dim {dim} "
            "[PAGED-1.1]"
        )
    if expected.scales is not None:
        expect(
            got.scales is not None
            and torch.equal(
                bits_view(got.scales.to(expected.scales.device)), bits_view(expected.scales)
            ),
            f"{_describe(example, side)}: gathered fp8 KV carries scales "
            f"{None if got.scales is None else got.scales.tolist()}; the cache's are "
            f"{expected.scales.tolist()} [PAGED-4.1]",
        )


@_paged_check(
    "PAGED-4",
    "scatter-across-block-sizes",
    "a request scattered into another layout and block size lands in its slots only",
    covers=("PAGED-1.1", "PAGED-1.2", "PAGED-4.2"),
)
def scatter(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    model = ModelShape.from_dict(example["model"])
    seq_len = example["seq_len"]
    request = _oracle(model, "req", seq_len, example["seed"], ctx.device)
    dst = example["sides"][1]
    expected = _cache(model, dst, ctx.device, fill_seed=example["seed"] + 1)
    got = _cache(model, dst, ctx.device, fill_seed=example["seed"] + 1)
    spec_scatter(request, expected, dst["block_ids"])
    ctx.adapter.scatter(request, got, list(dst["block_ids"]))
    b = dst["block_size"]
    for i, (want, have) in enumerate(
        zip(_cache_bits(expected, scales=False), _cache_bits(got, scales=False), strict=True)
    ):
        if torch.equal(want, have):
            continue
        block, slot = (int(x) for x in (want != have).nonzero()[0].tolist()[:2])
        position = dst["block_ids"].index(block) if block in dst["block_ids"] else None
        token = None if position is None else position * b + slot
        outside = token is None or token >= seq_len
        fail(
            f"{_describe(example, dst)}: after scattering, layer {i // model.kv_tensors} "
            f"{'KV'[i % model.kv_tensors] if model.kv_tensors == 2 else 'latent'} differs from "
            f"the spec's in {int((want != have).sum())} element(s), the first in block {block}, "
            f"slot {slot}"
            + (
                ", which holds no token of the request [PAGED-1.2]"
                if outside
                else f" (token {token}) [PAGED-1.1, PAGED-4.2]"
            )
        )


def _expect_nothing_written(
    ctx: Context,
    example: Example,
    cache: PagedCache,
    obligation: str,
    what: str,
    call: Callable[[], object],
    naming: tuple[object, ...] = (),
) -> None:
    """``call`` (a scatter into ``cache``) must be refused, naming one of ``naming``, and
    leave the cache untouched."""
    before = _cache_bits(cache)
    expect_refused(obligation, what, call, naming=naming)
    changed = [
        i
        for i, (a, b) in enumerate(zip(before, _cache_bits(cache), strict=True))
        if not torch.equal(a, b)
    ]
    expect(
        not changed,
        f"{what} was refused, but only after writing the cache; a scatter checks everything "
        "before it writes anything [PAGED-4.3]",
    )


def _expect_scatter_refused(
    ctx: Context,
    example: Example,
    side: dict,
    cache: PagedCache,
    kv: RequestKV,
    obligation: str,
    what: str,
    naming: tuple[object, ...] = (),
) -> None:
    """Scattering ``kv`` into the side's blocks must be refused, naming one of ``naming``,
    the cache untouched."""

    def scatter() -> object:
        write: Callable[..., object] = ctx.adapter.scatter  # its result is shown
        return write(kv, cache, list(side["block_ids"]))

    described = f"{what} into {_describe(example, side)}"
    _expect_nothing_written(ctx, example, cache, obligation, described, scatter, naming)


def _bad_tables(side: dict, kinds: tuple[str, ...]) -> list[tuple[str, str, list]]:
    """The side's block table with one defect, for every kind that applies:
    (obligation, what, ids) [PAGED-2, PAGED-3]."""
    ids, blocks = list(side["block_ids"]), side["num_blocks"]
    last = len(ids) - 1
    spare = [b for b in range(blocks) if b not in ids]

    def at(value: object, where: int = last) -> list:
        return [value if i == where else b for i, b in enumerate(ids)]

    table = {
        "past-end": ("PAGED-2.1", [at(blocks), at(blocks + 1, 0)]),
        "negative": ("PAGED-2.2", [at(-1), at(-blocks, 0)]),
        "duplicate": ("PAGED-2.3", [at(ids[0])] if len(ids) > 1 else []),
        "not-integer": ("PAGED-2.4", [at(float(ids[last])), at(str(ids[0]), 0), at(None)]),
        "fewer": ("PAGED-3.1", [ids[:-1]]),
        "more": ("PAGED-3.2", [[*ids, spare[0]]] if spare else []),
    }
    return [(table[k][0], k, bad) for k in kinds for bad in table[k][1]]


def _table_refusals(ctx: Context, example: Example, kinds: tuple[str, ...]) -> None:
    """Every defective table of the example's first side is refused by gather and by
    scatter, and a refused scatter writes nothing [PAGED-2, PAGED-3, PAGED-4.3]."""
    model, side, cache = _filled_side(ctx, example, 0)
    request = _oracle(model, "req", example["seq_len"], 1, ctx.device)
    for obligation, kind, bad in _bad_tables(side, kinds):
        what = f"{_describe(example, side)}: block ids {bad!r} ({kind})"

        def gather(bad: list[Any] = bad) -> object:
            return ctx.adapter.gather(cache, list(bad), example["seq_len"])

        def scatter(bad: list[Any] = bad) -> object:
            write: Callable[..., object] = ctx.adapter.scatter  # its result is shown
            return write(request, cache, list(bad))

        expect_refused(
            obligation,
            f"gathering with {what}",
            gather,
            naming=(bad, *bad),
            accepted={"block_ids": list(bad), "seq_len": example["seq_len"]},
        )
        _expect_nothing_written(
            ctx,
            example,
            cache,
            obligation,
            f"scattering into {what}",
            scatter,
            (bad, *bad),
        )


@_paged_check(
    "PAGED-2",
    "refuses-bad-ids",
    "ids out of range, negative, repeated or not integers are refused; nothing is written",
    covers=("PAGED-2.1", "PAGED-2.2", "PAGED-2.3", "PAGED-2.4", "PAGED-4.3"),
)
def refuses_bad_ids(ctx: Context, example: Example) -> None:
    _table_refusals(ctx, example, ("past-end", "negative", "duplicate", "not-integer"))


@_paged_check(
    "PAGED-3",
    "refuses-wrong-count",
    "exactly the blocks seq_len needs; nothing is written otherwise",
    covers=("PAGED-3.1", "PAGED-3.2", "PAGED-4.3"),
)
def refuses_wrong_count(ctx: Context, example: Example) -> None:
    _table_refusals(ctx, example, ("fewer", "more"))


_MISFITS = ("one head more", "head_dim one longer", "one layer fewer", "one layer more", "dtype")


def _misfit(kv: RequestKV, misfit: str, model: ModelShape) -> RequestKV:
    data, scales = kv.data, kv.scales
    if misfit == "one head more":
        return RequestKV(torch.cat([data, data[:, :, :, :1]], dim=3), scales)
    if misfit == "head_dim one longer":
        return RequestKV(torch.cat([data, data[..., :1]], dim=4), scales)
    if misfit == "one layer fewer" and data.shape[0] > 1:
        return RequestKV(data[:-1], None if scales is None else scales[:-1])
    if misfit in ("one layer fewer", "one layer more"):
        more = None if scales is None else torch.cat([scales, scales[:1]])
        return RequestKV(torch.cat([data, data[:1]]), more)
    same = [d for d in DTYPES if d != model.dtype and DTYPES[d].itemsize == data.element_size()]
    other = DTYPES[same[0]] if same else torch.float16
    fp8_scales = scales if other in (DTYPES[d] for d in FP8_DTYPES) else None
    return RequestKV(data.view(other) if same else data.to(other), fp8_scales)


@_paged_check(
    "PAGED-4",
    "refuses-mismatched-kv",
    "KV that does not fit the cache (layers, heads, head_dim, dtype) is refused, unwritten",
    covers=("PAGED-4.4", "PAGED-4.3"),
)
def refuses_mismatched_kv(ctx: Context, example: Example) -> None:
    model, side, cache = _filled_side(ctx, example, 1)
    request = _oracle(model, "req", example["seq_len"], 1, ctx.device)
    for misfit in _MISFITS:
        kv = _misfit(request, misfit, model)
        what = f"scattering {kv.data.dtype} KV of shape {list(kv.data.shape)} ({misfit})"
        # "refused with both shapes": the KV's, as a list or a tuple; a dtype by its name
        shape = [int(n) for n in kv.data.shape]
        dtype = str(kv.data.dtype)
        dtypes = (dtype, dtype.removeprefix("torch.")) if misfit == "dtype" else ()
        naming = (shape, tuple(shape), *dtypes)
        _expect_scatter_refused(ctx, example, side, cache, kv, "PAGED-4.4", what, naming)


@check(
    "PAGED-5",
    "fp8-scales",
    "fp8 KV without scales, or under one other scale (K or V of one layer), is refused",
    needs=("paged", "fp8-scales"),
    strategy=lambda adapter: paged_examples(adapter, dtypes=FP8_DTYPES),
    examples=PAGED_PINS[2:],
    missing=no_fp8,
    covers=("PAGED-5.1", "PAGED-5.2", "PAGED-4.3"),
)
def fp8_scales(ctx: Context, example: Example) -> None:
    _in_domain(ctx, example)
    model = ModelShape.from_dict(example["model"])
    if model.dtype not in FP8_DTYPES:
        vacuous()
    side = example["sides"][1]
    cache = _cache(model, side, ctx.device, fill_seed=example["seed"])
    request = _oracle(model, "req", example["seq_len"], example["seed"], ctx.device)
    assert request.scales is not None and cache.scales is not None
    # "naming the layer and both values"; missing scales are missing as a whole
    variants: list[tuple[str, str, RequestKV, tuple[object, ...]]] = [
        ("PAGED-5.2", "without scales", RequestKV(request.data), ())
    ]
    for layer in range(model.num_layers):
        for k in range(model.kv_tensors):
            scales = request.scales.clone()
            scales[layer, k] *= 2
            name = "KV"[k] if model.kv_tensors == 2 else "latent"
            what = (
                f"whose {name} scale of layer {layer} is {float(scales[layer, k])}, the "
                f"cache's {float(cache.scales[layer, k])}"
            )
            values = (float(scales[layer, k]), float(cache.scales[layer, k]))
            variants.append(("PAGED-5.1", what, RequestKV(request.data, scales), values))
    for obligation, what, kv, naming in variants:
        _expect_scatter_refused(
            ctx, example, side, cache, kv, obligation, f"scattering fp8 KV {what}", naming
        )
