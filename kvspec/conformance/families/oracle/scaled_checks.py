"""Checks of the oracle's fp4 and e8m0 values in block-scaled cells [ORACLE-8].

Regions of the adapter's block-scaled layouts (vLLM's NVFP4 pages, SGLang's MXFP8 pool),
each with a head_dim it holds (:mod:`kvspec.conformance.draws.records`), are filled by
the implementation and compared byte for byte with the spec's.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, fail
from kvspec.conformance.draws.records import (
    draw_region,
    no_scaled,
    scaled_dtype,
    scaled_geometry,
)
from kvspec.memory.records import ORACLE_FIELDS, record_fill
from kvspec.tensors.dtypes import bits_view
from kvspec.tensors.scaled_oracle import E8M0, FOUR_BIT, unpack_fp4
from kvspec.topology.model import ModelShape


@st.composite
def _scaled_regions(draw: st.DrawFn, adapter: Adapter) -> Example:
    layout = draw(st.sampled_from(adapter.domain.scaled_layouts()))
    head_dims, _ = scaled_geometry(adapter.domain.layout(layout))
    model = ModelShape(
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from(head_dims)),
        dtype=scaled_dtype(adapter, layout),
    )

    return draw_region(draw, layout, model, st.integers(0, 2**33))


def _fp4_rule(name: str, want: torch.Tensor, have: torch.Tensor) -> str:
    """Which ORACLE-8 obligation a wrong packed fp4 field breaks."""
    codes = unpack_fp4(have)
    if bool(((codes & 7) == 0).any()):
        return "ORACLE-8.1: no fp4 value is +0 or -0"
    swapped = (have >> 4) | ((have & 15) << 4)
    if bool(torch.equal(swapped, want)):
        return "ORACLE-8.2: value 2i is the low nibble, 2i + 1 the high"
    if name in ORACLE_FIELDS:
        return "ORACLE-8.3: an fp4 k or v holds ORACLE-1's hashes of the cell"
    return "ORACLE-8.1"


@check(
    "ORACLE-8",
    "fill",
    "every fp4 and e8m0 field of a block-scaled cell is the stated value of its hash, fp4 "
    "values two a byte",
    needs=("record-oracle",),
    strategy=_scaled_regions,
    examples=(
        {
            "layout": "vllm_nvfp4_hnd",
            "model": ModelShape(2, 3, 64, dtype="bfloat16").to_dict(),
            "request_id": "req-4",
            "tokens": [3, 9],
            "layers": [0, 2],
            "heads": [1, 3],
            "seed": 11,
        },
        {
            "layout": "sglang_mxfp8",
            "model": ModelShape(2, 2, 64, dtype="float8_e4m3fn").to_dict(),
            "request_id": "r_8",
            "tokens": [120, 133],
            "layers": [1, 2],
            "heads": [0, 2],
            "seed": 2**32 + 3,
        },
    ),
    missing=no_scaled,
    covers=("ORACLE-8.1", "ORACLE-8.2", "ORACLE-8.3"),
)
def scaled_fill(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    layout = example["layout"]
    if layout not in ctx.adapter.domain.scaled_layouts():
        raise OutsideDomain
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    request, seed = example["request_id"], example["seed"]
    expected = record_fill(model, layout, request, seed=seed, device=ctx.device, **where)
    got = ctx.adapter.record_fill(model, layout, request, seed=seed, **where)
    what = f"{layout} of {model.describe()}, request {request!r}, seed {seed}, region {where}"
    expect(
        set(got) == set(expected),
        f"{what}: the fill has fields {sorted(got)}, a cell has {sorted(expected)} [ORACLE-8.3]",
    )
    spec = ctx.adapter.domain.layout(layout)
    for f in spec.fields(model.kv_tensors):
        want, have = expected[f.name], got[f.name]
        dtype, _ = f.resolve(model.dtype, model.head_dim)
        if tuple(have.shape) != tuple(want.shape) or have.element_size() != want.element_size():
            fail(
                f"{what}: field {f.name} is {have.dtype} {list(have.shape)}, not "
                f"{dtype} stored as {want.dtype} {list(want.shape)} [ORACLE-8.2]"
            )
        a = bits_view(want.contiguous())
        b = bits_view(have.contiguous().to(want.device))
        if bool(torch.equal(a, b)):
            continue
        if dtype == FOUR_BIT:
            rule = _fp4_rule(f.name, a, b)
        elif dtype == E8M0:
            rule = "ORACLE-8.1: an e8m0 value's byte is 123 + ((h >> 1) & 7)"
        else:
            continue  # ORACLE-6's fields: its own checks judge them
        layer, token, head, index = (int(i) for i in (a != b).nonzero()[0].tolist())
        fail(
            f"{what}: {int((a != b).sum())} byte(s) of field {f.name} ({dtype}) differ from the "
            f"oracle's; the first at global layer {where['layers'][layer]}, head "
            f"{where['heads'][head]}, token {where['tokens'][token]}, byte {index}: expected "
            f"0x{int(a[layer, token, head, index]) & 0xFF:02x}, got "
            f"0x{int(b[layer, token, head, index]) & 0xFF:02x} [{rule}]"
        )
