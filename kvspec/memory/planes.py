"""Fields outside the cells: per-block planes, split slot axes and side tensors [LAYOUT-8].

Block-scaled caches do not keep a (slot, head) cell's fields together. vLLM's NVFP4 page
(``--kv-cache-dtype nvfp4``) is ``[num_blocks, 2*heads, block_size, head_dim/2 +
head_dim/16]`` bytes, but each block holds four *planes* one after the other — K's fp4
values, K's e4m3 block scales, V's values, V's scales — each ``[heads, block_size,
width]``; on the SM100 trtllm-gen path V's scales sit in 4-token groups, a group's
``[4, head_dim/16]`` scales stored transposed. SGLang's MXFP8 pool keeps its UE8M0
scales in *side* tensors beside K and V, at page size 128 in FA4's interleave
``[pages, heads, 32, 4, head_dim/32]`` with slot t at ``[t % 32, t // 32]``.

Both are data of a :class:`~kvspec.memory.layout_model.CacheLayout`: a
:class:`~kvspec.memory.layout_model.Plane` names a field's axes within a block (or
within its side tensor), where a slot axis may be split into ``slots_hi`` (slot //
unit) and ``slots_lo`` (slot % unit). This module turns them into views of the
tensors' own storage — ``[blocks, slots, heads, width]``, or ``[blocks, slots / unit,
unit, heads, width]`` where the slot axis is split and no single stride reaches a
slot — and into byte addresses for descriptors [DESC-1].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout, Field, SideField

CLAUSES = (
    Clause(
        "LAYOUT-8",
        "Per-block planes, split slot axes and side tensors",
        "A layout may keep its fields outside the cells. With planes, each block of its "
        "tensor (blocks outermost) holds one plane per field, in the order the planes are "
        "listed, each plane as many bytes as its field has in the block's heads and slots; "
        "element i of field f of (block b, slot t, head h) is at byte b * block bytes + f's "
        "plane offset + (the dense offset of (h, t, i) in the plane's axis order) * f's "
        "element size: vLLM's NVFP4 page is [K fp4 | K scales | V fp4 | V scales] per block, "
        "each [heads, block_size, width]. A side field lives in a tensor of its own per layer "
        "beside K and V, addressed the same way over its own axes (blocks or a pool's token "
        "rows, heads, slots, its width): SGLang's MXFP8 scales. A plane's or side tensor's "
        "slot axis may be split: slot t is at slots_hi = t // unit and slots_lo = t % unit, "
        "each placed where the axes say — vLLM's SM100 V scales [heads, slots_hi, width, "
        "slots_lo] with unit 4 (a 4-token group's scales transposed), SGLang's [blocks, "
        "heads, slots_lo, slots_hi, width] with unit 32. A field's width may be head_dim/N "
        "(e4m3 scales per 16 values: head_dim/16; fp4 pairs: head_dim/2). Reading gives each "
        "field as a view of the storage, [num_blocks, block_size, heads, width], or [num_blocks, "
        "block_size/unit, unit, heads, width] where the slot axis is split. A block size the "
        "unit does not divide, a block size other than a layout's fixed one, a head_dim that "
        "is not a multiple of the layout's multiple or of a width's N, and side tensors of "
        "another shape than K and V imply are refused.",
        obligations=(
            must(
                "each field is read from its plane of each block, planes in the listed order "
                "(K values, K scales, V values, V scales), each in its own axis order"
            ),
            must(
                "a split slot axis puts slot t at slots_hi = t // unit and slots_lo = t % unit, "
                "where the field's axes place them, for that field alone"
            ),
            must("a side field is read from its own tensor, over that tensor's axes"),
            refuses(
                "a block size the unit does not divide or other than the fixed one, a head_dim "
                "off the layout's multiple, or side tensors of another shape"
            ),
        ),
    ),
)


def _field(spec: CacheLayout, name: str) -> Field:
    for f in spec.record:
        if f.name == name:
            return f
    for s in spec.side:
        if s.field.name == name:
            return s.field
    raise KeyError(name)


def check_scaled(spec: CacheLayout, dtype: str, block_size: int, head_dim: int) -> None:
    """Refuse a block size or head_dim the layout's planes and side fields cannot hold
    [LAYOUT-8.4]."""
    if spec.fixed_block_size is not None and block_size != spec.fixed_block_size:
        raise ValueError(
            f"layout {spec.name} has blocks of {spec.fixed_block_size} slots, not {block_size} "
            "[LAYOUT-8]"
        )
    multiple = spec.head_dim_multiple
    if multiple is not None and head_dim % multiple:
        raise ValueError(
            f"layout {spec.name} holds a head_dim that is a multiple of {multiple}, not "
            f"{head_dim} [LAYOUT-8]"
        )
    for plane in (*spec.planes, *(s.plane for s in spec.side)):
        if plane.unit is not None and block_size % plane.unit:
            raise ValueError(
                f"layout {spec.name}: field {plane.field} keeps its slots in groups of "
                f"{plane.unit}, which do not divide a block of {block_size} [LAYOUT-8]"
            )
    for f in spec.fields(spec.kv_tensors):
        f.resolve(dtype, head_dim)  # refuses a head_dim off a width's N [LAYOUT-8]


def plane_layout(
    spec: CacheLayout, dtype: str, heads: int, block_size: int, head_dim: int
) -> dict[str, tuple[int, int, Field]]:
    """Each plane's field: (byte offset in its block, bytes, the field) [LAYOUT-8.1]."""
    out: dict[str, tuple[int, int, Field]] = {}
    offset = 0
    for plane in spec.planes:
        f = _field(spec, plane.field)
        size = heads * block_size * f.nbytes(dtype, head_dim)
        item = FIELD_DTYPES[f.resolve(dtype, head_dim)[0]].itemsize
        if offset % item:
            raise ValueError(
                f"layout {spec.name}: the {plane.field} plane starts at byte {offset} of its "
                f"block, not a multiple of its element size {item} [LAYOUT-6, LAYOUT-8]"
            )
        out[plane.field] = (offset, size, f)
        offset += size
    return out


def _canonical(view: torch.Tensor, axes: Sequence[str], block_size: int) -> torch.Tensor:
    """A view over ``axes`` (blocks first, or token rows) permuted to [blocks, slots, heads,
    dim], or [blocks, slots_hi, slots_lo, heads, dim] where the slot axis is split."""
    axes = list(axes)
    if "tokens" in axes:
        at = axes.index("tokens")
        view = view.unflatten(at, (-1, block_size))
        axes[at : at + 1] = ["blocks", "slots"]
    order = ["blocks", "slots", "slots_hi", "slots_lo", "heads", "dim"]
    return view.permute([axes.index(a) for a in order if a in axes])


def plane_views(
    tensor: torch.Tensor,
    spec: CacheLayout,
    dtype: str,
    num_blocks: int,
    block_size: int,
    heads: int,
    head_dim: int,
) -> dict[str, torch.Tensor]:
    """Each plane field of a planes layout's tensor as a view [LAYOUT-8.1, LAYOUT-8.2]."""
    if not tensor.is_contiguous():
        raise ValueError(
            f"a {spec.name} cache keeps each block's planes in its bytes, so its tensor must "
            f"be dense in its physical order; got strides {tensor.stride()} [LAYOUT-8]"
        )
    blocks = tensor.view(torch.uint8).reshape(num_blocks, -1)
    out = {}
    for plane in spec.planes:
        offset, size, f = plane_layout(spec, dtype, heads, block_size, head_dim)[plane.field]
        name, width = f.resolve(dtype, head_dim)
        raw = blocks.narrow(1, offset, size).view(FIELD_DTYPES[name])
        sizes = plane.sizes(block_size, heads, width)
        shaped = raw.unflatten(1, [sizes[a] for a in plane.axes])
        out[plane.field] = _canonical(shaped, ["blocks", *plane.axes], block_size)
    return out


def side_shape(
    side: SideField, dtype: str, num_blocks: int, block_size: int, heads: int, head_dim: int
) -> list[int]:
    """The shape of a side field's tensor [LAYOUT-8.3]."""
    _, width = side.field.resolve(dtype, head_dim)
    sizes = {
        **side.plane.sizes(block_size, heads, width),
        "blocks": num_blocks,
        "tokens": num_blocks * block_size,
    }
    return [sizes[a] for a in side.plane.axes]


def side_view(
    tensor: torch.Tensor, side: SideField, dtype: str, block_size: int, head_dim: int
) -> torch.Tensor:
    """A side field's tensor as a view in its own dtype [LAYOUT-8.3]."""
    name, _ = side.field.resolve(dtype, head_dim)
    raw = tensor if tensor.element_size() != 1 else tensor.view(torch.uint8)
    return _canonical(raw.view(FIELD_DTYPES[name]), side.plane.axes, block_size)


def smallest_block(spec: CacheLayout) -> int:
    """The fewest slots a block of ``spec`` can have: its fixed block size, else the largest
    unit of its split slot axes (whole groups of slots), else 1 [LAYOUT-8]."""
    units = [p.unit or 1 for p in (*spec.planes, *(s.plane for s in spec.side))]
    return spec.fixed_block_size or max([1, *units])


def unit_of(spec: CacheLayout, name: str) -> int | None:
    """The unit of field ``name``'s split slot axis, or None (its slots are one axis)."""
    plane = spec.placement(name)
    return plane.unit if plane is not None and plane.split else None


def at_slots(unit: int | None, blocks: torch.Tensor, slots: torch.Tensor) -> tuple:
    """The index that reads (block, slot) pairs of a field view: ``(blocks, slots)``, or
    ``(blocks, slots // unit, slots % unit)`` of a split one [LAYOUT-8.2]."""
    if unit is None:
        return (blocks, slots)
    return (blocks, slots // unit, slots % unit)


def slot_rows(view: torch.Tensor, unit: int | None) -> torch.Tensor:
    """A field view as [blocks, block_size, heads, width], slot t of a split view at
    (t // unit, t % unit): a view where the strides allow, else a copy [LAYOUT-8.2]."""
    return view if unit is None else view.flatten(1, 2)
