"""Checks of the rows of bytes a record travels as [LAYOUT-7].

Record layouts are drawn from the adapter's domain, each with a model it can hold
(:mod:`kvspec.conformance.draws.records`); the rows are compared bit for bit with the
spec's and read back field by field, and K and V of a plain layout are never made rows.
"""

from __future__ import annotations

from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws.records import (
    RECORD_PINS,
    no_records,
    record_regions,
    record_setup,
)
from kvspec.memory.records import (
    carrier_model,
    record_fill,
    record_rows,
)
from kvspec.tensors.dtypes import bits_view
from kvspec.topology.model import ModelShape


@check(
    "LAYOUT-7",
    "rows",
    "a record travels as rows of its fields' bytes in record order, read back bit for bit",
    needs=("record-rows",),
    strategy=record_regions,
    examples=RECORD_PINS,
    weight=0.5,
    missing=no_records,
    covers=("LAYOUT-7.1", "LAYOUT-7.2"),
)
def rows_of_bytes(ctx: Context, example: Example) -> None:
    model, layout, where = record_setup(ctx, example)
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
    strategy=lambda adapter: record_regions(adapter).map(
        lambda e: {**e, "layout": "vllm_packed_hnd" if e["layout"].startswith("vllm") else "mla"}
    ),
    examples=({**RECORD_PINS[0], "layout": "flash_attn"}, {**RECORD_PINS[1], "layout": "vllm_mla"}),
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
