"""Every layout a tensor of a given shape could be, and what it would hold under each
[LAYOUT-4, LAYOUT-5].

:func:`~kvspec.memory.cache_layout.detect_layout` answers only when one per-layer
layout fits. This module lists them all — cross-layer presets and layout files
included — each with the reading it gives (blocks, block size, heads, head_dim,
layers), so that two layouts with identical shapes are seen side by side (with as
many KV heads as blocks, vLLM's LBHNC and LHBNC pages have one shape). A
shape is judged under each layout in that layout's own element type: the bytes it
stores records as, else one of the cache dtypes it holds, else the one asked for.
Nothing is allocated (meta tensors).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from kvspec.memory.cache_layout import PRESETS, CacheShape, read_as
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout


@dataclass(frozen=True)
class Reading:
    """One layout a shape fits, and what the cache holds read that way [LAYOUT-4]."""

    layout: str
    dtype: str
    shape: CacheShape
    page_size_stated: bool
    """False for a token pool read with no block size given: any page size that divides
    its rows fits, and the reading shows one row per block."""


def _element(layout: CacheLayout, dtype: str) -> tuple[str, str]:
    """(tensor dtype, cache dtype) a shape is judged in under ``layout``."""
    if layout.element is not None:
        assert layout.dtypes is not None
        return layout.element, layout.dtypes[0]
    if layout.dtypes is not None and dtype not in layout.dtypes:
        return layout.dtypes[0], layout.dtypes[0]
    return dtype, dtype


def readings(
    shapes: Sequence[Sequence[int]],
    *,
    dtype: str = "bfloat16",
    heads: int | None = None,
    head_dim: int | None = None,
    block_size: int | None = None,
    layouts: Iterable[CacheLayout] | None = None,
) -> list[Reading]:
    """Every layout of ``layouts`` (every preset by default) that a cache of one tensor
    (``shapes`` of one shape) or a tuple of tensors fits, in the presets' order
    [LAYOUT-4, LAYOUT-5]. ``heads``, ``head_dim`` and ``block_size`` narrow it."""
    if not shapes or any(not s or any(d < 0 for d in s) for s in shapes):
        raise ValueError(f"shapes {list(map(list, shapes))}: each shape needs sizes >= 0")
    found = []
    for spec in PRESETS.values() if layouts is None else layouts:
        element, cache_dtype = _element(spec, dtype)
        tensors = tuple(
            torch.empty(tuple(s), dtype=FIELD_DTYPES[element], device="meta") for s in shapes
        )
        cache = tensors if spec.tuple_form or len(tensors) > 1 else tensors[0]
        read = read_as(cache, spec, heads=heads, head_dim=head_dim, block_size=block_size)
        if read is not None:
            shape, guessed = read
            found.append(Reading(spec.name, cache_dtype, shape, not guessed))
    return found
