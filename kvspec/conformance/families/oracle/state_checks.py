"""Checks of the state oracle: every element of a rank's state is the coordinate hash of its
global unit, bit for bit [ORACLE-7].

States are drawn in small hybrids (:func:`~kvspec.conformance.draws.hybrids.hybrid_model`)
over the TP sizes of the adapter's domain; the expected values are the spec's
:func:`~kvspec.tensors.state_oracle.oracle_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import fail
from kvspec.conformance.draws.hybrids import STATES, hybrid_model, hybrid_tp_sizes
from kvspec.tensors.dtypes import bits_view
from kvspec.tensors.state_oracle import oracle_state
from kvspec.topology.groups import StateGroup, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.state import part_units


# ORACLE-7: the state oracle ------------------------------------------------------------------
@st.composite
def _state_fills(draw: st.DrawFn, adapter: Adapter) -> Example:
    model = ModelShape.from_dict(draw(hybrid_model(STATES)))
    groups = [i for i, g in enumerate(model.layer_groups) if not g.per_token and g.parts()]
    group = draw(st.sampled_from(groups))
    tp = draw(st.sampled_from(hybrid_tp_sizes(adapter)))
    mine = list(model.group_layers(group))
    layers = draw(st.lists(st.sampled_from(mine), min_size=1, max_size=3, unique=True))
    return {
        "model": model.to_dict(),
        "group": group,
        "layers": sorted(layers),
        "attn_tp": tp,
        "attn_tp_rank": draw(st.integers(0, tp - 1)),
        "request_id": draw(st.text("abc-_0123456789", min_size=1, max_size=8)),
        "seed": draw(st.one_of(st.integers(0, 2**31), st.integers(2**31, 2**40))),
    }


@check(
    "ORACLE-7",
    "state-fill",
    "every element of a rank's state is the coordinate hash of its global unit, bit for bit",
    needs=("state-oracle",),
    strategy=_state_fills,
    examples=(
        {
            "model": ModelShape(
                2,
                2,
                2,
                groups=(
                    group_from_dict(
                        {
                            "kind": "mamba2",
                            "num_heads": 4,
                            "head_dim": 2,
                            "n_groups": 2,
                            "d_state": 2,
                            "conv_kernel": 3,
                            "ssm_dtype": "float32",
                        }
                    ),
                ),
                layers=(1, 0),
            ).to_dict(),
            "group": 1,
            "layers": [0],
            "attn_tp": 2,
            "attn_tp_rank": 1,
            "request_id": "req-1",
            "seed": 3,
        },
    ),
    covers=("ORACLE-7.1",),
)
def _state_fill(ctx: Context, example: Example) -> None:
    model = ModelShape.from_dict(example["model"])
    if example["attn_tp"] not in hybrid_tp_sizes(ctx.adapter):
        raise OutsideDomain
    args = {k: example[k] for k in ("attn_tp", "attn_tp_rank", "seed")}
    layers = tuple(example["layers"])
    want = oracle_state(model, example["group"], example["request_id"], layers=layers, **args)
    got = ctx.adapter.state_oracle(
        model, example["group"], example["request_id"], layers=layers, **args
    )
    state = cast(StateGroup, model.layer_groups[example["group"]])  # the example's is a state
    units = part_units(state, example["attn_tp"], example["attn_tp_rank"])
    for name, expected in want.items():
        have = got.get(name) if isinstance(got, Mapping) else None
        where = (
            f"{state.describe()}, part {name}, layers {list(layers)}, attention-TP rank "
            f"{example['attn_tp_rank']} of {example['attn_tp']}"
        )
        if (
            have is None
            or tuple(have.shape) != tuple(expected.shape)
            or have.dtype != expected.dtype
        ):
            shape = None if have is None else (list(have.shape), str(have.dtype))
            fail(
                f"{where}: the fill is {shape}, not {list(expected.shape)} {expected.dtype} "
                "[ORACLE-7.1]"
            )
        differs = bits_view(have.contiguous().cpu()) != bits_view(expected)
        if bool(differs.any()):
            layer, unit, element = (int(i) for i in differs.nonzero()[0].tolist())
            fail(
                f"{where}: {int(differs.sum())} element(s) differ from the state oracle; the "
                f"first at layer {layers[layer]}, global unit {units[name][unit]}, element "
                f"{element} [ORACLE-7.1: every unit under its global index]"
            )
