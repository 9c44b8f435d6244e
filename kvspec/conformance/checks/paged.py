"""Checks of gathering a request from paged blocks and scattering it [PAGED-1..5, ORACLE-1..4].

Caches are filled from the coordinate-hash oracle, so every token of every layer is
distinguishable; other blocks hold other values and must be left alone.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, fail
from kvspec.dtypes import FP8_DTYPES, bits_view
from kvspec.kv import RequestKV
from kvspec.model import ModelShape
from kvspec.oracle import oracle_kv, oracle_scales
from kvspec.paged import PagedCache, empty_model_cache, gather_request, scatter_request
from kvspec.strategies import models, paged_sides


@st.composite
def _paged_examples(draw: st.DrawFn, *, dtypes: tuple[str, ...] | None = None) -> Example:
    kwargs = {"dtypes": dtypes} if dtypes else {}
    model = draw(models(max_layers=3, max_head_dim=3, max_heads=3, **kwargs))
    seq_len = draw(st.integers(1, 12))
    sides = [draw(paged_sides(attention=model.attention, seq_len=seq_len)) for _ in range(2)]
    return {
        "model": model.to_dict(),
        "seq_len": seq_len,
        "sides": [
            {
                "layout": s.layout,
                "block_size": s.block_size,
                "num_blocks": s.num_blocks,
                "block_ids": list(s.block_ids),
            }
            for s in sides
        ],
        "seed": draw(st.integers(0, 2**16)),
    }


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
        scatter_request(filler, cache, list(range(side["num_blocks"])))
    return cache


def _cache_bits(cache: PagedCache) -> list[torch.Tensor]:
    from kvspec.cache_layout import kv_views

    return [bits_view(v).clone() for layer in cache.layers for v in kv_views(layer, cache.layout)]


def _describe(example: Example, side: dict) -> str:
    m = ModelShape.from_dict(example["model"])
    return (
        f"{m.describe()}, a {example['seq_len']}-token request in a {side['layout']} cache of "
        f"{side['num_blocks']} blocks x {side['block_size']}, block ids {side['block_ids']}"
    )


def _strategy(adapter: Adapter) -> st.SearchStrategy[Example]:
    return _paged_examples()


def _pin(
    layout_a: str,
    bs_a: int,
    ids_a: list[int],
    layout_b: str,
    bs_b: int,
    ids_b: list[int],
    seq_len: int,
    blocks: int = 4,
) -> Example:
    model = ModelShape(2, 2, 2)
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
)


@check(
    "PAGED-1",
    "gather",
    "a request is gathered from its blocks, in block-table order",
    needs=("paged",),
    strategy=_strategy,
    examples=PAGED_PINS,
)
def gather(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    side = example["sides"][0]
    cache = _cache(model, side, ctx.device, fill_seed=example["seed"])
    expected = gather_request(cache, side["block_ids"], example["seq_len"])
    got = ctx.adapter.gather(cache, list(side["block_ids"]), example["seq_len"])
    expect(
        tuple(got.data.shape) == tuple(expected.data.shape)
        and torch.equal(bits_view(got.data.contiguous()), bits_view(expected.data)),
        f"{_describe(example, side)}: gathered {list(got.data.shape)} differs from the spec's "
        f"{list(expected.data.shape)} [layers, kv, seq, heads, head_dim] [PAGED-1]",
    )


@check(
    "PAGED-4",
    "scatter-across-block-sizes",
    "a request scattered into another layout and block size lands in its blocks only",
    needs=("paged",),
    strategy=_strategy,
    examples=PAGED_PINS,
)
def scatter(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    seq_len = example["seq_len"]
    request = _oracle(model, "req", seq_len, example["seed"], ctx.device)
    dst = example["sides"][1]
    expected = _cache(model, dst, ctx.device, fill_seed=example["seed"] + 1)
    got = _cache(model, dst, ctx.device, fill_seed=example["seed"] + 1)
    scatter_request(request, expected, dst["block_ids"])
    ctx.adapter.scatter(request, got, list(dst["block_ids"]))
    for i, (want, have) in enumerate(zip(_cache_bits(expected), _cache_bits(got), strict=True)):
        expect(
            torch.equal(want, have),
            f"{_describe(example, dst)}: after scattering, layer {i // model.kv_tensors} "
            f"{'KV'[i % model.kv_tensors] if model.kv_tensors == 2 else 'latent'} differs from "
            f"the spec's in {int((want != have).sum())} element(s) [PAGED-4]",
        )


@st.composite
def _bad_tables(draw: st.DrawFn, *, kind: str) -> Example:
    example = draw(_paged_examples())
    side = example["sides"][0]
    ids, blocks = list(side["block_ids"]), side["num_blocks"]
    if kind == "out-of-range":
        ids[draw(st.integers(0, len(ids) - 1))] = draw(
            st.one_of(st.integers(blocks, blocks + 3), st.integers(-3, -1))
        )
    elif kind == "duplicate":
        if len(ids) < 2:
            side["num_blocks"] = blocks + 1
            example["seq_len"] = side["block_size"] + 1
            ids = [0, 1]
        ids[1] = ids[0]
    elif draw(st.booleans()):  # one block too few
        ids = ids[:-1]
    else:  # one valid, distinct block too many
        spare = [b for b in range(blocks) if b not in ids]
        if not spare:
            side["num_blocks"] = blocks + 1
            spare = [blocks]
        ids = [*ids, spare[0]]
    side["bad_ids"] = ids
    return example


def _refusal_check(clause: str, slug: str, title: str, kind: str, pins: tuple = ()) -> None:
    @check(
        clause,
        slug,
        title,
        needs=("paged",),
        strategy=lambda adapter: _bad_tables(kind=kind),
        examples=pins,
    )
    def run(ctx: Context, example: Example) -> None:
        model = ModelShape.from_dict(example["model"])
        side = example["sides"][0]
        cache = _cache(model, side, ctx.device, fill_seed=example["seed"])
        before = _cache_bits(cache)
        bad = side["bad_ids"]
        if bad == side["block_ids"]:
            return  # the drawn table could not be broken this way (too few blocks)
        try:
            got = ctx.adapter.gather(cache, bad, example["seq_len"])
        except Exception:
            pass
        else:
            fail(
                f"{_describe(example, side)}: gather with block ids {bad} returned "
                f"{list(got.data.shape)} instead of refusing ({title}) [{clause}]"
            )
        request = _oracle(model, "req", example["seq_len"], 1, ctx.device)
        try:
            ctx.adapter.scatter(request, cache, bad)
        except Exception:
            pass
        else:
            fail(
                f"{_describe(example, side)}: scatter into block ids {bad} was accepted [{clause}]"
            )
        changed = [
            i
            for i, (a, b) in enumerate(zip(before, _cache_bits(cache), strict=True))
            if not torch.equal(a, b)
        ]
        expect(
            not changed,
            f"{_describe(example, side)}: a refused scatter into {bad} still "
            f"wrote the cache [{clause}]",
        )


def _bad(example: Example, ids: list[int]) -> Example:
    side = {**example["sides"][0], "bad_ids": ids}
    return {**example, "sides": [side, example["sides"][1]]}


_refusal_check(
    "PAGED-2",
    "refuses-out-of-range",
    "an id out of range is refused, never dropped",
    "out-of-range",
    pins=(_bad(PAGED_PINS[0], [3, 4]), _bad(PAGED_PINS[1], [1, -1, 0])),
)
_refusal_check(
    "PAGED-2",
    "refuses-duplicates",
    "a repeated id is refused",
    "duplicate",
    pins=(_bad(PAGED_PINS[1], [1, 1, 0]),),
)
_refusal_check(
    "PAGED-3",
    "refuses-wrong-count",
    "exactly the blocks seq_len needs",
    "count",
    pins=(_bad(PAGED_PINS[0], [3]),),
)


@check(
    "PAGED-5",
    "fp8-scales",
    "scattering fp8 KV under other scales is refused",
    needs=("paged",),
    strategy=lambda adapter: _paged_examples(dtypes=FP8_DTYPES),
)
def fp8_scales(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    side = example["sides"][1]
    cache = _cache(model, side, ctx.device, fill_seed=None)
    request = oracle_kv(
        model, "req", tokens=example["seq_len"], seed=example["seed"], device=ctx.device
    )
    wrong = RequestKV(request.data, request.scales * 2)  # type: ignore[operator]
    try:
        ctx.adapter.scatter(wrong, cache, list(side["block_ids"]))
    except Exception:
        return
    fail(
        f"{_describe(example, side)}: fp8 KV with scales {wrong.scales.tolist()} was written "
        f"into a cache whose scales are {cache.scales.tolist()} [PAGED-5]"
    )


@st.composite
def _regions(draw: st.DrawFn) -> Example:
    model = draw(models(max_layers=4, max_head_dim=4, max_heads=4))

    def sub(n: int) -> list[int]:
        start = draw(st.integers(0, n - 1))
        return [start, draw(st.integers(start + 1, n))]

    seq_len = draw(st.integers(1, 16))
    return {
        "model": model.to_dict(),
        "request_id": draw(st.text("abc-_0123456789", min_size=1, max_size=8)),
        "tokens": sub(seq_len + 4),
        "layers": sub(model.num_layers),
        "heads": sub(model.num_kv_heads),
        "seed": draw(st.integers(0, 2**31)),
    }


@check(
    "ORACLE-1",
    "fill",
    "the coordinate-hash fill matches the spec bit for bit, for any region",
    needs=("oracle",),
    strategy=lambda adapter: _regions(),
)
def oracle_fill(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    expected = oracle_kv(
        model, example["request_id"], seed=example["seed"], device=ctx.device, **where
    )
    got = ctx.adapter.oracle_fill(model, example["request_id"], seed=example["seed"], **where)
    same = tuple(got.data.shape) == tuple(expected.data.shape) and torch.equal(
        bits_view(got.data.contiguous()), bits_view(expected.data)
    )
    expect(
        same,
        f"{model.describe()}, request {example['request_id']!r}, region {example}: the "
        "fill differs from the coordinate hash [ORACLE-1, ORACLE-4]",
    )
