"""Making a cache in a layout: empty, or converted from another, slot for slot [LAYOUT-3].

:func:`empty_cache` allocates a cache of a shape in a layout. :func:`convert` writes
``cache`` into a new cache (or a caller's ``out``) in another layout: slot ``s`` of each
field of the source at slot ``s`` of the target, bit for bit [DTYPE-2], the block size
free where it divides the slots. Only layouts whose cells hold the same fields convert
into one another; nothing is dropped or padded [LAYOUT-3, LAYOUT-6].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from kvspec.core.require import require_int
from kvspec.memory.cache_layout.registry import LayoutRef, get_layout, layouts_for
from kvspec.memory.cache_layout.shape import (
    CacheShape,
    LayerCache,
    cache_shape,
    check_alignment,
    describe_cache,
    stored_tensors,
)
from kvspec.memory.cache_layout.views import canonical_records, field_views
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.planes import check_scaled, side_shape, slot_rows, unit_of
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import dtype_name, torch_dtype


def empty_cache(
    layout: LayoutRef, shape: CacheShape, dtype: str, device: str | torch.device = "cpu"
) -> LayerCache:
    """A zero-filled cache of ``shape`` in ``layout`` [LAYOUT-1]."""
    return _allocate(get_layout(layout), shape, dtype, device, torch.zeros)


def _allocate(
    spec: CacheLayout,
    shape: CacheShape,
    dtype: str,
    device: str | torch.device,
    factory: Callable[..., torch.Tensor],
) -> LayerCache:
    _check_holds(spec, shape)
    dtype_name(torch_dtype(dtype))
    if spec.dtypes is not None and dtype not in spec.dtypes:
        raise ValueError(
            f"layout {spec.name} holds {', '.join(spec.dtypes)} caches, not {dtype} [LAYOUT-5]"
        )
    check_alignment(spec, dtype, shape.head_dim)
    if spec.scaled:
        check_scaled(spec, dtype, shape.block_size, shape.head_dim)
    if spec.fixed_head_dim is not None and shape.head_dim != spec.fixed_head_dim:
        raise ValueError(
            f"layout {spec.name} holds a latent of {spec.fixed_head_dim}, not {shape.head_dim} "
            "[LAYOUT-5]"
        )
    sizes = {
        "kv": shape.kv,
        "layers": shape.layers,
        "blocks": shape.num_blocks,
        "slots": shape.block_size,
        "tokens": shape.slots,
        "heads": shape.heads,
        "head_slots": shape.kv * shape.heads,
        "dim": spec.dim_size(dtype, shape.head_dim),
    }
    dims = [sizes[a] for a in spec.axes]
    element = FIELD_DTYPES[spec.element_dtype(dtype)]
    tensors = [
        factory(dims, dtype=element, device=device)
        for _ in range(shape.kv if spec.tuple_form else 1)
    ]
    for side in spec.side:  # each side field a tensor of its own [LAYOUT-8]
        name, _ = side.field.resolve(dtype, shape.head_dim)
        tensors.append(
            factory(
                side_shape(
                    side, dtype, shape.num_blocks, shape.block_size, shape.heads, shape.head_dim
                ),
                dtype=FIELD_DTYPES[name],
                device=device,
            )
        )
    return tuple(tensors) if spec.tuple_form else tensors[0]


def _check_holds(spec: CacheLayout, shape: CacheShape) -> None:
    """Refuse a shape the layout cannot hold: other K/V count, or token_major blocks [LAYOUT-3]."""
    if spec.kv_tensors is not None and spec.kv_tensors != shape.kv:
        have = "K and V" if shape.kv == 2 else "one latent"
        holds = "K and V" if spec.kv_tensors == 2 else "one latent"
        raise ValueError(
            f"layout {spec.name} {spec.shape} holds {holds} per layer but the cache holds "
            f"{have}: they do not carry the same information; use one of "
            f"{', '.join(layouts_for('mha' if shape.kv == 2 else 'mla'))} [LAYOUT-3]"
        )
    if not spec.paged and shape.block_size != 1:
        raise ValueError(
            f"layout {spec.name} has block size 1 (block i is token i), not {shape.block_size} "
            "[LAYOUT-2, LAYOUT-3]"
        )
    if not spec.cross_layer and shape.layers != 1:
        raise ValueError(
            f"layout {spec.name} holds one layer, not {shape.layers}; use a layout with a "
            "layers axis [LAYOUT-5]"
        )


def convert(
    cache: LayerCache,
    source: LayoutRef,
    target: LayoutRef,
    *,
    block_size: int | None = None,
    source_block_size: int | None = None,
    out: LayerCache | None = None,
) -> LayerCache:
    """``cache`` (in ``source``) as a new cache in ``target``, bit for bit [LAYOUT-3, LAYOUT-6].

    ``block_size`` is the target's block size: by default the source's (1 from token_major,
    and always 1 into token_major); ``source_block_size`` is a token pool's page size.
    Slot ``s`` of every field stays slot ``s``; the two layouts' cells must hold the same
    fields. ``out``, a preallocated cache in ``target`` of the converted shape, dtype and
    device that shares no storage with ``cache``, is written and returned instead of a
    new one; every byte is moved once either way.
    """
    src, dst = get_layout(source), get_layout(target)
    shape = cache_shape(cache, src, block_size=source_block_size)
    if block_size is None:
        block_size = shape.block_size if dst.paged else 1
    require_int("block_size", block_size, minimum=1)
    if shape.slots % block_size:
        raise ValueError(
            f"cannot re-block {shape.num_blocks} blocks of {shape.block_size} slots "
            f"({shape.slots} slots) into blocks of {block_size}: {block_size} does not divide "
            f"{shape.slots}, and slots are never dropped or padded [LAYOUT-3]"
        )
    out_shape = replace(shape, num_blocks=shape.slots // block_size, block_size=block_size)
    _check_holds(dst, out_shape)
    if src.cross_layer != dst.cross_layer:
        raise ValueError(
            f"{src.name} and {dst.name}: one holds every layer, the other one layer; convert "
            "the layers of a cross-layer cache one by one (layer_views) [LAYOUT-5]"
        )
    _, dtype = stored_tensors(cache, src)
    have_info = src.information(dtype, shape.head_dim, shape.kv)
    want_info = dst.information(dtype, shape.head_dim, shape.kv)
    if have_info != want_info:
        raise ValueError(
            f"layout {src.name} cells hold {_fields_text(have_info)} but {dst.name} cells hold "
            f"{_fields_text(want_info)}: they do not carry the same information, so nothing is "
            "converted [LAYOUT-6]"
        )
    views = field_views(cache, src, block_size=source_block_size)
    device = next(iter(views.values())).device
    page = dst.page_size(block_size)
    if out is None:
        # Uninitialised is safe: every slot of the target is written below.
        out = _allocate(dst, out_shape, dtype, device, torch.empty)
    else:
        _check_out(out, cache, dst, out_shape, dtype, device, page)
    if src.scaled or dst.scaled:
        # Fields in planes or side tensors: each field slot by slot, whatever its axes.
        targets = field_views(out, dst, block_size=page)
        for name, have in views.items():
            _copy_split(have, unit_of(src, name), targets[name], unit_of(dst, name))
        return out
    if src.parts(shape.kv) == dst.parts(shape.kv) and src.element == dst.element:
        # The same record in the same order: move whole cells, fewer and longer copies.
        have_records, _, _ = canonical_records(cache, src, source_block_size)
        want_records, _, _ = canonical_records(out, dst, page)
        for have, want in zip(have_records, want_records, strict=True):
            _copy_slots(have, want)
        return out
    targets = field_views(out, dst, block_size=page)
    for name, have in views.items():
        _copy_slots(have, targets[name])
    return out


def _check_out(
    out: LayerCache,
    cache: LayerCache,
    dst: CacheLayout,
    shape: CacheShape,
    dtype: str,
    device: torch.device,
    page: int | None,
) -> None:
    """Refuse an ``out`` that is not a cache of ``shape`` in ``dst``, or shares ``cache``'s
    storage [LAYOUT-3]."""
    wanted = f"a {dst.name} cache {dst.shape} of {shape}, {dtype} on {device}"
    try:
        have = cache_shape(out, dst, block_size=page)
        tensors, have_dtype = stored_tensors(out, dst)
    except ValueError as error:
        raise ValueError(f"out must be {wanted}; got {describe_cache(out)}: {error}") from None
    if have != shape or have_dtype != dtype or any(t.device != device for t in tensors):
        raise ValueError(
            f"out must be {wanted}; got {describe_cache(out)}, read as {have}, {have_dtype} on "
            f"{tensors[0].device} [LAYOUT-3]"
        )
    inputs = cache if isinstance(cache, (tuple, list)) else (cache,)
    mine = {t.untyped_storage().data_ptr() for t in inputs}
    if any(t.untyped_storage().data_ptr() in mine for t in tensors):
        raise ValueError(
            "out shares storage with the cache being converted; the converted cache shares "
            "no storage with its input [LAYOUT-3]"
        )


def _fields_text(info: tuple[tuple[str, str, int | str], ...]) -> str:
    return ", ".join(f"{name} ({width} x {dtype})" for name, dtype, width in info)


def _copy_split(
    have: torch.Tensor, have_unit: int | None, want: torch.Tensor, want_unit: int | None
) -> None:
    """Copy slot s of a field view to slot s of another, either of them split [LAYOUT-8.2]."""
    if have_unit is None and want_unit is None:
        _copy_slots(have, want)
        return
    rows = slot_rows(have, have_unit).reshape(-1, *have.shape[-2:])
    copy_bits(want, rows.reshape(want.shape))


def _copy_slots(have: torch.Tensor, want: torch.Tensor) -> None:
    """Copy slot s of ``have`` to slot s of ``want``, both [.., blocks, slots, heads, width],
    as bits [LAYOUT-3, DTYPE-2].

    Their block sizes may differ. When one divides the other, the larger block axis is
    split into the smaller blocks and the block axis of the smaller side into groups of
    them — both views, whatever the strides — so re-blocking is one strided copy of each
    byte. Otherwise the target is viewed in the source's blocks where its strides allow,
    or the source is reshaped (which may copy).
    """
    small, large = sorted((have.shape[-3], want.shape[-3]))
    if small != large and large % small == 0:
        k = large // small
        have, want = (
            t.unflatten(-3, (k, small)) if t.shape[-3] == large else t.unflatten(-4, (-1, k))
            for t in (have, want)
        )
    elif small != large:
        try:
            want = want.view(have.shape)
        except RuntimeError:
            have = have.reshape(want.shape)
    copy_bits(want, have)
