"""The named cache layouts: each a :class:`CacheLayout` value with the source it was read from.

Every preset was checked against the engine's own shape code, in the release named
in its :class:`Source` (wheels downloaded from PyPI and read, or the repository read
through a code search where no wheel exists); what was not confirmed there is said in
``unconfirmed``. Nothing here is engine code: each entry states, as data, the shape,
the stride order and the record an engine's function produces [LAYOUT-5].

Engines name layouts by stride order: NHD keeps a block's slots outside its heads
(``[.., block_size, heads, head_dim]``), HND the reverse. vLLM ≥ 0.33 states one
logical shape ``[L, B, H, N, C]`` (layers, blocks, heads, slots, content bytes) and a
stride permutation per layout (``vllm/v1/kv_cache_layout.py``); kvspec stores every
tensor in its physical order and keeps the engine's logical order beside it.

Each preset is a layout file shipped in the package, ``kvspec/memory/layouts/presets/
NAME.json`` (:mod:`kvspec.memory.layout_files` reads it, under the schema beside it);
``kvspec/memory/layouts/index.json`` lists them in the order they are listed
everywhere. :data:`LAYOUT_PRESETS` and :data:`STATE_LAYOUT_PRESETS` are those files read
once, at import; :data:`PRESETS` and :data:`STATE_PRESETS` name them in the same order.
Adding a preset is adding its file and its name in the index.
"""

from __future__ import annotations

import json
from importlib import resources

from kvspec.memory.layout_files import layout_from_json
from kvspec.memory.layout_model import CacheLayout, StateCacheLayout

_ROOT = resources.files("kvspec.memory").joinpath("layouts")
_SHOWN = "kvspec/memory/layouts/presets"


def _read(name: str, known: dict[str, CacheLayout]) -> CacheLayout | StateCacheLayout:
    """The preset file of ``name``, read as any layout file is [LAYOUT-5, SLAYOUT-1]."""
    where = f"{_SHOWN}/{name}.json"
    layout = layout_from_json(
        _ROOT.joinpath("presets", f"{name}.json").read_bytes(), where, known=known
    )
    if layout.name != name:
        raise ValueError(f"layout file {where}: field 'name' is {layout.name!r}, not {name!r}")
    return layout


def _load() -> tuple[tuple[CacheLayout, ...], tuple[StateCacheLayout, ...]]:
    """Every preset file, in the index's order; a per-layer preset before its users."""
    index = json.loads(_ROOT.joinpath("index.json").read_text("utf-8"))
    known: dict[str, CacheLayout] = {}
    for name in index["layouts"]:
        layout = _read(name, known)
        if not isinstance(layout, CacheLayout):
            raise ValueError(f"layout file {_SHOWN}/{name}.json: field 'kind' must be 'cache'")
        known[name] = layout
    states = []
    for name in index["state_layouts"]:
        state = _read(name, known)
        if not isinstance(state, StateCacheLayout):
            raise ValueError(f"layout file {_SHOWN}/{name}.json: field 'kind' must be 'state'")
        states.append(state)
    return tuple(known.values()), tuple(states)


LAYOUT_PRESETS, STATE_LAYOUT_PRESETS = _load()
"""The cache layout presets, then the state-cache layout presets, in the index's order:
adding a preset is adding its file, with the source it was confirmed in
[LAYOUT-1, LAYOUT-5, LAYOUT-6, SLAYOUT-1]."""

PRESETS: dict[str, CacheLayout] = {layout.name: layout for layout in LAYOUT_PRESETS}
"""Every named layout, in the order candidates are listed [LAYOUT-1, LAYOUT-5]."""

STATE_PRESETS: dict[str, StateCacheLayout] = {
    layout.name: layout for layout in STATE_LAYOUT_PRESETS
}
"""Every named state-cache layout [SLAYOUT-1]."""
