"""Checks that invalid or disagreeing model facts are refused [MODEL-1, MODEL-2, MODEL-3]:
``validate_model`` and ``validate_agreement``, each probe one fact outside the spec's
domain (:mod:`kvspec.conformance.refusals`).
"""

from __future__ import annotations

import copy
from typing import cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import VALIDATORS, Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import changed_values, expect_refused
from kvspec.conformance.families.models.errors import ERROR_CASES
from kvspec.conformance.refusals import (
    Variant,
    config_between,
    mha_model,
    pinned,
    refusal_check,
    tp_pp_only,
    valid_configs,
)
from kvspec.conformance.transfer_config import TransferConfig, handed
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.topology.model import ModelShape


def _bad_models(adapter: Adapter, config: Example) -> list[Variant]:
    """The configuration with one model fact out of range, of another type or kind, for
    every fact [MODEL-1]."""
    model = config["model"]
    found = []
    for fact in ("num_layers", "num_kv_heads", "head_dim"):
        value = model[fact]
        for bad in (0, -1, float(value), str(value), True):
            if bad is True and value == 1:
                continue  # True == 1: the same number, though of the wrong type
            found.append(
                ("MODEL-1.1", f"{fact} {bad!r}", {**config, "model": {**model, fact: bad}})
            )
    for kind in ("gqa", "MHA", "sparse", "", "mqa"):
        found.append(
            ("MODEL-1.2", f"attention {kind!r}", {**config, "model": {**model, "attention": kind}})
        )
    fp8 = model["dtype"] in FP8_DTYPES
    for scale_format in ("per_tensor", "per_token", "") + (() if fp8 else ("per_layer",)):
        changed = {**config, "model": {**model, "scale_format": scale_format}}
        found.append(("MODEL-1.3", f"scale_format {scale_format!r} for {model['dtype']}", changed))
    return found


def _mismatched_models(adapter: Adapter, config: Example) -> list[Variant]:
    """The configuration with a receiver's model that differs in exactly one fact, for every
    fact [MODEL-3]."""
    base = ModelShape.from_dict(config["model"])
    found = []

    def differing(obligation: str, fact: str, config: Example, **other: object) -> None:
        target = ModelShape.from_dict({**config["model"], **other}).to_dict()
        found.append((obligation, f"{fact} alone", {**config, "target_model": target}))

    differing("MODEL-3.1", "num_layers", config, num_layers=base.num_layers + 1)
    if base.attention == "mha":
        differing("MODEL-3.2", "num_kv_heads", config, num_kv_heads=base.num_kv_heads * 2)
    differing("MODEL-3.3", "head_dim", config, head_dim=base.head_dim + 1)
    # MHA with one head and MLA of that width hold as many numbers per token; they still
    # differ in kind (K and V against one latent).
    single = tp_pp_only(copy.deepcopy(config))
    single["model"] = {**single["model"], "num_kv_heads": 1}
    for side in ("source", "target"):
        single[side] = {**single[side], "tp": 1}
    differing(
        "MODEL-3.4", "attention", single, attention="mla" if base.attention == "mha" else "mha"
    )
    same_size = [d for d in DTYPES if d != base.dtype and DTYPES[d].itemsize == base.itemsize]
    other = (same_size or [d for d in DTYPES if d != base.dtype])[0]
    differing("MODEL-3.5", "dtype", config, dtype=other, scale_format=None)
    return found


refusal_check(
    "MODEL-1",
    "refuses-invalid-model",
    "positive integer sizes, a known attention kind, scale formats only for fp8",
    ("MODEL-1.1", "MODEL-1.2", "MODEL-1.3"),
    valid_configs,
    method="validate_model",
    variants=_bad_models,
    pins=pinned(ERROR_CASES, "MODEL-1"),
)


refusal_check(
    "MODEL-2",
    "refuses-mla-with-heads",
    "MLA has one latent",
    ("MODEL-2.2",),
    lambda adapter: st.integers(2, 64).map(
        lambda h: config_between(1, 1, mha_model(heads=h, attention="mla"))
    ),
    method="validate_model",
    pins=pinned(ERROR_CASES, "MODEL-2"),
)


refusal_check(
    "MODEL-3",
    "refuses-mismatched-models",
    "stages must agree on every model fact",
    tuple(f"MODEL-3.{i}" for i in range(1, 6)),
    valid_configs,
    method="validate_agreement",
    pins=(),
    variants=_mismatched_models,
)


TOGETHER: tuple[str, ...] = (
    "num_kv_heads and head_dim, one product",
    "head_dim and dtype, one size per token",
)
"""Pairs of model facts a receiver's model changes together, keeping what a byte count
sees: heads x head_dim (the values per token and layer), head_dim x the dtype's itemsize
(the bytes per token and head) [MODEL-3]."""


def _even_head_dim(config: Example) -> Example:
    """``config`` with its model's head_dim made even (doubled if odd), so it halves."""
    model = config["model"]
    if model["head_dim"] % 2 == 0:
        return config
    return {**config, "model": {**model, "head_dim": model["head_dim"] * 2}}


def _pairs_for(config: Example) -> list[str]:
    """The pairs of :data:`TOGETHER` that can change together in ``config``'s model: heads
    only for MHA, a dtype of twice the itemsize only where one exists and no fp8 scale
    format would change along."""
    model = ModelShape.from_dict(config["model"])
    found = []
    if model.attention == "mha" and not model.groups:
        found.append(TOGETHER[0])
    if model.dtype not in FP8_DTYPES and _wider(model.dtype) is not None:
        found.append(TOGETHER[1])
    return found


def _wider(dtype: str) -> str | None:
    """A dtype of twice ``dtype``'s itemsize, if any (bfloat16 -> float32)."""
    size = DTYPES[dtype].itemsize
    return next((d for d, t in DTYPES.items() if t.itemsize == 2 * size), None)


@st.composite
def together_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid configuration (head_dim even) and a pair of facts its receiver's model
    changes together [MODEL-3]."""
    config = draw(valid_configs(adapter).map(_even_head_dim).filter(lambda c: bool(_pairs_for(c))))
    return {"config": config, "together": draw(st.sampled_from(_pairs_for(config)))}


def _changed_together(config: Example, together: str) -> tuple[str, Example]:
    """(obligation, the receiver's model) with the pair changed, the per-token size kept."""
    model = config["model"]
    half = model["head_dim"] // 2
    if together == TOGETHER[0]:
        return "MODEL-3.2", {**model, "num_kv_heads": model["num_kv_heads"] * 2, "head_dim": half}
    wider = _wider(model["dtype"])
    return "MODEL-3.3", {**model, "dtype": wider, "head_dim": half}


@check(
    "MODEL-3",
    "refuses-facts-changed-together",
    "stages whose models differ in two facts that keep a per-token size are refused",
    needs=(VALIDATORS["validate_agreement"],),
    strategy=together_examples,
    examples=(
        {"config": config_between(2, 2, mha_model(heads=4, head_dim=8)), "together": TOGETHER[0]},
        {"config": config_between(1, 2, mha_model(heads=2, head_dim=8)), "together": TOGETHER[1]},
    ),
    covers=("MODEL-3.2", "MODEL-3.3"),
)
def refuses_facts_changed_together(ctx: Context, example: Example) -> None:
    config = example["config"]
    obligation, target = _changed_together(config, example["together"])
    probe = handed({**config, "target_model": ModelShape.from_dict(target).to_dict()})
    expect_refused(
        obligation,
        f"configuration {probe} ({example['together']}: the receiver's model "
        f"{target['num_kv_heads']} heads of {target['head_dim']} in {target['dtype']}, the "
        f"sender's {config['model']['num_kv_heads']} of {config['model']['head_dim']} in "
        f"{config['model']['dtype']})",
        lambda: ctx.adapter.validate_agreement(cast(TransferConfig, copy.deepcopy(probe))),
        naming=changed_values(config, probe),
        accepted=probe,
    )
