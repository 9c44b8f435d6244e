"""Checks of the state cache layouts: where each state element sits in a layer's buffer, and
the runs that read a part's units [SLAYOUT-1, SLAYOUT-2].

Models are small hybrids with state groups (Mamba-1, Mamba-2, GDN; conv and temporal
parts in different dtypes) over the TP sizes of the adapter's domain; pages are the
state's own bytes or padded, as vLLM pads a state page to the attention page. The
expected offsets are the spec's :func:`~kvspec.memory.state_cache.state_offset`.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import assume
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws.hybrids import STATES, hybrid_model, hybrid_tp_sizes
from kvspec.memory.presets import STATE_PRESETS
from kvspec.memory.state_cache import StatePage, element_offset, state_page
from kvspec.topology.groups import StateGroup, group_from_dict
from kvspec.topology.model import ModelShape

_PAD = 16
"""Page padding is drawn in multiples of 16 bytes, which keeps every dtype aligned."""


def _state_groups(model: ModelShape) -> list[int]:
    return [i for i, g in enumerate(model.layer_groups) if not g.per_token and g.parts()]


@st.composite
def _pages(draw: st.DrawFn, adapter: Adapter) -> Example:
    model = ModelShape.from_dict(draw(hybrid_model(STATES)))
    group = draw(st.sampled_from(_state_groups(model)))
    tp = draw(st.sampled_from(hybrid_tp_sizes(adapter)))
    rank = draw(st.integers(0, tp - 1))
    layout = draw(st.sampled_from(sorted(STATE_PRESETS)))
    try:
        own = state_page(layout, model, group, attn_tp=tp, attn_tp_rank=rank).state_bytes
    except ValueError:  # a bf16 conv state of odd size before an fp32 temporal state
        assume(False)
    padded = -(-own // _PAD) * _PAD + _PAD * draw(st.integers(0, 3))
    return {
        "model": model.to_dict(),
        "group": group,
        "layout": layout,
        "attn_tp": tp,
        "attn_tp_rank": rank,
        "page_size": draw(st.sampled_from([None, padded])),
    }


def _where(example: Example) -> dict[str, Any]:
    return {k: example[k] for k in ("attn_tp", "attn_tp_rank", "page_size")}


def _setup(ctx: Context, example: Example) -> tuple[ModelShape, StatePage]:
    if example["attn_tp"] not in hybrid_tp_sizes(ctx.adapter):
        raise OutsideDomain
    model = ModelShape.from_dict(example["model"])
    page = state_page(example["layout"], model, example["group"], **_where(example))
    return model, page


_MAMBA2 = ModelShape(
    2,
    2,
    2,
    groups=(
        group_from_dict(
            {
                "kind": "mamba2",
                "num_heads": 4,
                "head_dim": 2,
                "n_groups": 1,
                "d_state": 3,
                "conv_kernel": 4,
                "ssm_dtype": "float32",
            }
        ),
    ),
    layers=(1, 0),
).to_dict()
"""A Falcon-H1-like Mamba-2 layer: one group (B and C replicated), an fp32 temporal state."""


# SLAYOUT-1: every element's byte offset -----------------------------------------------------
@check(
    "SLAYOUT-1",
    "element-offsets",
    "every element of a rank's state page, in blocks 0-2, is at the byte the layout puts it: "
    "conv channel-major (DS) or row-major (SD), then the temporal state, blocks page_size apart",
    needs=("state-layout",),
    strategy=_pages,
    examples=tuple(
        {
            "model": _MAMBA2,
            "group": 1,
            "layout": name,
            "attn_tp": 2,
            "attn_tp_rank": 1,
            "page_size": 256,
        }
        for name in ("vllm_conv_sd", "vllm_conv_ds")
    ),
    covers=("SLAYOUT-1.1", "SLAYOUT-1.2"),
)
def _element_offsets(ctx: Context, example: Example) -> None:
    model, page = _setup(ctx, example)
    group, layout = example["group"], example["layout"]
    state = cast(StateGroup, model.layer_groups[group])  # the example's is a state
    for block in (0, 1, 2):
        for part in state.parts():
            for unit in page.units[part.name]:
                for element in range(part.unit_elements):
                    want = _offset(page, block, part.name, unit, element)
                    got = ctx.adapter.state_offset(
                        layout,
                        model,
                        group,
                        **_where(example),
                        block=block,
                        part=part.name,
                        unit=unit,
                        element=element,
                    )
                    if got != want:
                        obligation = "SLAYOUT-1.2" if part.name == "ssm" or block else "SLAYOUT-1.1"
                        fail(
                            f"{layout}, {state.describe()} at attention-TP rank "
                            f"{example['attn_tp_rank']} of {example['attn_tp']}, page "
                            f"{page.page_size} B ({_tensors(page)}): "
                            f"block {block}, part {part.name}, unit {unit}, element {element} is "
                            f"at byte {want}; the implementation says {got} [{obligation}]"
                        )


def _tensors(page: StatePage) -> str:
    return ", ".join(f"{t.name} {list(t.shape)} {t.dtype} at {t.offset}" for t in page.tensors)


def _offset(page: StatePage, block: int, part: str, unit: int, element: int) -> int:
    return element_offset(page, block=block, part=part, unit=unit, element=element)


# SLAYOUT-1: refusals ------------------------------------------------------------------------
@st.composite
def _broken(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid read, and what breaks each refusal: an unknown layout name, a page too
    small or unaligned, and (for one part) a unit the rank does not hold when there is
    one. The check tries every break on every example, so no obligation waits on the
    draw to come its way."""
    example = draw(_pages(adapter))
    model = ModelShape.from_dict(example["model"])
    state = model.layer_groups[example["group"]]
    part = draw(st.sampled_from(state.parts()))
    page = state_page(example["layout"], model, example["group"], **_where(example))
    held = page.units[part.name]
    foreign = [u for u in range(part.units) if u not in held]
    # Every drawn dtype is 2 or 4 bytes: one byte more leaves the page unaligned.
    short = page.state_bytes - draw(st.sampled_from([1, 2, 4, page.state_bytes]))
    return {
        "good": example,
        "part": part.name,
        "unit_elements": part.unit_elements,
        "bad_layout": draw(st.sampled_from(["vllm_conv", "DS", "SD", "vllm_conv_hnd", "mamba"])),
        "bad_page_size": draw(st.sampled_from([short, page.state_bytes + 1])),
        "foreign_unit": draw(st.sampled_from(foreign)) if foreign else None,
    }


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


@check(
    "SLAYOUT-1",
    "refusals",
    "an unknown state layout, a page too small or unaligned, a unit not held, an element "
    "outside its unit and a negative block: each refused, the valid read accepted",
    needs=("state-layout",),
    strategy=_broken,
    covers=("SLAYOUT-1.3", "SLAYOUT-1.4", "SLAYOUT-1.5"),
)
def _refusals(ctx: Context, example: Example) -> None:
    good = example["good"]
    if good["attn_tp"] not in hybrid_tp_sizes(ctx.adapter):
        raise OutsideDomain
    model, group, layout = ModelShape.from_dict(good["model"]), good["group"], good["layout"]
    page = state_page(layout, model, group, **_where(good))
    base = {"block": 0, "part": example["part"], "unit": page.units[example["part"]].start}
    base["element"] = 0
    ctx.adapter.state_offset(layout, model, group, **_where(good), **base)
    at = (
        f"of {model.layer_groups[group].describe()} at attention-TP rank "
        f"{good['attn_tp_rank']} of {good['attn_tp']}"
    )
    bad_page = {**_where(good), "page_size": example["bad_page_size"]}
    breaks = [
        (
            "SLAYOUT-1.3",
            f"unknown state layout {example['bad_layout']!r}",
            example["bad_layout"],
            _where(good),
            base,
            # "refused listing the known ones": the name, or one of them
            (example["bad_layout"], *STATE_PRESETS),
        ),
        (
            "SLAYOUT-1.4",
            f"page size {example['bad_page_size']} (too small or unaligned)",
            layout,
            bad_page,
            base,
            (),
        ),
        (
            "SLAYOUT-1.5",
            f"element {example['unit_elements']}, past its unit",
            layout,
            _where(good),
            {**base, "element": example["unit_elements"]},
            (),
        ),
        ("SLAYOUT-1.5", "block -1", layout, _where(good), {**base, "block": -1}, ()),
    ]
    if example["foreign_unit"] is not None:
        breaks.append(
            (
                "SLAYOUT-1.5",
                f"unit {example['foreign_unit']}, which the rank does not hold",
                layout,
                _where(good),
                {**base, "unit": example["foreign_unit"]},
                (),
            )
        )
    for obligation, what, name, sizes, where, naming in breaks:

        def offset(n: str = name, z: dict[str, Any] = sizes, w: dict[str, Any] = where) -> int:
            return ctx.adapter.state_offset(n, model, group, **z, **w)

        expect_refused(obligation, f"{what} (layout {name!r}, {where}) {at}", offset, naming=naming)


# SLAYOUT-2: maximal runs --------------------------------------------------------------------
@st.composite
def _run_cases(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_pages(adapter))
    model = ModelShape.from_dict(example["model"])
    state = model.layer_groups[example["group"]]
    part = draw(st.sampled_from(state.parts()))
    held = state_page(example["layout"], model, example["group"], **_where(example)).units[
        part.name
    ]
    first = draw(st.integers(held.start, held.stop - 1))
    last = draw(st.integers(first, held.stop - 1))
    return {
        **example,
        "part": part.name,
        "units": [first, last + 1],
        "block": draw(st.integers(0, 2)),
    }


@check(
    "SLAYOUT-2",
    "runs",
    "the runs that read a part's units are exactly their bytes, in address order, merged: one "
    "under DS, one per row under SD",
    needs=("state-runs",),
    strategy=_run_cases,
    examples=tuple(
        {
            "model": _MAMBA2,
            "group": 1,
            "layout": name,
            "attn_tp": 1,
            "attn_tp_rank": 0,
            "page_size": None,
            "part": "x",
            "units": [1, 3],
            "block": 1,
        }
        for name in ("vllm_conv_sd", "vllm_conv_ds")
    ),
    covers=("SLAYOUT-2.1",),
)
def _runs(ctx: Context, example: Example) -> None:
    model, page = _setup(ctx, example)
    part, units, block = example["part"], range(*example["units"]), example["block"]
    tensor = page.tensor("ssm" if part == "ssm" else "conv")
    size = tensor.nbytes // _numel(tensor.shape)
    per_unit = page.widths[part] * (1 if part == "ssm" else page.rows)
    starts = [_offset(page, block, part, u, e) for u in units for e in range(per_unit)]
    want_bytes = sorted(b for at in starts for b in range(at, at + size))
    got = [
        tuple(r)
        for r in ctx.adapter.state_runs(
            example["layout"],
            model,
            example["group"],
            **_where(example),
            block=block,
            part=part,
            units=units,
        )
    ]
    where = (
        f"{example['layout']}, {model.layer_groups[example['group']].describe()} at attention-TP "
        f"rank {example['attn_tp_rank']} of {example['attn_tp']}: block {block}, part {part}, "
        f"units {units.start}..{units.stop - 1}"
    )
    got_bytes = [b for at, n in got for b in range(at, at + n)]
    expect(
        got_bytes == want_bytes,
        f"{where}: the runs {got[:6]}{'...' if len(got) > 6 else ''} do not cover exactly the "
        f"units' {len(want_bytes)} bytes from {want_bytes[:1]} in address order [SLAYOUT-2.1]",
    )
    touching = [i for i in range(1, len(got)) if got[i - 1][0] + got[i - 1][1] == got[i][0]]
    expect(
        not touching and all(n > 0 for _, n in got),
        f"{where}: runs {got[:6]} are not maximal: run {touching[:1]} starts where the one "
        "before it ends, so it is one read [SLAYOUT-2.1]",
    )
