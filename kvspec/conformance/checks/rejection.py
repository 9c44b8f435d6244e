"""Checks that invalid transfer configurations are refused and valid ones accepted.

Two capabilities, as connectors have them: ``topology`` (``validate_topology``:
ranks, TP pairs, head counts over TP, pipeline partitions [STAGE-1, PLAN-1, HEAD-1,
HEAD-2, LAYER-1, LAYER-2]) and ``models`` (``validate_model``: model facts, dtypes,
and the agreement of the two stages [MODEL-1..3, DTYPE-1]).

Every refusal check starts from a valid configuration inside the adapter's domain and
changes one fact to step just outside the spec's domain — off by one, negative, of
another type or kind — and pins the matching ``transfer`` cases of
:data:`kvspec.error_cases.ERROR_CASES`. Any exception counts as a refusal: the suite
judges that nothing is accepted silently, not the wording.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import (
    Context,
    Example,
    OutsideDomain,
    check,
    expect,
    within_domain,
)
from kvspec.conformance.checks.routing import case_examples
from kvspec.dtypes import DTYPES, FP8_DTYPES
from kvspec.error_cases import ERROR_CASES, OPERATIONS
from kvspec.model import ModelShape
from kvspec.strategies import TransferCase


def _pins(clause: str) -> tuple[Example, ...]:
    return tuple(c.args for c in ERROR_CASES if c.op == "transfer" and c.clause == clause)


def _mha(num_layers: int = 4, heads: int = 4, head_dim: int = 8, **extra: Any) -> dict[str, Any]:
    return {**ModelShape(num_layers, heads, head_dim).to_dict(), **extra}


def _config(source_tp: int, target_tp: int, model: dict[str, Any], **extra: Any) -> Example:
    return {
        "source": {"tp": source_tp, "pp": 1, "layer_partition": None},
        "target": {"tp": target_tp, "pp": 1, "layer_partition": None},
        "model": model,
        **extra,
    }


def _valid(adapter: Adapter) -> st.SearchStrategy[Example]:
    """Valid configurations of the adapter's domain (``policy`` dropped: routing's concern)."""
    return case_examples(adapter).map(lambda e: {k: v for k, v in e.items() if k != "policy"})


# -- transfer topology ---------------------------------------------------------------------


@st.composite
def _non_dividing_tp(draw: st.DrawFn, adapter: Adapter) -> Example:
    sizes = sorted({t for pair in adapter.domain.pairs() for t in pair} | {2, 3})
    source = draw(st.sampled_from(sizes))
    target = draw(st.integers(2, 24).filter(lambda t: source % t and t % source))
    heads = math.lcm(source, target) * draw(st.integers(1, 2))  # valid for both sides
    return _config(source, target, _mha(heads=heads))


@st.composite
def _uneven_split(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 1))
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 1]))
    tp = config[side]["tp"]
    heads = draw(st.integers(tp + 1, 4 * tp).filter(lambda h: h % tp))
    config["model"] = _mha(num_layers=config["model"]["num_layers"], heads=heads)
    return config


@st.composite
def _uneven_replication(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 2))
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 2]))
    tp = config[side]["tp"]
    heads = draw(st.integers(2, tp - 1).filter(lambda h: tp % h))
    config["model"] = _mha(num_layers=config["model"]["num_layers"], heads=heads)
    return config


@st.composite
def _rank_out_of_range(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    layout = config[side]
    size = layout["tp"] * layout["pp"]
    rank = draw(st.sampled_from([size, size + 1, -1, size * 2, -size]))
    return {**config, "rank": {"side": side, "rank": rank}}


@st.composite
def _empty_stage(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    field = draw(st.sampled_from(["tp", "pp"]))
    config[side] = {**config[side], field: draw(st.sampled_from([0, -1])), "layer_partition": None}
    return config


@st.composite
def _fewer_layers_than_pp(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    layers = config["model"]["num_layers"]
    config[side] = {**config[side], "pp": layers + draw(st.integers(1, 2)), "layer_partition": None}
    return config


@st.composite
def _bad_partition(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid explicit partition with one defect: a sum off by one, a count below 1, or one
    entry more or less than pp [LAYER-2]."""
    config = draw(_valid(adapter))
    layers = max(config["model"]["num_layers"], 4)
    config["model"] = {**config["model"], "num_layers": layers}
    config["source"] = {**config["source"], "layer_partition": None}
    config["target"] = {**config["target"], "layer_partition": None}
    side = draw(st.sampled_from(["source", "target"]))
    pp = draw(st.integers(2, min(4, layers - 1)))
    counts = _split(layers, pp)
    defect = draw(st.sampled_from(["sum", "zero", "negative", "length"]))
    if defect == "sum":
        counts[draw(st.integers(0, pp - 1))] += draw(st.sampled_from([1, -1]))
        if min(counts) < 1:
            counts = [c + 1 for c in counts]
    elif defect in ("zero", "negative"):
        i = draw(st.integers(0, pp - 1))
        moved = counts[i] - (0 if defect == "zero" else -1)
        counts[i] -= moved
        counts[(i + 1) % pp] += moved
    else:  # one entry more or less, still summing to num_layers
        counts = _split(layers, pp + 1 if draw(st.booleans()) else pp - 1)
    config[side] = {"tp": config[side]["tp"], "pp": pp, "layer_partition": counts}
    return config


def _split(layers: int, parts: int) -> list[int]:
    """``layers`` as ``parts`` positive counts."""
    counts = [layers // parts] * parts
    counts[-1] += layers - sum(counts)
    return counts


_ANY = Adapter()


def _refusal_check(
    clause: str,
    slug: str,
    title: str,
    covers: tuple[str, ...],
    strategy: Callable[[Adapter], st.SearchStrategy[Example]],
    *,
    method: str = "validate_topology",
    missing: Callable[[Adapter], str | None] | None = None,
    pins: tuple[Example, ...] | None = None,
) -> None:
    @check(
        clause,
        slug,
        title,
        needs=("topology" if method == "validate_topology" else "models",),
        strategy=strategy,
        examples=_pins(clause) if pins is None else pins,
        missing=missing,
        covers=covers,
    )
    def run(ctx: Context, config: Example) -> None:
        try:
            getattr(ctx.adapter, method)(copy.deepcopy(config))
        except Exception:
            return
        expect(
            False,
            f"configuration {config} was accepted; it breaks {title} [{', '.join(covers)}]",
        )


def _needs_pipeline(adapter: Adapter) -> str | None:
    return None if max(adapter.domain.pp_sizes) > 1 else "the adapter's domain has no PP"


_refusal_check(
    "PLAN-1",
    "refuses-non-dividing-tp",
    "TP sizes must divide",
    ("PLAN-1.1",),
    _non_dividing_tp,
)
_refusal_check(
    "HEAD-1",
    "refuses-uneven-split",
    "H >= tp needs H % tp == 0",
    ("HEAD-1.2",),
    _uneven_split,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 1 else "only TP1",
)
_refusal_check(
    "HEAD-2",
    "refuses-uneven-replication",
    "H < tp needs tp % H == 0",
    ("HEAD-2.2",),
    _uneven_replication,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 2 else "no TP above 2",
)
_refusal_check(
    "STAGE-1",
    "refuses-rank-out-of-range",
    "ranks are 0..tp*pp-1",
    ("STAGE-1.2",),
    _rank_out_of_range,
)
_refusal_check(
    "STAGE-1",
    "refuses-empty-stage",
    "tp >= 1 and pp >= 1",
    ("STAGE-1.3",),
    _empty_stage,
    pins=(),
)
_refusal_check(
    "LAYER-1",
    "refuses-fewer-layers-than-pp",
    "n >= pp",
    ("LAYER-1.2",),
    _fewer_layers_than_pp,
    missing=_needs_pipeline,
)
_refusal_check(
    "LAYER-2",
    "refuses-bad-partition",
    "one positive count per PP rank, summing to n",
    ("LAYER-2.2", "LAYER-2.3", "LAYER-2.4"),
    _bad_partition,
    missing=lambda a: (
        None
        if max(a.domain.pp_sizes) > 1 and a.domain.explicit_partitions
        else "the adapter's domain has no explicit layer partitions"
    ),
)


@check(
    "PLAN-1",
    "accepts-valid",
    "every valid configuration is accepted",
    needs=("topology",),
    strategy=_valid,
    covers=("PLAN-1.2",),
)
def accepts_valid(ctx: Context, config: Example) -> None:
    OPERATIONS["transfer"](config)  # the reference accepts it
    within_domain(ctx, TransferCase.from_dict(config))
    try:
        ctx.adapter.validate_topology(copy.deepcopy(config))
    except Exception as error:
        expect(False, f"valid configuration {config} was refused: {error!r} [PLAN-1.2]")


# -- model facts -----------------------------------------------------------------------------


@st.composite
def _bad_model(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid configuration with one model fact out of range, of another type or kind."""
    config = draw(_valid(adapter))
    model = dict(config["model"])
    field = draw(
        st.sampled_from(["num_layers", "num_kv_heads", "head_dim", "attention", "scale_format"])
    )
    if field == "attention":
        model["attention"] = draw(st.sampled_from(["gqa", "MHA", "sparse", "", "mqa"]))
    elif field == "scale_format":
        fp8 = model["dtype"] in FP8_DTYPES
        wrong = ["per_tensor", "per_token", ""] + ([] if fp8 else ["per_layer"])
        model["scale_format"] = draw(st.sampled_from(wrong))
    else:
        value = model[field]
        model[field] = draw(st.sampled_from([0, -1, float(value), str(value), True]))
    config["model"] = model
    return config


@st.composite
def _mismatched_models(draw: st.DrawFn, adapter: Adapter) -> Example:
    """Two stages whose models differ in exactly one fact [MODEL-3]."""
    config = draw(_valid(adapter))
    base = ModelShape.from_dict(config["model"])
    fact = draw(st.sampled_from(["num_layers", "num_kv_heads", "head_dim", "attention", "dtype"]))
    other = base.to_dict()
    if fact == "num_layers":
        step = draw(st.sampled_from([1, -1] if base.num_layers > 1 else [1]))
        other["num_layers"] = base.num_layers + step
    elif fact == "head_dim":
        other["head_dim"] = base.head_dim + 1
    elif fact == "num_kv_heads":
        if base.attention == "mla":
            fact, other["head_dim"] = "head_dim", base.head_dim * 2
        else:
            other["num_kv_heads"] = base.num_kv_heads * 2
    elif fact == "attention":
        # MHA with one head and MLA of that width hold the same numbers per token; they
        # still differ in kind (K and V against one latent).
        other = {
            **other,
            "num_kv_heads": 1,
            "attention": "mha" if base.attention == "mla" else "mla",
        }
        config["model"] = {**config["model"], "num_kv_heads": 1}
        config["source"] = {**config["source"], "tp": 1}
        config["target"] = {**config["target"], "tp": 1}
    else:
        same_size = [d for d in DTYPES if d != base.dtype and DTYPES[d].itemsize == base.itemsize]
        other["dtype"] = draw(st.sampled_from(same_size or [d for d in DTYPES if d != base.dtype]))
        other["scale_format"] = None
    other = ModelShape.from_dict(other).to_dict()  # fills the fp8 scale format
    return {**config, "target_model": other, "differs_in": fact}


_refusal_check(
    "MODEL-1",
    "refuses-invalid-model",
    "positive integer sizes, a known attention kind, scale formats only for fp8",
    ("MODEL-1.1", "MODEL-1.2", "MODEL-1.3"),
    _bad_model,
    method="validate_model",
)
_refusal_check(
    "MODEL-2",
    "refuses-mla-with-heads",
    "MLA has one latent",
    ("MODEL-2.2",),
    lambda adapter: st.integers(2, 64).map(lambda h: _config(1, 1, _mha(heads=h, attention="mla"))),
    method="validate_model",
)


@check(
    "MODEL-3",
    "refuses-mismatched-models",
    "stages must agree on every model fact",
    needs=("models",),
    strategy=_mismatched_models,
    examples=_pins("MODEL-3"),
    covers=tuple(f"MODEL-3.{i}" for i in range(1, 6)),
)
def refuses_mismatched_models(ctx: Context, config: Example) -> None:
    fact = config.get("differs_in", "num_kv_heads")
    obligation = {
        "num_layers": "MODEL-3.1",
        "num_kv_heads": "MODEL-3.2",
        "head_dim": "MODEL-3.3",
        "attention": "MODEL-3.4",
        "dtype": "MODEL-3.5",
    }[fact]
    given = {k: v for k, v in config.items() if k != "differs_in"}
    try:
        ctx.adapter.validate_model(copy.deepcopy(given))
    except Exception:
        return
    expect(
        False,
        f"stages whose models differ in {fact} alone were accepted: source {given['model']}, "
        f"target {given['target_model']} [{obligation}]",
    )


_UNKNOWN_DTYPES = ("int8", "float64", "uint8", "float8_e4m3fnuz", "bool", "bf16", "half", "fp8")


_refusal_check(
    "DTYPE-1",
    "refuses-unknown-dtype",
    "only the allowed dtypes",
    ("DTYPE-1.1",),
    lambda adapter: st.sampled_from(_UNKNOWN_DTYPES).map(lambda d: _config(1, 1, _mha(dtype=d))),
    method="validate_model",
)


@check(
    "DTYPE-1",
    "accepts-allowed",
    "every allowed dtype of the domain is accepted, for MHA and MLA",
    needs=("models",),
    strategy=lambda adapter: st.tuples(
        st.sampled_from(adapter.domain.model_dtypes()),
        st.sampled_from(adapter.domain.attention),
    ).map(
        lambda pair: _config(
            1,
            1,
            ModelShape.mla(2, 8, dtype=pair[0]).to_dict()
            if pair[1] == "mla"
            else ModelShape(4, 4, 8, dtype=pair[0]).to_dict(),
        )
    ),
    covers=("DTYPE-1.2",),
)
def accepts_allowed(ctx: Context, config: Example) -> None:
    if config["model"]["dtype"] not in ctx.adapter.domain.model_dtypes():
        raise OutsideDomain
    try:
        ctx.adapter.validate_model(copy.deepcopy(config))
    except Exception as error:
        expect(
            False,
            f"a {config['model']['dtype']} model ({config['model']}) was refused: {error!r}; "
            "each allowed dtype is accepted [DTYPE-1.2]",
        )
