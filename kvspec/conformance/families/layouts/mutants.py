"""Mutants of reading, converting and detecting cache layouts [LAYOUT-1..4]."""

from __future__ import annotations

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import LAYOUTS, convert, detect_layout, get_layout, kv_views


@mutant("LAYOUT-1.1")
class ReadsHndAsNhd(ReferenceAdapter):
    """Ignores the HND variants: reads heads where block slots are."""

    def read_layer(self, cache, layout, **facts):
        if layout.endswith("_hnd"):
            return tuple(v.transpose(1, 2) for v in super().read_layer(cache, layout, **facts))
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-1.1")
class ReadsStackedByShape(ReferenceAdapter):
    """Reads a stacked cache by where the axis of size 2 is (the field's normalize_layer_kv),
    whatever the name says: a flashinfer cache of two blocks reads as flash_attn."""

    def read_layer(self, cache, layout, **facts):
        if isinstance(cache, torch.Tensor) and cache.dim() == 5 and layout != "mla":
            guess = "flash_attn" if cache.shape[0] == 2 else "flashinfer"
            if layout.endswith("_hnd"):
                guess += "_hnd"
            return kv_views(cache, guess, **facts)
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-1.2")
class UnknownNameReadAsFlashAttn(ReferenceAdapter):
    """Looks layouts up with a default: an unknown name reads as flash_attn (or the one
    the cache fits)."""

    def read_layer(self, cache, layout, **facts):
        if layout not in LAYOUTS:
            for name in ("flash_attn", *LAYOUTS):
                try:
                    return kv_views(cache, name, **facts)
                except ValueError:
                    continue
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-1.3")
class KvAxisSizeUnchecked(ReferenceAdapter):
    """Takes index 0 and 1 of the K/V axis without checking the axis has size 2."""

    def read_layer(self, cache, layout, **facts):
        spec = get_layout(layout)
        stacked = spec.kv_axis is not None and isinstance(cache, torch.Tensor)
        if stacked and cache.dim() == 5 and cache.shape[spec.kv_axis] > 2:
            cache = cache.narrow(spec.kv_axis, 0, 2)
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-1.3")
class TupleShapesUnchecked(ReferenceAdapter):
    """Reads a (K, V) tuple without comparing the two shapes (V read to K's shape)."""

    def read_layer(self, cache, layout, **facts):
        if isinstance(cache, tuple) and len(cache) == 2 and cache[0].shape != cache[1].shape:
            k, v = cache
            if v.dim() == k.dim():
                v = v[tuple(slice(0, n) for n in k.shape)]
                return super().read_layer((k, v), layout, **facts)
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-1.3")
class SqueezesLeadingDims(ReferenceAdapter):
    """Squeezes a leading axis of size 1 away, so a cache of the wrong rank is read."""

    def read_layer(self, cache, layout, **facts):
        if isinstance(cache, tuple):
            cache = tuple(t.squeeze(0) if t.dim() > 1 and t.shape[0] == 1 else t for t in cache)
        elif cache.dim() > 1 and cache.shape[0] == 1:
            cache = cache.squeeze(0)
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-2.1")
class ReadsByCopy(ReferenceAdapter):
    """Returns contiguous copies instead of views."""

    def read_layer(self, cache, layout, **facts):
        return tuple(v.clone() for v in super().read_layer(cache, layout, **facts))


@mutant("LAYOUT-2.1")
class CopiesHndLayouts(ReferenceAdapter):
    """Calls ``.contiguous()`` on what it reads: a copy for every layout whose K and V are
    not already contiguous (the HND variants, flashinfer, a stacked cache's V)."""

    def read_layer(self, cache, layout, **facts):
        return tuple(v.contiguous() for v in super().read_layer(cache, layout, **facts))


@mutant("LAYOUT-2.2")
class TokenMajorReadAsOneBlock(ReferenceAdapter):
    """Reads a token-major cache as one block of seq slots, not seq blocks of one slot."""

    def read_layer(self, cache, layout, **facts):
        views = super().read_layer(cache, layout, **facts)
        if layout == "token_major":
            return tuple(v.transpose(0, 1) for v in views)
        return views


@mutant("LAYOUT-3.1")
class ConvertsHndByReshape(ReferenceAdapter):
    """Converts into an HND layout by reshaping the NHD result (heads and slots exchange
    sizes, not values): right only when one of them is 1."""

    def convert_layout(self, cache, source, target, **facts):
        if target.endswith("_hnd") and source != target:
            nhd = super().convert_layout(cache, source, target[: -len("_hnd")], **facts)
            reference = super().convert_layout(cache, source, target, **facts)
            return nhd.reshape(reference.shape).clone()
        return super().convert_layout(cache, source, target, **facts)


@mutant("LAYOUT-3.2")
class SameLayoutNotCopied(ReferenceAdapter):
    """Returns the cache itself when source and target layouts are the same."""

    def convert_layout(self, cache, source, target, **facts):
        if source == target:
            return cache
        return super().convert_layout(cache, source, target, **facts)


@mutant("LAYOUT-3.3")
class KeyOnlyIntoLatent(ReferenceAdapter):
    """Converts K and V into a latent layout by keeping K (V is dropped)."""

    def convert_layout(self, cache, source, target, **facts):
        src, dst = get_layout(source), get_layout(target)
        if src.kv_tensors == 2 and dst.kv_tensors == 1:
            # [blocks, slots, heads, dim]: heads x dim as latent
            k = kv_views(cache, source, **facts)[0]
            return convert(k.reshape(*k.shape[:2], -1).clone(), "mla", target)
        return super().convert_layout(cache, source, target, **facts)


@mutant("LAYOUT-4.1")
class TupleAlwaysKvTuple(ReferenceAdapter):
    """Detects every (K, V) tuple as kv_tuple: a token-major tuple is misread."""

    def detect_layout(self, cache, **known):
        if isinstance(cache, tuple) and len(cache) == 2:
            return "kv_tuple"
        return super().detect_layout(cache, **known)


@mutant("LAYOUT-4.2")
class GuessesLayoutFromShape(ReferenceAdapter):
    """Detects a stacked cache by which axis has size 2, as shape-guessing readers do."""

    def detect_layout(self, cache, **known):
        if isinstance(cache, tuple):
            return super().detect_layout(cache, **known)
        if cache.dim() == 5 and cache.shape[0] == 2:
            return "flash_attn"
        if cache.dim() == 5 and cache.shape[1] == 2:
            return "flashinfer"
        return super().detect_layout(cache, **known)


@mutant("LAYOUT-4.2")
class PrefersNhdWhenAmbiguous(ReferenceAdapter):
    """When an NHD and an HND variant both fit, answers the NHD one."""

    def detect_layout(self, cache, **known):
        try:
            return super().detect_layout(cache, **known)
        except ValueError as error:
            fits = [n for n in LAYOUTS if f"{n} (" in str(error)]
            nhd = [n for n in fits if f"{n}_hnd" in fits]
            if len(fits) == 2 and len(nhd) == 1:
                return nhd[0]
            raise


@mutant("LAYOUT-4.3")
class IgnoresStatedBlockSize(ReferenceAdapter):
    """Narrows the candidates by the stated heads and head_dim, not by the block size."""

    def detect_layout(self, cache, **known):
        known = {k: v for k, v in known.items() if k != "block_size"}
        return super().detect_layout(cache, **known)


@mutant("LAYOUT-4.4")
class StatedFactsBreakTiesOnly(ReferenceAdapter):
    """Uses the stated facts only to choose among several fits: when the shape alone gives
    one layout it answers it, even if it contradicts what the caller stated."""

    def detect_layout(self, cache, **known):
        try:
            return detect_layout(cache)
        except ValueError:
            return super().detect_layout(cache, **known)


@mutant("LAYOUT-4.4")
class NoFitReadAsFlashAttn(ReferenceAdapter):
    """Answers flash_attn for a tensor no layout fits, the engine's usual layout."""

    def detect_layout(self, cache, **known):
        try:
            return super().detect_layout(cache, **known)
        except ValueError as error:
            if "fits no cache layout" in str(error):
                return "flash_attn"
            raise


@mutant("LAYOUT-4.2", "LAYOUT-4.4", unclear=True)
class DetectionRefusedWithoutCandidates(ReferenceAdapter):
    """Refuses a cache that fits several layouts, or none, as it must, with "cannot detect
    the cache layout; pass it by name", listing neither the candidates nor the layouts'
    shapes the clause asks for."""

    def detect_layout(self, cache, **known):
        try:
            return super().detect_layout(cache, **known)
        except ValueError:
            raise ValueError("cannot detect the cache layout; pass it by name") from None
