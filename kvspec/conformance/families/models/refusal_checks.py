"""Checks that invalid or disagreeing model facts are refused [MODEL-1, MODEL-2, MODEL-3]:
``validate_model`` and ``validate_agreement``, each probe one fact outside the spec's
domain (:mod:`kvspec.conformance.refusals`).
"""

from __future__ import annotations

import copy

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Example
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
