"""Checks of the coordinate-hash oracle: fills, scales, regions and the verifier
[ORACLE-1..5].

Fills are compared bit for bit with the spec's for any region of any model of the
domain; the verifier is given the oracle's own KV with bits flipped at random places
and must count every one of them.
"""

from __future__ import annotations

from typing import cast

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws import no_fp8
from kvspec.tensors.dtypes import FP8_DTYPES, bits_view
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import oracle_kv, oracle_scales, verify
from kvspec.testing.strategies import cp_rules, models
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import CPRule, Tokens


@st.composite
def _regions(
    draw: st.DrawFn, adapter: Adapter, *, dtypes: tuple[str, ...] | None = None
) -> Example:
    domain = adapter.domain
    model = draw(
        models(
            max_layers=4,
            max_head_dim=4,
            max_heads=4,
            dtypes=domain.model_dtypes(dtypes),
            attention=domain.attention,
        )
    )

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
        "seed": draw(st.one_of(st.integers(0, 2**31), st.integers(2**31, 2**40))),
    }


def _model(ctx: Context, example: Example) -> ModelShape:
    model = ModelShape.from_dict(example["model"])
    domain = ctx.adapter.domain
    if model.dtype not in domain.model_dtypes() or model.attention not in domain.attention:
        raise OutsideDomain
    return model


def _where(example: Example) -> dict[str, range]:
    return {k: range(*example[k]) for k in ("tokens", "layers", "heads")}


_PINS = (
    {
        "model": ModelShape(3, 4, 2).to_dict(),
        "request_id": "req-1",
        "tokens": [5, 9],
        "layers": [1, 3],
        "heads": [2, 4],
        "seed": 7,
    },
    {
        "model": ModelShape.mla(2, 3, dtype="float8_e5m2").to_dict(),
        "request_id": "r_2",
        "tokens": [3, 6],
        "layers": [1, 2],
        "heads": [0, 1],
        "seed": 2**33 + 5,
    },
)


@check(
    "ORACLE-1",
    "fill",
    "the coordinate-hash fill matches the spec bit for bit, for any region",
    needs=("oracle",),
    strategy=_regions,
    examples=_PINS,
    covers=("ORACLE-1.1", "ORACLE-2.1", "ORACLE-4.1"),
)
def oracle_fill(ctx: Context, example: Example) -> None:
    model = _model(ctx, example)
    where = _where(example)
    expected = oracle_kv(
        model, example["request_id"], seed=example["seed"], device=ctx.device, **where
    )
    got = ctx.adapter.oracle_fill(model, example["request_id"], seed=example["seed"], **where)
    if tuple(got.data.shape) != tuple(expected.data.shape):
        fail(
            f"{model.describe()}, request {example['request_id']!r}, region {where}: the fill "
            f"is {list(got.data.shape)}, not {list(expected.data.shape)} [ORACLE-4.1]"
        )
    differs = bits_view(got.data.contiguous()) != bits_view(expected.data)
    if not bool(differs.any()):
        return
    layer, kv, token, head, dim = (int(i) for i in differs.nonzero()[0].tolist())
    regional = not all(r.start == 0 for r in where.values())
    fail(
        f"{model.describe()}, request {example['request_id']!r}, seed {example['seed']}, region "
        f"{where}: {int(differs.sum())} element(s) differ from the coordinate hash; the first "
        f"at global layer {where['layers'][layer]}, kv {kv}, head {where['heads'][head]}, token "
        f"{where['tokens'][token]}, dim {dim} [ORACLE-1.1, ORACLE-2.1"
        + (", ORACLE-4.1: every coordinate is global]" if regional else "]")
    )


@st.composite
def _token_sets(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A region whose tokens are a context-parallel rank's token set [CP-1, ORACLE-4]."""
    example = draw(_regions(adapter))
    rule = CPRule.parse(draw(cp_rules()))
    shards = draw(st.integers(2, 4))
    seq_len = draw(st.integers(2 * shards, 4 * shards + 12))
    tokens = Tokens()
    while not tokens:
        tokens = rule.tokens(draw(st.integers(0, shards - 1)), shards, seq_len)
        seq_len += 1
    return {**example, "tokens": tokens.to_list()}


@check(
    "ORACLE-4",
    "token-set",
    "a fill of a token set holds those global tokens in ascending order",
    needs=("oracle",),
    strategy=_token_sets,
    examples=(
        {**_PINS[0], "tokens": [[2, 4], [6, 8], [10, 12]]},
        {**_PINS[1], "tokens": [[1, 2], [5, 7]]},
    ),
    covers=("ORACLE-4.3",),
)
def oracle_token_set(ctx: Context, example: Example) -> None:
    model = _model(ctx, example)
    tokens = Tokens.from_list(example["tokens"])
    where = {"layers": range(*example["layers"]), "heads": range(*example["heads"])}
    expected = oracle_kv(
        model,
        example["request_id"],
        tokens=tokens,
        seed=example["seed"],
        device=ctx.device,
        **where,
    )
    got = ctx.adapter.oracle_fill(
        model, example["request_id"], tokens=tokens, seed=example["seed"], **where
    )
    if tuple(got.data.shape) != tuple(expected.data.shape):
        fail(
            f"{model.describe()}, tokens {tokens.describe()}: the fill is "
            f"{list(got.data.shape)}, not {list(expected.data.shape)} [ORACLE-4.3]"
        )
    differs = bits_view(got.data.contiguous()) != bits_view(expected.data)
    if bool(differs.any()):
        position = int(differs.nonzero()[0][2])
        fail(
            f"{model.describe()}, request {example['request_id']!r}: the fill of token set "
            f"{tokens.describe()} differs at its position {position}, global token "
            f"{tokens.tokens()[position]}; a token set's k-th entry is its k-th token, not "
            f"token k [ORACLE-4.3]"
        )


@check(
    "ORACLE-3",
    "scales",
    "fp8 scales are the stated hash of the seed, layer and kv, the same for every request",
    needs=("oracle", "fp8-scales"),
    strategy=lambda adapter: _regions(adapter, dtypes=FP8_DTYPES),
    examples=_PINS[1:],
    missing=no_fp8,
    covers=("ORACLE-3.1",),
)
def scales(ctx: Context, example: Example) -> None:
    model = _model(ctx, example)
    where = _where(example)
    # An fp8 model's scales (the check draws fp8 dtypes only): a tensor, not None.
    expected = cast(
        torch.Tensor,
        oracle_scales(model, layers=where["layers"], seed=example["seed"], device=ctx.device),
    )
    for request in (example["request_id"], example["request_id"] + "-other"):
        got = ctx.adapter.oracle_fill(model, request, seed=example["seed"], **where).scales
        expect(
            got is not None
            and tuple(got.shape) == tuple(expected.shape)
            and torch.equal(bits_view(got.to(ctx.device)), bits_view(expected)),
            f"{model.describe()}, request {request!r}, seed {example['seed']}, layers "
            f"{where['layers']}: the fill's scales are {None if got is None else got.tolist()}; "
            f"the oracle's are {expected.tolist()} (the same for every request) "
            "[ORACLE-3.1]",
        )


@st.composite
def _outside_regions(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A region one step past the model: a layer or head range reaching past it, or a
    range starting below 0 [ORACLE-4]."""
    example = draw(_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    axis = draw(st.sampled_from(["layers", "heads", "tokens"]))
    limit = {"layers": model.num_layers, "heads": model.num_kv_heads, "tokens": None}[axis]
    if limit is None or draw(st.booleans()):
        example[axis] = [-1, example[axis][1]]
    else:
        example[axis] = [example[axis][0], limit + draw(st.integers(1, 2))]
    return example


@check(
    "ORACLE-4",
    "refuses-outside-model",
    "a layer, head or token range outside the model is refused, never clamped",
    needs=("oracle",),
    strategy=_outside_regions,
    covers=("ORACLE-4.2",),
)
def refuses_outside_model(ctx: Context, example: Example) -> None:
    model = _model(ctx, example)
    where = _where(example)
    expect_refused(
        "ORACLE-4.2",
        f"an oracle fill of {model.describe()} over {where}",
        lambda: ctx.adapter.oracle_fill(
            model, example["request_id"], seed=example["seed"], **where
        ),
    )


@st.composite
def _corruptions(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_regions(adapter))
    model = ModelShape.from_dict(example["model"])
    where = _where(example)
    count = len(where["layers"]) * model.kv_tensors * len(where["tokens"]) * len(where["heads"])
    count *= model.head_dim
    flips = draw(st.lists(st.integers(0, count - 1), max_size=4, unique=True))
    bits = draw(st.lists(st.integers(0, 7), min_size=len(flips), max_size=len(flips)))
    fp8 = model.dtype in FP8_DTYPES
    scale = draw(st.sampled_from([None, [0, 0]])) if fp8 else None
    shape = draw(st.sampled_from([None, None, None, None, "token-short", "dtype"]))
    return {**example, "flips": flips, "bits": bits, "scale": scale, "shape_change": shape}


@check(
    "ORACLE-5",
    "verify",
    "the verifier counts every flipped bit and scale; KV of another shape is refused",
    needs=("verifier",),
    strategy=_corruptions,
    examples=(
        {**_PINS[0], "flips": [0, 5], "bits": [0, 1], "scale": None, "shape_change": None},
        {**_PINS[1], "flips": [], "bits": [], "scale": [0, 0], "shape_change": None},
        {**_PINS[0], "flips": [], "bits": [], "scale": None, "shape_change": "token-short"},
    ),
    covers=("ORACLE-5.1", "ORACLE-5.2", "ORACLE-5.3"),
)
def verifies(ctx: Context, example: Example) -> None:
    model = _model(ctx, example)
    where = _where(example)
    seed, request = example["seed"], example["request_id"]
    kv = oracle_kv(model, request, seed=seed, device=ctx.device, **where)
    data, kv_scales = kv.data.clone(), None if kv.scales is None else kv.scales.clone()
    flat = bits_view(data).view(-1)
    for index, bit in zip(example["flips"], example["bits"], strict=True):
        flat[index] ^= 1 << bit
    if example["scale"] is not None and kv_scales is not None:
        kv_scales[tuple(example["scale"])] *= 2
    change = example["shape_change"]
    if change == "token-short" and data.shape[2] > 1:
        bad = RequestKV(data[:, :, :-1], kv_scales)
        what = "KV one token short of the range"
    elif change == "dtype":
        other = torch.float32 if data.dtype != torch.float32 else torch.float16
        bad = RequestKV(data.to(other), None)
        what = f"{other} KV for a {model.dtype} model"
    else:
        bad = None
    if bad is not None:
        expect_refused(
            "ORACLE-5.3",
            f"verifying {what} ({list(bad.data.shape)}, {model.describe()}, region {where})",
            lambda: ctx.adapter.oracle_verify(bad, model, request, seed=seed, **where),
        )
        return
    given = RequestKV(data, kv_scales)
    verdict = verify(given, model, request, seed=seed, **where)
    want = verdict.mismatches + verdict.scale_mismatches
    got = ctx.adapter.oracle_verify(given, model, request, seed=seed, **where)
    scales_only = verdict.mismatches == 0 and verdict.scale_mismatches > 0
    expect(
        got == want,
        f"{model.describe()}, region {where}: the KV has {verdict.mismatches} element(s) and "
        f"{verdict.scale_mismatches} scale(s) that differ from the oracle (bits flipped at "
        f"flat indices {example['flips']}); the verifier counted {got} "
        f"[{'ORACLE-5.2' if scales_only else 'ORACLE-5.1'}]",
    )
