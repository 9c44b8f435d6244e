"""Checks of record caches: every field of a record cell by coordinate, its verifier
[ORACLE-6], and the rows of bytes a record travels as [LAYOUT-7].

Record layouts are drawn from the adapter's domain, each with a model it can hold
(vLLM's per-token-head records: fp8 MHA with a head_dim of a multiple of 4 bytes;
FlashMLA's fp8 record: a 576-wide fp8 latent). Fills are compared bit for bit with the
spec's; the verifier is given the oracle's own fields with bits flipped in any field,
inline scales included, and must count every one.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.memory.cache_layout import get_layout
from kvspec.memory.records import (
    ORACLE_FIELDS,
    carrier_model,
    record_fill,
    record_rows,
    verify_fields,
)
from kvspec.tensors.dtypes import FLOAT_FORMATS, bits_view
from kvspec.topology.model import ModelShape

RECORD_DTYPE = "float8_e4m3fn"
"""The cache dtype every record preset holds [LAYOUT-6]."""


def _holdable(adapter: Adapter) -> tuple[str, ...]:
    """The domain's record layouts that hold a model of the domain."""
    domain = adapter.domain
    if RECORD_DTYPE not in domain.model_dtypes():
        return ()
    kinds = {1: "mla", 2: "mha"}
    return tuple(
        n
        for n in domain.record_layouts()
        if not get_layout(n).cross_layer
        and kinds[get_layout(n).kv_tensors or 2] in domain.attention
    )


def no_records(adapter: Adapter) -> str | None:
    if _holdable(adapter):
        return None
    return "the adapter's domain has no record layout with a model it holds (fp8 e4m3)"


def _model_for(layout: str, layers: int, heads: int, width: int) -> ModelShape:
    """A model ``layout`` holds: FlashMLA's 576-wide latent, or fp8 MHA of head_dim a
    multiple of 4 (each inline scale stays aligned) [LAYOUT-6]."""
    spec = get_layout(layout)
    if spec.kv_tensors == 1:
        return ModelShape.mla(layers, spec.fixed_head_dim or 4 * width, dtype=RECORD_DTYPE)
    return ModelShape(layers, heads, 4 * width, dtype=RECORD_DTYPE)


@st.composite
def _record_regions(draw: st.DrawFn, adapter: Adapter) -> Example:
    layout = draw(st.sampled_from(_holdable(adapter)))
    model = _model_for(
        layout, draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    )

    return draw_region(
        draw, layout, model, st.one_of(st.integers(0, 2**31), st.integers(2**31, 2**40))
    )


def draw_region(
    draw: st.DrawFn, layout: str, model: ModelShape, seeds: st.SearchStrategy[int]
) -> Example:
    """A region of one request of ``model`` in ``layout``: a request id, a seed drawn from
    ``seeds`` and a non-empty range of tokens, layers and heads [ORACLE-4, ORACLE-6]."""

    def sub(n: int) -> list[int]:
        start = draw(st.integers(0, n - 1))
        return [start, draw(st.integers(start + 1, n))]

    return {
        "layout": layout,
        "model": model.to_dict(),
        "request_id": draw(st.text("abc-_0123456789", min_size=1, max_size=8)),
        "tokens": sub(draw(st.integers(1, 8)) + 4),
        "layers": sub(model.num_layers),
        "heads": sub(model.num_kv_heads),
        "seed": draw(seeds),
    }


_PINS: tuple[Example, ...] = (
    {
        "layout": "vllm_pth_hnd",
        "model": ModelShape(3, 4, 8, dtype=RECORD_DTYPE).to_dict(),
        "request_id": "req-1",
        "tokens": [5, 9],
        "layers": [1, 3],
        "heads": [2, 4],
        "seed": 7,
    },
    {
        "layout": "flashmla_fp8",
        "model": ModelShape.mla(2, 576, dtype=RECORD_DTYPE).to_dict(),
        "request_id": "r_2",
        "tokens": [3, 6],
        "layers": [1, 2],
        "heads": [0, 1],
        "seed": 2**33 + 5,
    },
)


def _setup(ctx: Context, example: Example) -> tuple[ModelShape, str, dict[str, range]]:
    model = ModelShape.from_dict(example["model"])
    if example["layout"] not in _holdable(ctx.adapter):
        raise OutsideDomain
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    return model, example["layout"], where


@check(
    "ORACLE-6",
    "fill",
    "every field of a record cell, inline scales included, is the stated coordinate hash",
    needs=("record-oracle",),
    strategy=_record_regions,
    examples=_PINS,
    weight=0.5,
    missing=no_records,
    covers=("ORACLE-6.1", "ORACLE-6.2", "ORACLE-6.3"),
)
def record_fields(ctx: Context, example: Example) -> None:
    model, layout, where = _setup(ctx, example)
    request, seed = example["request_id"], example["seed"]
    expected = record_fill(model, layout, request, seed=seed, device=ctx.device, **where)
    got = ctx.adapter.record_fill(model, layout, request, seed=seed, **where)
    what = f"{layout} of {model.describe()}, request {request!r}, seed {seed}, region {where}"
    expect(
        set(got) == set(expected),
        f"{what}: the fill has fields {sorted(got)}, a cell has {sorted(expected)} [ORACLE-6.2]",
    )
    for name, want in expected.items():
        have = got[name]
        if tuple(have.shape) != tuple(want.shape) or have.dtype != want.dtype:
            fail(
                f"{what}: field {name} is {have.dtype} {list(have.shape)}, not {want.dtype} "
                f"{list(want.shape)} ([layers, tokens, heads, width]) [ORACLE-6.2]"
            )
        differs = bits_view(have.contiguous().to(want.device)) != bits_view(want)
        if not bool(differs.any()):
            continue
        layer, token, head, index = (int(i) for i in differs.nonzero()[0].tolist())
        sign = 1 << (FLOAT_FORMATS[str(want.dtype).removeprefix("torch.")].bits - 1)
        bits = int(bits_view(have.contiguous())[layer, token, head, index]) & (2 * sign - 1)
        if name in ORACLE_FIELDS:
            rule = "ORACLE-6.1: it is ORACLE-1's element of the cell"
        elif name.endswith("scale") and bits & sign:
            rule = "ORACLE-6.3: an inline scale is positive"
        else:
            rule = "ORACLE-6.2"
        fail(
            f"{what}: {int(differs.sum())} element(s) of field {name} differ from the "
            f"coordinate hash; the first at global layer {where['layers'][layer]}, head "
            f"{where['heads'][head]}, token {where['tokens'][token]}, index {index} (got bits "
            f"0x{bits:x}) [{rule}]"
        )


@st.composite
def _record_corruptions(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_record_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    fields = get_layout(example["layout"]).fields(model.kv_tensors)
    flips = draw(
        st.lists(
            st.tuples(st.sampled_from([f.name for f in fields]), st.integers(0, 2**20)),
            max_size=4,
        )
    )
    return {**example, "flips": [list(f) for f in flips]}


@check(
    "ORACLE-6",
    "verify",
    "the record verifier counts every flipped bit of every field, inline scales included",
    needs=("record-oracle",),
    strategy=_record_corruptions,
    examples=(
        {**_PINS[0], "flips": [["k_scale", 3]]},
        {**_PINS[1], "flips": [["nope_scale", 1], ["rope", 9]]},
    ),
    weight=0.5,
    missing=no_records,
    covers=("ORACLE-6.4",),
)
def record_verify(ctx: Context, example: Example) -> None:
    model, layout, where = _setup(ctx, example)
    request, seed = example["request_id"], example["seed"]
    fields = {
        name: tensor.clone()
        for name, tensor in record_fill(
            model, layout, request, seed=seed, device=ctx.device, **where
        ).items()
    }
    for name, at in example["flips"]:
        flat = bits_view(fields[name]).view(-1)
        flat[at % flat.numel()] ^= 1 << (at % 7)
    want = verify_fields(fields, model, layout, request, seed=seed, **where).mismatches
    got = ctx.adapter.record_verify(fields, model, layout, request, seed=seed, **where)
    expect(
        got == want,
        f"{layout} of {model.describe()}, region {where}: {want} element(s) differ from the "
        f"oracle (bits flipped in {[n for n, _ in example['flips']]}); the verifier counted "
        f"{got} [ORACLE-6.4]",
    )


@st.composite
def _unholdable(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A record layout with a model it cannot hold: another dtype, or another width."""
    example = draw(_record_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    others = [d for d in adapter.domain.model_dtypes() if d != RECORD_DTYPE]
    if get_layout(example["layout"]).kv_tensors == 1 and (not others or draw(st.booleans())):
        model = ModelShape.mla(model.num_layers, draw(st.sampled_from([64, 512])), RECORD_DTYPE)
    elif others:
        dtype = draw(st.sampled_from(others))
        model = ModelShape(
            model.num_layers, model.num_kv_heads, model.head_dim, model.attention, dtype
        )
    else:
        model = ModelShape(model.num_layers, 1, 8, dtype=RECORD_DTYPE)
        example["layout"] = "flashmla_fp8"
    return {**example, "model": model.to_dict(), "heads": [0, 1], "layers": [0, 1]}


@check(
    "ORACLE-6",
    "refuses-unholdable",
    "a record layout that cannot hold the model (dtype, width, K/V count) is refused",
    needs=("record-oracle",),
    strategy=_unholdable,
    examples=(
        {**_PINS[0], "model": ModelShape(3, 4, 8, dtype="bfloat16").to_dict()},
        {**_PINS[1], "model": ModelShape.mla(2, 512, dtype=RECORD_DTYPE).to_dict()},
    ),
    weight=0.5,
    missing=no_records,
    covers=("ORACLE-6.5",),
)
def refuses_unholdable(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    layout = example["layout"]
    if layout not in ctx.adapter.domain.record_layouts() or model.dtype not in (
        ctx.adapter.domain.model_dtypes()
    ):
        raise OutsideDomain
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    expect_refused(
        "ORACLE-6.5",
        f"a {layout} fill of {model.describe()}",
        lambda: ctx.adapter.record_fill(
            model, layout, example["request_id"], seed=example["seed"], **where
        ),
    )


@check(
    "LAYOUT-7",
    "rows",
    "a record travels as rows of its fields' bytes in record order, read back bit for bit",
    needs=("record-rows",),
    strategy=_record_regions,
    examples=_PINS,
    weight=0.5,
    missing=no_records,
    covers=("LAYOUT-7.1", "LAYOUT-7.2"),
)
def rows_of_bytes(ctx: Context, example: Example) -> None:
    model, layout, where = _setup(ctx, example)
    fields = record_fill(
        model, layout, example["request_id"], seed=example["seed"], device=ctx.device, **where
    )
    want = record_rows(fields, model, layout)
    what = f"{layout} rows of {model.describe()} ({carrier_model(model, layout).head_dim} bytes)"
    got = ctx.adapter.record_rows(fields, model, layout)
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        fail(
            f"{what}: the rows are {got.dtype} {list(got.shape)}, not {want.dtype} "
            f"{list(want.shape)} ([layers, kv, seq, heads, row bytes]) [LAYOUT-7.1]"
        )
    differs = bits_view(got.contiguous().to(want.device)) != bits_view(want)
    if bool(differs.any()):
        layer, kv, token, head, byte = (int(i) for i in differs.nonzero()[0].tolist())
        fail(
            f"{what}: {int(differs.sum())} byte(s) of the rows differ from the record's bytes "
            f"in record order; the first at layer {layer}, {'KV'[kv]} row, token {token}, head "
            f"{head}, byte {byte} of the row [LAYOUT-7.1]"
        )
    back = ctx.adapter.record_fields(want, model, layout)
    for name, field in fields.items():
        have = back.get(name)
        expect(
            have is not None
            and tuple(have.shape) == tuple(field.shape)
            and have.dtype == field.dtype
            and bool((bits_view(have.contiguous().to(field.device)) == bits_view(field)).all()),
            f"{what}: field {name} read back from the rows is "
            f"{None if have is None else (have.dtype, list(have.shape))}, not the field that "
            f"was written ({field.dtype} {list(field.shape)}) bit for bit [LAYOUT-7.2]",
        )


@check(
    "LAYOUT-7",
    "refuses-plain",
    "K and V of a layout without a record travel as themselves: no rows are made of them",
    needs=("record-rows",),
    strategy=lambda adapter: _record_regions(adapter).map(
        lambda e: {**e, "layout": "vllm_packed_hnd" if e["layout"].startswith("vllm") else "mla"}
    ),
    examples=({**_PINS[0], "layout": "flash_attn"}, {**_PINS[1], "layout": "vllm_mla"}),
    weight=0.5,
    missing=no_records,
    covers=("LAYOUT-7.3",),
)
def refuses_plain(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    layout = example["layout"]
    if layout not in ctx.adapter.domain.layouts:
        raise OutsideDomain
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    fields = record_fill(
        model, layout, example["request_id"], seed=example["seed"], device=ctx.device, **where
    )
    expect_refused(
        "LAYOUT-7.3",
        f"rows of a {layout} cache of {model.describe()} (its cells hold {sorted(fields)})",
        lambda: ctx.adapter.record_rows(fields, model, layout),
    )
