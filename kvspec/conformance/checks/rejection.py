"""Checks that invalid transfer configurations are refused and valid ones accepted.

Each check draws configurations that break one rule (as plain data, the form
:meth:`~kvspec.conformance.adapter.Adapter.validate` receives) and pins the
matching ``transfer`` cases of :data:`kvspec.error_cases.ERROR_CASES`. Any exception
counts as a refusal; the suite does not judge the wording, only that nothing is
accepted silently [PLAN-1, HEAD-1, HEAD-2, MODEL-1..3, DTYPE-1, STAGE-1, LAYER-1..2].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, within_domain
from kvspec.conformance.checks.routing import case_examples
from kvspec.dtypes import DTYPES
from kvspec.error_cases import ERROR_CASES, OPERATIONS
from kvspec.model import ModelShape
from kvspec.strategies import TP_SIZES, TransferCase


def _pins(clause: str) -> tuple[Example, ...]:
    return tuple(c.args for c in ERROR_CASES if c.op == "transfer" and c.clause == clause)


def _mha(num_layers: int = 4, heads: int = 4, head_dim: int = 8, **extra: Any) -> dict[str, Any]:
    return {**ModelShape(num_layers, heads, head_dim).to_dict(), **extra}


def _config(source_tp: int, target_tp: int, model: dict[str, Any], **extra: Any) -> Example:
    return {"source": {"tp": source_tp}, "target": {"tp": target_tp}, "model": model, **extra}


@st.composite
def _non_dividing_tp(draw: st.DrawFn) -> Example:
    source = draw(st.integers(2, 24))
    target = draw(st.integers(2, 24).filter(lambda t: source % t and t % source))
    heads = math.lcm(source, target) * draw(st.integers(1, 2))
    return _config(source, target, _mha(heads=heads))


@st.composite
def _uneven_split(draw: st.DrawFn) -> Example:
    tp = draw(st.sampled_from([t for t in TP_SIZES if t > 1]))
    heads = draw(st.integers(tp + 1, 4 * tp).filter(lambda h: h % tp))
    return _config(tp, tp, _mha(heads=heads))


@st.composite
def _uneven_replication(draw: st.DrawFn) -> Example:
    tp = draw(st.integers(3, 24))
    heads = draw(st.integers(2, tp - 1).filter(lambda h: tp % h))
    return _config(tp, tp, _mha(heads=heads))


@st.composite
def _mismatched_models(draw: st.DrawFn) -> Example:
    base = ModelShape.from_dict(draw(case_examples(_ANY))["model"])
    changed = draw(
        st.sets(st.sampled_from(["num_layers", "num_kv_heads", "head_dim", "dtype"]), min_size=1)
    )
    other = base.to_dict()
    if "num_layers" in changed:
        other["num_layers"] = base.num_layers + draw(st.integers(1, 3))
    if "head_dim" in changed:
        other["head_dim"] = base.head_dim + draw(st.integers(1, 3))
    if "num_kv_heads" in changed and base.attention == "mha":
        other["num_kv_heads"] = base.num_kv_heads * 2
    if "dtype" in changed or other == base.to_dict():
        other["dtype"] = draw(st.sampled_from([d for d in DTYPES if d != base.dtype]))
        other["scale_format"] = None
    other = ModelShape.from_dict(other).to_dict()  # fills the fp8 scale format
    return {**_config(1, 1, base.to_dict()), "target_model": other}


@st.composite
def _rank_out_of_range(draw: st.DrawFn) -> Example:
    config = draw(case_examples(_ANY))
    side = draw(st.sampled_from(["source", "target"]))
    layout = config[side]
    size = layout["tp"] * layout["pp"]
    rank = draw(st.one_of(st.integers(size, size + 8), st.integers(-4, -1)))
    return {**config, "rank": {"side": side, "rank": rank}}


@st.composite
def _fewer_layers_than_pp(draw: st.DrawFn) -> Example:
    pp = draw(st.integers(2, 8))
    config = _config(1, 1, _mha(num_layers=draw(st.integers(1, pp - 1))))
    config[draw(st.sampled_from(["source", "target"]))]["pp"] = pp
    return config


@st.composite
def _bad_partition(draw: st.DrawFn) -> Example:
    num_layers = draw(st.integers(2, 32))
    counts = draw(st.lists(st.integers(1, 16), min_size=2, max_size=4))
    if sum(counts) == num_layers:
        counts[0] += 1
    config = _config(1, 1, _mha(num_layers=num_layers))
    config["source"] = {"tp": 1, "pp": len(counts), "layer_partition": counts}
    return config


@st.composite
def _bad_model(draw: st.DrawFn) -> Example:
    model = _mha()
    field = draw(st.sampled_from(["num_layers", "num_kv_heads", "head_dim", "attention"]))
    model[field] = "sparse" if field == "attention" else draw(st.integers(-2, 0))
    return _config(1, 1, model)


_ANY = Adapter()


def _refusal_check(
    clause: str, slug: str, title: str, strategy: Callable[[], st.SearchStrategy[Example]]
) -> None:
    @check(
        clause,
        slug,
        title,
        needs=("rejection",),
        strategy=lambda adapter: strategy(),
        examples=_pins(clause),
    )
    def run(ctx: Context, config: Example) -> None:
        try:
            ctx.adapter.validate(config)
        except Exception:
            return
        expect(False, f"configuration {config} was accepted; it breaks [{clause}] ({title})")


_refusal_check("PLAN-1", "refuses-non-dividing-tp", "TP sizes must divide", _non_dividing_tp)
_refusal_check("HEAD-1", "refuses-uneven-split", "H >= tp needs H % tp == 0", _uneven_split)
_refusal_check(
    "HEAD-2", "refuses-uneven-replication", "H < tp needs tp % H == 0", _uneven_replication
)
_refusal_check(
    "MODEL-3", "refuses-mismatched-models", "stages must agree on the model", _mismatched_models
)
_refusal_check("STAGE-1", "refuses-rank-out-of-range", "ranks are 0..tp*pp-1", _rank_out_of_range)
_refusal_check("LAYER-1", "refuses-fewer-layers-than-pp", "n >= pp", _fewer_layers_than_pp)
_refusal_check("LAYER-2", "refuses-bad-partition", "partitions sum to n", _bad_partition)
_refusal_check(
    "DTYPE-1",
    "refuses-unknown-dtype",
    "only the allowed dtypes",
    lambda: st.sampled_from(["int8", "float64", "uint8", "float8_e4m3fnuz", "bool"]).map(
        lambda d: _config(1, 1, _mha(dtype=d))
    ),
)
_refusal_check("MODEL-1", "refuses-invalid-model", "positive sizes, known kinds", _bad_model)
_refusal_check(
    "MODEL-2",
    "refuses-mla-with-heads",
    "MLA has one latent",
    lambda: st.integers(2, 64).map(lambda h: _config(1, 1, _mha(heads=h, attention="mla"))),
)


@check(
    "PLAN-1",
    "accepts-valid",
    "every valid configuration is accepted",
    needs=("rejection",),
    strategy=lambda adapter: case_examples(adapter),
)
def accepts_valid(ctx: Context, config: Example) -> None:
    OPERATIONS["transfer"](config)  # the reference accepts it
    within_domain(ctx, TransferCase.from_dict(config))
    try:
        ctx.adapter.validate(config)
    except Exception as error:
        expect(False, f"valid configuration {config} was refused: {error!r} [PLAN-1]")
