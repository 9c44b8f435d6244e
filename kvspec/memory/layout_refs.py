"""A layout named by its file: wherever a preset name is taken, a layout file's path is too.

A layout reference is a preset name (``flash_attn``) or the path of a layout file
(anything ending in ``.json``; no preset name has a dot, so the two never meet). A file
is read once per process for each (path, modification time, size) and checked against
the presets: its ``per_layer`` must name one, and its name may be a preset's only when
it describes that very preset [LAYOUT-1, LAYOUT-5, SLAYOUT-1]. Every process that is
handed the same path reads the same file, so a reference crosses process boundaries as
the string it is.

Once read, a file's cache layout is also known by its name in that process
(:func:`read_name`), as a preset's is, since values made from a layout keep its name
(a paged cache, a registered region). Two files that give one name to two different
layouts are refused: which one the name means would be ambiguous.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from kvspec.memory.layout_files import LayoutFileError, is_layout_file, read_layout_file
from kvspec.memory.layout_model import CacheLayout, StateCacheLayout
from kvspec.memory.presets import PRESETS

__all__ = ["is_layout_file", "read_cache_file", "read_file", "read_name", "read_state_file"]

_BY_NAME: dict[str, tuple[str, CacheLayout]] = {}
"""The cache layouts of the files read in this process, by name: (path, layout)."""


def read_file(path: str | Path) -> CacheLayout | StateCacheLayout:
    """The layout (cache or state) in the file at ``path`` [LAYOUT-5, SLAYOUT-1]."""
    try:
        stat = os.stat(path)
    except OSError as error:
        raise LayoutFileError(
            f"layout file {path}: cannot be read: {error.strerror or error}"
        ) from None
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int, size: int) -> CacheLayout | StateCacheLayout:
    del mtime_ns, size  # the cache's key: an edited file is read again
    layout = read_layout_file(path, known=PRESETS)
    if isinstance(layout, CacheLayout):
        seen = _BY_NAME.get(layout.name)
        if seen is not None and seen[0] != path and seen[1] != layout:
            raise LayoutFileError(
                f"layout file {path}: field 'name' is {layout.name!r}, the name of another "
                f"layout, read from {seen[0]}: which one the name means would be ambiguous; "
                "give each layout a name of its own"
            )
        _BY_NAME[layout.name] = (path, layout)
    return layout


def read_name(name: str) -> CacheLayout | None:
    """The cache layout called ``name`` among the files read in this process, or None."""
    seen = _BY_NAME.get(name)
    return seen[1] if seen else None


def read_cache_file(path: str | Path) -> CacheLayout:
    """The cache layout in the file at ``path``; a state layout's file is refused [LAYOUT-5]."""
    layout = read_file(path)
    if not isinstance(layout, CacheLayout):
        raise LayoutFileError(
            f"layout file {path}: field 'kind' is 'state': it holds a state-cache layout, "
            "and a KV cache layout ('cache') is wanted here"
        )
    return layout


def read_state_file(path: str | Path) -> StateCacheLayout:
    """The state-cache layout in the file at ``path``; a KV layout's is refused [SLAYOUT-1]."""
    layout = read_file(path)
    if not isinstance(layout, StateCacheLayout):
        raise LayoutFileError(
            f"layout file {path}: field 'kind' is 'cache': it holds a KV cache layout, and a "
            "state-cache layout ('state') is wanted here"
        )
    return layout
