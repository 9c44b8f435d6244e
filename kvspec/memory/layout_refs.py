"""A layout named by its file: wherever a preset name is taken, a layout file's path is too.

A layout reference is a preset name (``flash_attn``) or the path of a layout file
(anything ending in ``.json``; no preset name has a dot, so the two never meet). A file
is checked against the presets: its ``per_layer`` must name one, and its name may be a
preset's only when it describes that very preset [LAYOUT-1, LAYOUT-5, SLAYOUT-1].

Reading a file changes no state but a cache of what was read, keyed by (path,
modification time, size): the value returned is the layout, and whoever reads it holds it
and hands it on. Its name is not registered anywhere, so a file's layout is never found
by its name; the value remembers its file (:attr:`CacheLayout.origin`), which is how it is
written back where a configuration is serialized (:attr:`CacheLayout.ref`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from kvspec.memory.layout_files import LayoutFileError, is_layout_file, read_layout_file
from kvspec.memory.layout_model import CacheLayout, StateCacheLayout
from kvspec.memory.presets import PRESETS

__all__ = ["is_layout_file", "read_cache_file", "read_file", "read_state_file"]


def read_file(path: str | Path) -> CacheLayout | StateCacheLayout:
    """The layout (cache or state) in the file at ``path`` [LAYOUT-5, SLAYOUT-1]; a cache
    layout remembers ``path`` as its :attr:`~CacheLayout.origin`."""
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
        return dataclasses.replace(layout, origin=path)
    return layout


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
