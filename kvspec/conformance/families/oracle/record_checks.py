"""Checks of the oracle's fills of record cells: every field by coordinate, its verifier
and the refusal of a model a record cannot hold [ORACLE-6].

Record layouts are drawn from the adapter's domain, each with a model it can hold
(vLLM's per-token-head records: fp8 MHA with a head_dim of a multiple of 4 bytes;
FlashMLA's fp8 record: a 576-wide fp8 latent; :mod:`kvspec.conformance.draws.records`).
Fills are compared bit for bit with the spec's; the verifier is given the oracle's own
fields with bits flipped in any field, inline scales included, and must count every one.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws.records import (
    RECORD_DTYPE,
    RECORD_PINS,
    no_records,
    record_regions,
    record_setup,
)
from kvspec.memory.records import ORACLE_FIELDS, record_fill, verify_fields
from kvspec.tensors.dtypes import FLOAT_FORMATS, bits_view
from kvspec.topology.model import ModelShape


@check(
    "ORACLE-6",
    "fill",
    "every field of a record cell, inline scales included, is the stated coordinate hash",
    needs=("record-oracle",),
    strategy=record_regions,
    examples=RECORD_PINS,
    weight=0.5,
    missing=no_records,
    covers=("ORACLE-6.1", "ORACLE-6.2", "ORACLE-6.3"),
)
def record_fields(ctx: Context, example: Example) -> None:
    model, layout, where = record_setup(ctx, example)
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
    example = draw(record_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    fields = example_layout(example).fields(model.kv_tensors)
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
        {**RECORD_PINS[0], "flips": [["k_scale", 3]]},
        {**RECORD_PINS[1], "flips": [["nope_scale", 1], ["rope", 9]]},
    ),
    weight=0.5,
    missing=no_records,
    covers=("ORACLE-6.4",),
)
def record_verify(ctx: Context, example: Example) -> None:
    model, layout, where = record_setup(ctx, example)
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
    example = draw(record_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    others = [d for d in adapter.domain.model_dtypes() if d != RECORD_DTYPE]
    if example_layout(example).kv_tensors == 1 and (not others or draw(st.booleans())):
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
        {**RECORD_PINS[0], "model": ModelShape(3, 4, 8, dtype="bfloat16").to_dict()},
        {**RECORD_PINS[1], "model": ModelShape.mla(2, 512, dtype=RECORD_DTYPE).to_dict()},
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
