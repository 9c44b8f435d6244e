"""Mutants of the state cache layouts: where a state element sits, and the runs that read a
part [SLAYOUT-1, SLAYOUT-2].

Each is the reference with one bug a connector author writes from vLLM's state shapes:
right under one conv layout, one TP size or an unpadded page, wrong on the others.
"""

from __future__ import annotations

from typing import Any

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.state_cache import StatePage, element_offset, state_page
from kvspec.tensors.dtypes import itemsize
from kvspec.topology.model import ModelShape


def _page(layout: str, model: ModelShape, group: int, where: dict[str, Any]) -> StatePage:
    keys = ("attn_tp", "attn_tp_rank", "page_size")
    return state_page(layout, model, group, **{k: where[k] for k in keys if k in where})


def _conv_address(page: StatePage, part: str, unit: int, element: int) -> tuple[int, int, int]:
    """(channel, row, local unit) of a conv element, as the reference places it."""
    local = unit - page.units[part].start
    channel = page.channels[part].start + local * page.widths[part] + element // page.rows
    return channel, element % page.rows, local


# SLAYOUT-1.1 --------------------------------------------------------------------------------
@mutant("SLAYOUT-1.1")
class ConvAlwaysStateLenFirst(ReferenceAdapter):
    """Addresses every conv state as (state_len, dim), vLLM's default, whatever layout it
    was told: right under SD, every conv element misplaced under DS."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        return super().state_offset("vllm_conv_sd", model, group, **where)


@mutant("SLAYOUT-1.1")
class ConvPartsAsSeparateMatrices(ReferenceAdapter):
    """Addresses each conv part (x, B, C) under SD as its own (state_len, part channels)
    matrix placed after the previous part, as if the parts were separate tensors: right
    under DS and for a one-part conv state (Mamba-1), wrong for x|B|C and Q|K|V under SD."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        page = _page(layout, model, group, where)
        part = where["part"]
        right = super().state_offset(layout, model, group, **where)
        if page.layout.dim_first or part == "ssm" or part not in page.channels:
            return right
        channel, row, _ = _conv_address(page, part, where["unit"], where["element"])
        span = page.channels[part]
        index = span.start * page.rows + row * len(span) + channel - span.start
        conv = page.tensor("conv")
        item = itemsize(conv.dtype)
        correct = (row * page.dim + channel) * item
        return right - correct + index * item


# SLAYOUT-1.2 --------------------------------------------------------------------------------
@mutant("SLAYOUT-1.2")
class PagePaddingIgnored(ReferenceAdapter):
    """Steps from block to block by the state's own bytes, ignoring the padding to the
    attention page (vLLM's page_size_padded): right in block 0 and for unpadded pages."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        page = _page(layout, model, group, where)
        right = super().state_offset(layout, model, group, **where)
        return right - where["block"] * (page.page_size - page.state_bytes)


@mutant("SLAYOUT-1.2")
class TemporalInConvDtype(ReferenceAdapter):
    """Indexes the temporal state in the conv state's dtype, the way a loader that reads
    one dtype per layer does: right unless the state has its own ssm_dtype."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        page = _page(layout, model, group, where)
        right = super().state_offset(layout, model, group, **where)
        if where["part"] != "ssm" or len(page.tensors) < 2:
            return right
        conv, ssm = page.tensor("conv"), page.tensor("ssm")
        base = where["block"] * page.page_size + ssm.offset
        return base + (right - base) // itemsize(ssm.dtype) * itemsize(conv.dtype)


# SLAYOUT-1.3 --------------------------------------------------------------------------------
@mutant("SLAYOUT-1.3")
class UnknownStateLayoutAsDefault(ReferenceAdapter):
    """Reads a state layout name it does not know as SD, as vLLM's get_conv_state_layout
    falls back to SD when VLLM_SSM_CONV_STATE_LAYOUT is unset."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        known = layout in ("vllm_conv_sd", "vllm_conv_ds")
        return super().state_offset(layout if known else "vllm_conv_sd", model, group, **where)


# SLAYOUT-1.4 --------------------------------------------------------------------------------
@mutant("SLAYOUT-1.4")
class PageSizeTrusted(ReferenceAdapter):
    """Takes the page size it is given without checking that the state fits or stays
    aligned in it: pages overlap, or a float32 state starts mid-element."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        given = where.get("page_size")
        own = {**where, "page_size": None}
        try:
            page = _page(layout, model, group, own)
        except ValueError:
            page = None
        if given is None or page is None:
            return super().state_offset(layout, model, group, **where)
        return element_offset(
            page,
            block=where["block"],
            part=where["part"],
            unit=where["unit"],
            element=where["element"],
        ) + where["block"] * (given - page.page_size)


# SLAYOUT-1.5 --------------------------------------------------------------------------------
@mutant("SLAYOUT-1.5")
class UnitWrappedIntoHeld(ReferenceAdapter):
    """Maps a unit the rank does not hold onto one it does (global unit modulo its count)
    and an element past its unit onto the next unit's, instead of refusing them."""

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        page = _page(layout, model, group, where)
        part = where["part"]
        if part in page.units and where["block"] >= 0:
            held = page.units[part]
            per_unit = page.widths[part] * (1 if part == "ssm" else page.rows)
            element = where["element"]
            unit = held.start + (where["unit"] - held.start) % len(held)
            unit = held.start + (unit - held.start + element // per_unit) % len(held)
            where = {**where, "unit": unit, "element": element % per_unit}
        return super().state_offset(layout, model, group, **where)


# SLAYOUT-2.1 --------------------------------------------------------------------------------
@mutant("SLAYOUT-2.1")
class UnitsOneRunUnderSd(ReferenceAdapter):
    """Reads a part's units as one run from their first byte, as a connector written for DS
    does (vLLM's 3-read transfer asserts DS for this reason): right under DS only."""

    def state_runs(
        self, layout: str, model: ModelShape, group: int, **where: Any
    ) -> tuple[tuple[int, int], ...]:
        runs = super().state_runs(layout, model, group, **where)
        if not runs:
            return runs
        return ((runs[0][0], sum(n for _, n in runs)),)


@mutant("SLAYOUT-2.1")
class RunsPerUnit(ReferenceAdapter):
    """Gives one run per unit and never merges consecutive units into one read, so a
    part of n units costs n reads under DS where one would do."""

    def state_runs(
        self, layout: str, model: ModelShape, group: int, **where: Any
    ) -> tuple[tuple[int, int], ...]:
        units = where.pop("units")
        # Bound here: a zero-argument super() inside the generator below has no class cell.
        runs = super().state_runs
        return tuple(
            run
            for unit in units
            for run in runs(layout, model, group, **where, units=range(unit, unit + 1))
        )
