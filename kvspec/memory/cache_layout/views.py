"""Reading a cache is a view: every field of every cell, in its own dtype [LAYOUT-2, LAYOUT-6].

Whatever a layout's axes, K and V (or the latent), and every inline scale of a record,
read as ``[num_blocks, block_size, heads, width]`` views of the cache's own storage
(``[layers, ...]`` first for a cross-layer cache): axes permuted, a token pool's rows
unflattened into its pages, a record's bytes narrowed to each field. Nothing is copied,
so writing through a view writes the cache; gathering, scattering and converting are
written once, over these views.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvspec.memory.cache_layout.registry import LayoutRef, get_layout
from kvspec.memory.cache_layout.shape import (
    CacheShape,
    LayerCache,
    cache_shape,
    side_tensors,
    stored_tensors,
)
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.planes import plane_views, side_view

# The per-tensor form every layout is read into [LAYOUT-2]: blocks, slots in a block,
# heads, head_dim (the record); a cross-layer tensor keeps its layers axis first.
_CANONICAL = ("layers", "blocks", "slots", "heads", "dim")


def _canonical(tensor: torch.Tensor, axes: Sequence[str], block_size: int | None) -> torch.Tensor:
    """Permute ``tensor`` to [layers?, blocks, slots, heads, dim], unmerging a token axis and
    inserting size-1 axes it lacks (a layers axis only when it has one)."""
    if "tokens" in axes:
        assert block_size is not None
        at = list(axes).index("tokens")
        tensor = tensor.unflatten(at, (-1, block_size))
        axes = [*axes[:at], "blocks", "slots", *axes[at + 1 :]]
    order = [a for a in _CANONICAL if a in axes]
    view = tensor.permute([list(axes).index(a) for a in order])
    wanted = _CANONICAL if "layers" in axes else _CANONICAL[1:]
    for i, axis in enumerate(wanted):
        if axis not in axes:
            view = view.unsqueeze(i)
    return view


def canonical_records(
    cache: LayerCache, spec: CacheLayout, block_size: int | None
) -> tuple[list[torch.Tensor], CacheShape, str]:
    """Each part's cells as a view [layers?, blocks, slots, heads, dim]: whole records."""
    shape = cache_shape(cache, spec, block_size=block_size)
    tensors, dtype = stored_tensors(cache, spec)
    if spec.kv_axis is not None:
        axes = [a for a in spec.axes if a != "kv"]
        stored = [tensors[0].select(spec.kv_axis, k) for k in range(2)]
    else:
        axes, stored = list(spec.axes), list(tensors)
    page = spec.page_size(shape.block_size)
    return [_canonical(t, axes, page) for t in stored], shape, dtype


def field_views(
    cache: LayerCache, layout: LayoutRef, *, block_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Every field of ``cache``'s cells, each a view in its own dtype [LAYOUT-5, LAYOUT-6].

    Each view is ``[num_blocks, block_size, heads, width]`` (``[layers, ...]`` first for a
    cross-layer cache); K and V of a stacked or tuple layout are the fields ``k`` and
    ``v``, a latent ``latent``; inline scales are fields of their own. Nothing is copied.
    """
    spec = get_layout(layout)
    if spec.scaled:
        return _scaled_views(cache, spec, block_size)
    records, shape, dtype = canonical_records(cache, spec, block_size)
    out: dict[str, torch.Tensor] = {}
    for part, canon in zip(spec.parts(len(records)), records, strict=True):
        resolved = [f.resolve(dtype, shape.head_dim) for f in part]
        if all(FIELD_DTYPES[d] == canon.dtype for d, _ in resolved):
            start = 0
            for f, (_, width) in zip(part, resolved, strict=True):
                out[f.name] = canon.narrow(-1, start, width)
                start += width
            continue
        raw = canon.view(torch.uint8)  # the record's bytes: fields of several dtypes
        start = 0
        for f, (name, width) in zip(part, resolved, strict=True):
            size = width * FIELD_DTYPES[name].itemsize
            out[f.name] = raw.narrow(-1, start, size).view(FIELD_DTYPES[name])
            start += size
    return out


def _scaled_views(
    cache: LayerCache, spec: CacheLayout, block_size: int | None
) -> dict[str, torch.Tensor]:
    """Every field of a block-scaled cache: planes of its blocks, K and V of its tuple, and
    its side tensors, in the order of :meth:`CacheLayout.fields` [LAYOUT-8]."""
    shape = cache_shape(cache, spec, block_size=block_size)
    tensors, dtype = stored_tensors(cache, spec)
    views: dict[str, torch.Tensor] = {}
    if spec.planes:
        views.update(
            plane_views(
                tensors[0],
                spec,
                dtype,
                shape.num_blocks,
                shape.block_size,
                shape.heads,
                shape.head_dim,
            )
        )
    else:
        axes = list(spec.axes)
        for name, tensor in zip(("k", "v"), tensors, strict=True):
            views[name] = _canonical(tensor, axes, shape.block_size)
    sides = side_tensors(cache, spec) if spec.side else ()
    for tensor, side in zip(sides, spec.side, strict=True):
        views[side.field.name] = side_view(tensor, side, dtype, shape.block_size, shape.head_dim)
    return {f.name: views[f.name] for f in spec.fields(shape.kv)}


def kv_views(
    cache: LayerCache, layout: LayoutRef, *, block_size: int | None = None
) -> tuple[torch.Tensor, ...]:
    """K and V (or the latent) of ``cache``, each a view [LAYOUT-2].

    Each is ``[num_blocks, block_size, heads, head_dim]`` (``[layers, ...]`` for a
    cross-layer cache); nothing is copied: every returned tensor shares the cache's
    storage. A token pool needs its ``block_size`` [LAYOUT-5]; inline scales are read with
    :func:`field_views` [LAYOUT-6].
    """
    spec = get_layout(layout)
    fields = field_views(cache, spec, block_size=block_size)
    if "k" in fields:
        return (fields["k"], fields["v"])
    if "latent" in fields:
        return (fields["latent"],)
    raise ValueError(
        f"a {spec.name} cell is a record of {', '.join(fields)}, not K and V or one latent "
        "of one dtype; read its fields with field_views [LAYOUT-6]"
    )


def layer_views(
    cache: torch.Tensor, layout: LayoutRef, *, block_size: int | None = None
) -> tuple[LayerCache, ...]:
    """Each layer of a cross-layer ``cache``: index i of its layers axis, a view in the
    layout's per-layer preset [LAYOUT-5]; where that preset is a tuple (K, V), the layer
    is the tuple of index 0 and 1 of the layout's K/V axis. A token pool needs its
    ``block_size``."""
    spec = get_layout(layout)
    if not spec.cross_layer:
        raise ValueError(f"layout {spec.name} has no layers axis; it holds one layer [LAYOUT-5]")
    cache_shape(cache, spec, block_size=block_size)
    at = spec.axes.index("layers")
    layers = [cache.select(at, i) for i in range(cache.shape[at])]
    assert spec.per_layer is not None
    if spec.kv_axis is None or not spec.layer_layout.tuple_form:
        return tuple(layers)
    kv = [a for a in spec.axes if a != "layers"].index("kv")
    return tuple((layer.select(kv, 0), layer.select(kv, 1)) for layer in layers)
