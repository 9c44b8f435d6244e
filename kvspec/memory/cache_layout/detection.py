"""Which layout a cache is in, answered only when its shape allows one answer [LAYOUT-4].

Layouts share shapes: a stacked cache of exactly two blocks fits both flash_attn and
flashinfer, a head count equal to block_size fits an NHD and an HND variant. So
:func:`detect_layout` names a layout only when exactly one per-layer preset fits the
cache and what the caller states of it; otherwise it refuses, listing every candidate
with what it would read, and asks for the name. It never guesses and never reads
strides. (:mod:`kvspec.memory.layout_readings` lists every reading, cross-layer presets
and layout files included.)
"""

from __future__ import annotations

import torch

from kvspec.core.require import require_int
from kvspec.memory.cache_layout.shape import CacheShape, LayerCache, cache_shape, describe_cache
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.presets import PRESETS
from kvspec.tensors.dtypes import dtype_name


def read_as(
    cache: LayerCache,
    spec: CacheLayout,
    *,
    heads: int | None,
    head_dim: int | None,
    block_size: int | None,
) -> tuple[CacheShape, bool] | None:
    """How ``cache`` reads as ``spec`` [LAYOUT-4]: its shape, and whether the block size was
    guessed (a layout that merges blocks and slots, read without one, is read with
    block size 1); None where ``cache`` cannot be that layout."""
    guessed = spec.merged_tokens and block_size is None
    try:
        shape = cache_shape(
            cache,
            spec,
            heads=heads,
            head_dim=head_dim,
            block_size=(1 if guessed else block_size) if spec.paged else None,
        )
    except ValueError:
        return None
    return shape, guessed


def detect_layout(
    cache: LayerCache,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
    block_size: int | None = None,
) -> str:
    """The one layout ``cache`` fits, given what is known of it [LAYOUT-4].

    Refuses, listing the candidates, when several layouts fit, and when none does.
    ``heads``, ``head_dim`` and (for paged layouts) ``block_size`` narrow the candidates;
    state all that is known. Every per-layer preset is a candidate; a token pool, whose
    page size is not in its shape, fits with the stated block size or, unstated, with any.
    """
    stated = {"heads": heads, "head_dim": head_dim, "block_size": block_size}
    for name, value in stated.items():
        if value is not None:
            require_int(name, value, minimum=1)
    tensors = cache if isinstance(cache, (tuple, list)) else (cache,)
    elements = {FIELD_DTYPES[s.element] for s in PRESETS.values() if s.element}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.dtype not in elements:
            dtype_name(tensor.dtype)  # a disallowed dtype is named as such [DTYPE-1]
    fits: list[tuple[str, CacheShape, bool]] = []
    for name, spec in PRESETS.items():
        if spec.cross_layer:
            continue
        read = read_as(cache, spec, heads=heads, head_dim=head_dim, block_size=block_size)
        if read is not None:
            fits.append((name, *read))
    known = ", ".join(f"{k}={v}" for k, v in stated.items() if v is not None)
    given = f"a {describe_cache(cache)}" + (f" with {known}" if known else "")
    if len(fits) == 1:
        return fits[0][0]
    if not fits:
        shapes = "; ".join(f"{n} {spec.shape}" for n, spec in PRESETS.items())
        raise ValueError(f"{given} fits no cache layout; the layouts are: {shapes} [LAYOUT-4]")
    readings = "; ".join(
        f"{n} (num_blocks={s.num_blocks}, block_size={s.block_size}, heads={s.heads})"
        if not guessed
        else f"{n} (a token pool of {s.slots} rows: any page size that divides them, "
        f"heads={s.heads})"
        for n, s, guessed in fits
    )
    raise ValueError(
        f"{given} is ambiguous: it fits {len(fits)} layouts: {readings}. The shape cannot "
        f"tell them apart, so name the layout (one of {', '.join(repr(n) for n, _, _ in fits)}) "
        "[LAYOUT-4]"
    )
