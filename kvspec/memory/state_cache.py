"""Where a state layer's cache keeps each element: the conv-state layouts and the state page
[SLAYOUT-1, SLAYOUT-2].

A state layer (Mamba, GDN) keeps one fixed-size state per request in one *page* per
block [STATE-1]. vLLM allocates a layer's buffer as ``num_blocks`` pages and views it
as its state tensors in order — the conv state, then the temporal state — each with
block stride ``page_size`` and a storage offset equal to the bytes of the tensors
before it (``gpu_model_runner._reshape_kv_cache_tensors``, MambaSpec branch). The
conv state of a rank is ``dim`` channels (its conv parts ``x|B|C`` or ``Q|K|V`` one after
the other, each its held units ascending, each unit ``width`` channels) by
``state_len`` rows, stored ``(dim, state_len)`` under DS or ``(state_len, dim)`` under
SD, vLLM's default (``mamba_utils.get_conv_state_layout``; field/research/hybrids.md
§2). The layouts themselves are data (:data:`kvspec.memory.presets.STATE_PRESETS`).

Under DS a unit's elements are one contiguous run, so a heterogeneous-TP transfer
reads each conv part in one read (vLLM's NIXL "3-read" transfer asserts DS for that
reason; ``ssm_conv_transfer_utils.py``); under SD the same unit is one run per row.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import itemsize
from kvspec.core.require import require_int
from kvspec.memory.layout_model import StateCacheLayout
from kvspec.memory.layout_refs import is_layout_file, read_state_file
from kvspec.memory.presets import STATE_PRESETS
from kvspec.tensors.state_oracle import part_dtype, state_group
from kvspec.topology.model import ModelShape
from kvspec.topology.state import part_units

CLAUSES = (
    Clause(
        "SLAYOUT-1",
        "A state element's place in the layer's buffer",
        "A state layer's cache is read only under a named state layout (vllm_conv_sd, "
        "vllm_conv_ds). Block b's page starts b x page_size bytes into the layer's buffer; "
        "the page holds the conv state at offset 0, in the model's dtype, then the temporal "
        "state ('ssm') at the conv state's bytes, in its own dtype [GROUP-2], contiguous as "
        "[units, width]; page_size defaults to the state's bytes and may be larger (vLLM pads "
        "a state page to the attention page). The conv state's channels are the rank's conv "
        "parts in order, each its held units ascending [STATE-1], each unit width channels; "
        "element e of a conv unit is channel (its first channel + e // rows) and row "
        "e mod rows. Channel c, row r is element c x state_len + r of the conv state under DS "
        "(dim, state_len) and r x dim + c under SD (state_len, dim), dim the rank's conv "
        "channels and state_len its rows [vLLM 0.33.0 mamba_utils._orient_conv_shape]. An "
        "unknown layout name is refused listing the known ones; so is a page size below the "
        "state's bytes or not keeping each tensor aligned to its itemsize, and a unit the "
        "rank does not hold, an element outside its unit or a negative block.",
        obligations=(
            must(
                "conv channel c, row r is at c x state_len + r under DS and r x dim + c under SD, "
                "the channels being the rank's conv parts in order, each its units ascending"
            ),
            must(
                "the temporal state follows the conv state in the page, in its own dtype, and "
                "block b's page starts b x page_size bytes into the buffer"
            ),
            refuses("an unknown state layout name"),
            refuses(
                "a page size below the state's bytes, or one that leaves a tensor unaligned to "
                "its itemsize"
            ),
            refuses("a unit the rank does not hold, an element outside its unit, a negative block"),
        ),
    ),
    Clause(
        "SLAYOUT-2",
        "A part's units are read in maximal runs",
        "The bytes that hold units u..v of one part of one block are exactly the bytes of "
        "their elements [SLAYOUT-1]; read as runs they are those bytes in address order, "
        "each byte once, adjacent runs merged: under DS consecutive units of a part are one "
        "run (one read per conv part, the transfer vLLM's NIXL connector makes), under SD one "
        "run per row (rows merge only when the units span every channel).",
        obligations=(
            must(
                "the runs of a part's units are exactly their elements' bytes, in address order, "
                "maximal: one run under DS, one per row under SD unless the rows touch"
            ),
        ),
    ),
)


def get_state_layout(name: object) -> StateCacheLayout:
    """The named state layout, or the one in the layout file ``name`` (a path ending in
    ``.json``); an unknown name is refused with the known ones [SLAYOUT-1]."""
    if isinstance(name, str) and name not in STATE_PRESETS and is_layout_file(name):
        return read_state_file(name)
    if not isinstance(name, str) or name not in STATE_PRESETS:
        raise ValueError(
            f"unknown state cache layout {name!r}; known state layouts: "
            f"{', '.join(STATE_PRESETS)} [SLAYOUT-1]"
        )
    return STATE_PRESETS[name]


@dataclass(frozen=True)
class StateTensor:
    """One tensor of a state page: ``shape`` per block in physical order, ``offset`` bytes
    into the page [SLAYOUT-1]."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class StatePage:
    """One rank's page of one state layer under a state layout [SLAYOUT-1].

    ``channels`` gives each conv part's channel range in the conv state; ``units`` each
    part's held units [STATE-1]; ``dim`` and ``rows`` size the conv state.
    """

    layout: StateCacheLayout
    page_size: int
    tensors: tuple[StateTensor, ...]
    channels: dict[str, range]
    units: dict[str, range]
    widths: dict[str, int]
    dim: int
    rows: int

    @property
    def state_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> StateTensor:
        return next(t for t in self.tensors if t.name == name)


def state_page(
    layout: str | StateCacheLayout,
    model: ModelShape,
    group: int,
    *,
    attn_tp: int = 1,
    attn_tp_rank: int = 0,
    page_size: int | None = None,
) -> StatePage:
    """The page of state group ``group`` that attention-TP rank ``attn_tp_rank`` of
    ``attn_tp`` keeps per block under ``layout`` [SLAYOUT-1]."""
    spec = layout if isinstance(layout, StateCacheLayout) else get_state_layout(layout)
    state = state_group(model, group)
    held = part_units(state, attn_tp, attn_tp_rank)
    channels: dict[str, range] = {}
    widths: dict[str, int] = {}
    dim, rows = 0, 0
    ssm_units, ssm_width = 0, 0
    for part in state.parts():
        widths[part.name] = part.width
        if part.name == "ssm":
            ssm_units, ssm_width = len(held[part.name]), part.unit_elements
            continue
        span = len(held[part.name]) * part.width
        channels[part.name] = range(dim, dim + span)
        dim, rows = dim + span, part.rows
    tensors: list[StateTensor] = []
    at = 0
    if channels:
        conv_dtype = part_dtype(model, state, "conv")
        shape = (dim, rows) if spec.dim_first else (rows, dim)
        nbytes = dim * rows * itemsize(conv_dtype)
        tensors.append(StateTensor("conv", conv_dtype, shape, at, nbytes))
        at += nbytes
    if ssm_units:
        ssm_dtype = part_dtype(model, state, "ssm")
        nbytes = ssm_units * ssm_width * itemsize(ssm_dtype)
        tensors.append(StateTensor("ssm", ssm_dtype, (ssm_units, ssm_width), at, nbytes))
        at += nbytes
    size = at if page_size is None else page_size
    require_int("page_size", size, minimum=0)
    if size < at:
        raise ValueError(
            f"a page of {size} bytes cannot hold group {group}'s state of {at} bytes "
            f"({', '.join(f'{t.name} {t.nbytes} B' for t in tensors)}) [SLAYOUT-1]"
        )
    for t in tensors:
        item = itemsize(t.dtype)
        if size % item or t.offset % item:
            raise ValueError(
                f"a page of {size} bytes with {t.name} at byte {t.offset} leaves the {t.dtype} "
                f"tensor unaligned: both must be multiples of {item} [SLAYOUT-1]"
            )
    return StatePage(spec, size, tuple(tensors), channels, held, widths, dim, rows)


def _element(page: StatePage, part: str, unit: int, element: int) -> int:
    """The element index inside its tensor of (part, global unit, element) [SLAYOUT-1]."""
    if part not in page.units:
        raise ValueError(f"no state part {part!r}; the parts are {', '.join(page.units)}")
    held = page.units[part]
    if unit not in held:
        raise ValueError(
            f"unit {unit} of part {part} is not held by this rank, which holds units "
            f"{held.start}..{held.stop - 1} [SLAYOUT-1, STATE-1]"
        )
    width = page.widths[part]
    per_unit = width if part == "ssm" else width * page.rows
    if not isinstance(element, int) or not 0 <= element < per_unit:
        raise ValueError(
            f"element {element!r} is outside a unit of part {part} (0..{per_unit - 1}) [SLAYOUT-1]"
        )
    local = unit - held.start
    if part == "ssm":
        return local * width + element
    channel = page.channels[part].start + local * width + element // page.rows
    row = element % page.rows
    if page.layout.dim_first:
        return channel * page.rows + row
    return row * page.dim + channel


def element_offset(page: StatePage, *, block: int, part: str, unit: int, element: int) -> int:
    """Byte offset, in the layer's buffer, of one state element [SLAYOUT-1]."""
    require_int("block", block, minimum=0)
    index = _element(page, part, unit, element)
    tensor = page.tensor("ssm" if part == "ssm" else "conv")
    return block * page.page_size + tensor.offset + index * itemsize(tensor.dtype)


def state_offset(
    layout: str | StateCacheLayout,
    model: ModelShape,
    group: int,
    *,
    attn_tp: int = 1,
    attn_tp_rank: int = 0,
    page_size: int | None = None,
    block: int,
    part: str,
    unit: int,
    element: int,
) -> int:
    """Byte offset, in the layer's buffer, of element ``element`` of global unit ``unit``
    of part ``part`` in block ``block`` [SLAYOUT-1].

    >>> from kvspec.topology.groups import Mamba2State
    >>> model = ModelShape(2, 1, 4, groups=(Mamba2State(2, 2, 1, 2, 3),), layers=(0, 1))
    >>> state_offset("vllm_conv_ds", model, 1, block=0, part="B", unit=0, element=1) // 2
    9
    >>> state_offset("vllm_conv_sd", model, 1, block=0, part="B", unit=0, element=1) // 2
    12
    """
    page = state_page(
        layout, model, group, attn_tp=attn_tp, attn_tp_rank=attn_tp_rank, page_size=page_size
    )
    return element_offset(page, block=block, part=part, unit=unit, element=element)


def state_runs(
    layout: str | StateCacheLayout,
    model: ModelShape,
    group: int,
    *,
    attn_tp: int = 1,
    attn_tp_rank: int = 0,
    page_size: int | None = None,
    block: int,
    part: str,
    units: range,
) -> tuple[tuple[int, int], ...]:
    """The bytes holding ``units`` of ``part`` in block ``block``, as maximal runs
    ``(offset, nbytes)`` in address order [SLAYOUT-2]."""
    page = state_page(
        layout, model, group, attn_tp=attn_tp, attn_tp_rank=attn_tp_rank, page_size=page_size
    )
    if part not in page.units:
        raise ValueError(f"no state part {part!r}; the parts are {', '.join(page.units)}")
    tensor = page.tensor("ssm" if part == "ssm" else "conv")
    item = itemsize(tensor.dtype)
    per_unit = page.widths[part] * (1 if part == "ssm" else page.rows)
    starts = sorted(
        element_offset(page, block=block, part=part, unit=u, element=e)
        for u in units
        for e in range(per_unit)
    )
    runs: list[tuple[int, int]] = []
    for at in starts:
        if runs and runs[-1][0] + runs[-1][1] == at:
            runs[-1] = (runs[-1][0], runs[-1][1] + item)
        else:
            runs.append((at, item))
    return tuple(runs)
