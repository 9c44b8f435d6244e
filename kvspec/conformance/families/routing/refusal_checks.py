"""Checks that an invalid pair of stages or DP rank is refused and every valid
configuration accepted by each ``validate_*`` method [PLAN-1, DP-1]: a refusal check
alone would pass a validator that refuses everything (:mod:`kvspec.conformance.refusals`).
"""

from __future__ import annotations

import copy

from hypothesis import strategies as st

from kvspec.conformance.adapter import VALIDATORS, Adapter
from kvspec.conformance.checks import Context, Example, check, within_domain
from kvspec.conformance.checks.expectations import expect
from kvspec.conformance.families.routing.errors import ERROR_CASES
from kvspec.conformance.refusals import Variant, needs_axis, pinned, refusal_check, valid_configs
from kvspec.conformance.tiers import BREAKS
from kvspec.conformance.transfer_config import attention_tp, handed
from kvspec.error_cases import OPERATIONS
from kvspec.topology.case import TransferCase


@st.composite
def _one_side_invalid(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid configuration whose one side gets a TP size that cannot hold the model's
    heads, while the other side still can [PLAN-1]."""
    config = draw(
        valid_configs(adapter).filter(
            lambda e: e["model"]["attention"] == "mha" and e["model"]["num_kv_heads"] >= 2
        )
    )
    side = draw(st.sampled_from(["source", "target"]))
    heads = config["model"]["num_kv_heads"]
    bad = [t for t in range(2, 4 * heads + 2) if heads % t and t % heads]
    config[side] = {"tp": draw(st.sampled_from(bad)), "pp": 1, "layer_partition": None}
    if f"{side}_dp" in config:
        config[f"{side}_dp"] = 0
    return config


def _invalid_sides(config: Example) -> tuple[object, ...]:
    """What a refusal of one invalid side must name ("the error names that side"): the
    side and its TP size, for each side whose attention TP cannot hold the heads [PLAN-1]."""
    heads = config["model"]["num_kv_heads"]
    found: list[object] = []
    for side in ("source", "target"):
        tp = attention_tp(config[side])
        if heads % tp if heads >= tp else tp % heads:
            found += [side, tp]
    return tuple(found)


refusal_check(
    "PLAN-1",
    "refuses-one-invalid-side",
    "a pair where one side alone cannot hold the model is refused",
    ("PLAN-1.1",),
    _one_side_invalid,
    method="validate_model",  # heads over each side's TP: refused where the model loads
    pins=pinned(ERROR_CASES, "PLAN-1"),
    offending=_invalid_sides,
)


def _bad_dp_ranks(adapter: Adapter, config: Example) -> list[Variant]:
    """The router's DP rank outside 0..dp-1 on one side [DP-1]."""
    found = []
    for side in ("source", "target"):
        dp = config[side].get("dp", 1)
        for rank in (dp, dp + 1, -1):
            changed = copy.deepcopy(config)
            changed.setdefault("source_dp", 0)
            changed.setdefault("target_dp", 0)
            changed[f"{side}_dp"] = rank
            found.append(("DP-1.3", f"{side} DP rank {rank} of dp {dp}", changed))
    return found


refusal_check(
    "DP-1",
    "refuses-dp-rank",
    "the router's DP rank must be one of the stage's",
    ("DP-1.3",),
    valid_configs,
    method="validate_topology",
    variants=_bad_dp_ranks,
    missing=needs_axis("dp_sizes", "the adapter's domain has no attention DP"),
    pins=pinned(ERROR_CASES, "DP-1"),
)


def _accepts_check(slug: str, method: str, *, agreeing: bool = False, ranked: bool = False) -> None:
    """A check that ``method`` accepts every valid configuration of the domain — a refusal
    check alone would pass a validator that refuses everything [PLAN-1.2]; with
    ``agreeing``, the receiver's model is stated and equal to the sender's; with
    ``ranked``, the configuration names the last rank of one side (``tp * pp - 1``)."""

    @check(
        "PLAN-1",
        slug,
        f"every valid configuration passes {method}",
        needs=(VALIDATORS[method],),
        strategy=valid_configs,
        covers=("PLAN-1.2",),
    )
    def run(ctx: Context, config: Example) -> None:
        OPERATIONS["transfer"](config)  # the reference accepts it
        within_domain(ctx, TransferCase.from_dict(config))
        given = {**config, "target_model": dict(config["model"])} if agreeing else config
        if ranked:
            side = "source" if config["source"]["pp"] > 1 else "target"
            last = config[side]["tp"] * config[side]["pp"] - 1
            given = {**given, "rank": {"side": side, "rank": last}}
        handed(given)
        try:
            getattr(ctx.adapter, method)(copy.deepcopy(given))
        except Exception as error:
            expect(
                False, f"valid configuration {given} was refused: {error!r} [PLAN-1.2]", tier=BREAKS
            )


_accepts_check("accepts-valid", "validate_topology")


_accepts_check("sizes-accept-valid", "validate_sizes", ranked=True)


_accepts_check("models-accept-valid", "validate_model")


_accepts_check("partitions-accept-valid", "validate_partition")


_accepts_check("agreement-accepts-equal-models", "validate_agreement", agreeing=True)
