"""The presets by what their cells hold, and a layout by its name [LAYOUT-1, LAYOUT-5].

A layout is named by a preset (:data:`~kvspec.memory.presets.PRESETS`, every one a
layout file shipped in the package) or by the path of a layout file. :func:`get_layout`
turns either into its :class:`~kvspec.memory.layout_model.CacheLayout` value, refusing an
unknown name with the known ones. The groups below sort the presets by what a cell
holds, read from each preset's own fields, so no code lists the presets by name.
"""

from __future__ import annotations

from typing import TypeAlias

from kvspec.memory.layout_model import CacheLayout
from kvspec.memory.layout_refs import is_layout_file, read_cache_file
from kvspec.memory.presets import PRESETS

LayoutRef: TypeAlias = "str | CacheLayout"
"""A public function's layout argument: the value, or the reference its caller writes (a
preset's name, a layout file's path), which the function resolves once with
:func:`get_layout` as it comes in [LAYOUT-1, LAYOUT-5]. Configurations and caches hold the
value; only a parameter declared a ``LayoutRef`` (or a parse boundary) resolves a name
(``tests/spec/test_layout_values.py`` holds the package to it)."""

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
    """The layout a reference names: the preset called ``name``, or the layout in the layout
    file ``name`` (a path ending in ``.json``); a :class:`CacheLayout` is its own value.
    Unknown names are refused with the known ones [LAYOUT-1, LAYOUT-5].

    This is where a layout's name is parsed: call it where a reference comes in (a command
    line, a file, a ``from_dict``, an adapter's inputs) and hand the value on from there.
    A layout file's name is no reference: reading a file registers nothing."""
    if isinstance(name, CacheLayout):
        return name
    if isinstance(name, str) and name not in PRESETS and is_layout_file(name):
        return read_cache_file(name)
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(
            f"unknown cache layout {name!r}; the layouts are {', '.join(PRESETS)} [LAYOUT-1]"
        )
    return PRESETS[name]


def require_layout(where: str, value: object) -> CacheLayout:
    """``value``, which must be a :class:`CacheLayout` value: what a configuration or cache
    carries. A name is refused, naming it: it is resolved (:func:`get_layout`) where it was
    read, and the value handed on [LAYOUT-1, LAYOUT-5]."""
    if not isinstance(value, CacheLayout):
        raise TypeError(
            f"{where} is a CacheLayout value, got {value!r:.80}: resolve a layout's name or "
            "file where it is read (kvspec.memory.cache_layout.get_layout) and pass the value"
        )
    return value


def layouts_for(attention: str, *, cross_layer: bool = False) -> tuple[str, ...]:
    """The layouts that can hold a model of attention kind ``attention`` ('mha' or 'mla'):
    the per-layer :data:`LAYOUTS`, and with ``cross_layer`` the plain cross-layer presets
    too (a paged cache holds those as one tensor) [LAYOUT-5]."""
    chosen = {**LAYOUTS, **(CROSS_LAYER if cross_layer else {})}
    return tuple(n for n, layout in chosen.items() if holds_attention(layout, attention))


def holds_attention(layout: LayoutRef, attention: str, *, cross_layer: bool = True) -> bool:
    """Whether ``layout`` (a preset or a layout file) is one of those :func:`layouts_for`
    would list for ``attention``: its cells hold only K and V (or a latent), of the kind's
    count, per layer or, with ``cross_layer``, in one tensor [LAYOUT-1, LAYOUT-5]."""
    spec = get_layout(layout)
    kv = 1 if attention == "mla" else 2
    return spec.plain and (cross_layer or not spec.cross_layer) and spec.kv_tensors in (kv, None)
