"""The presets by what their cells hold, and a layout by its name [LAYOUT-1, LAYOUT-5].

A layout is named by a preset (:data:`~kvspec.memory.presets.PRESETS`, every one a
layout file shipped in the package) or by the path of a layout file. :func:`get_layout`
turns either into its :class:`~kvspec.memory.layout_model.CacheLayout` value, refusing an
unknown name with the known ones. The groups below sort the presets by what a cell
holds, read from each preset's own fields, so no code lists the presets by name.
"""

from __future__ import annotations

from kvspec.memory.layout_model import CacheLayout
from kvspec.memory.layout_refs import is_layout_file, read_cache_file, read_name
from kvspec.memory.presets import PRESETS

LAYOUTS: dict[str, CacheLayout] = {
    name: layout for name, layout in PRESETS.items() if not layout.cross_layer and layout.plain
}
"""The per-layer presets whose cells hold only K and V (or a latent) in the cache's dtype
[LAYOUT-1]: what a payload carries, gathered and scattered. :data:`PRESETS` has every
preset, inline-scale and cross-layer ones included."""

CROSS_LAYER: dict[str, CacheLayout] = {
    name: layout for name, layout in PRESETS.items() if layout.cross_layer and layout.plain
}
"""The plain presets that keep every layer in one tensor [LAYOUT-5]."""

RECORDS: dict[str, CacheLayout] = {
    name: layout for name, layout in PRESETS.items() if not layout.plain and not layout.scaled
}
"""The presets whose cells are records with inline scales or fixed formats [LAYOUT-6]."""

SCALED: dict[str, CacheLayout] = {name: layout for name, layout in PRESETS.items() if layout.scaled}
"""The block-scaled presets, whose fields live in per-block planes or side tensors
[LAYOUT-8]: vLLM's NVFP4 pages, SGLang's MXFP8 pool."""


def get_layout(name: object) -> CacheLayout:
    """The preset called ``name``, or the layout in the layout file ``name`` (a path ending
    in ``.json``), or a layout file's read in this process by its name; unknown names are
    refused with the known ones [LAYOUT-1, LAYOUT-5]."""
    if isinstance(name, CacheLayout):
        return name
    if isinstance(name, str) and name not in PRESETS:
        if is_layout_file(name):
            return read_cache_file(name)
        read = read_name(name)  # a layout file's, read in this process [LAYOUT-5]
        if read is not None:
            return read
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(
            f"unknown cache layout {name!r}; the layouts are {', '.join(PRESETS)} [LAYOUT-1]"
        )
    return PRESETS[name]


def layouts_for(attention: str, *, cross_layer: bool = False) -> tuple[str, ...]:
    """The layouts that can hold a model of attention kind ``attention`` ('mha' or 'mla'):
    the per-layer :data:`LAYOUTS`, and with ``cross_layer`` the plain cross-layer presets
    too (a paged cache holds those as one tensor) [LAYOUT-5]."""
    chosen = {**LAYOUTS, **(CROSS_LAYER if cross_layer else {})}
    return tuple(n for n, layout in chosen.items() if holds_attention(layout, attention))


def holds_attention(layout: str | CacheLayout, attention: str, *, cross_layer: bool = True) -> bool:
    """Whether ``layout`` (a preset or a layout file) is one of those :func:`layouts_for`
    would list for ``attention``: its cells hold only K and V (or a latent), of the kind's
    count, per layer or, with ``cross_layer``, in one tensor [LAYOUT-1, LAYOUT-5]."""
    spec = get_layout(layout)
    kv = 1 if attention == "mla" else 2
    return spec.plain and (cross_layer or not spec.cross_layer) and spec.kv_tensors in (kv, None)
