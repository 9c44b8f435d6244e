"""Mutants of block-scaled layouts [LAYOUT-8].

Each re-reads the rule text with one slip a field engineer makes: vLLM's NVFP4 page
split like its per-token-head fp8 record ([K values | K scales] per head slot); a split
slot axis read whole (V scales linear like K's, the 32 x 4 interleave read as 128 rows);
the V swizzle applied to K's scales too; K's and V's side tensors swapped; a head_dim
or block size the layout cannot hold read anyway.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import field_views, get_layout
from kvspec.memory.layout_model import CacheLayout, Plane, SideField


def _split_like(unsplit: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict:
    """Each field read the mutant's way, in the shape the rule's read has (a mutant that
    reads slots in the wrong order still hands back tensors of the right shape)."""
    out = {}
    for name, view in unsplit.items():
        shape = want[name].shape
        out[name] = view.reshape(shape) if view.shape != shape else view
    return out


@mutant("LAYOUT-8.1")
class Nvfp4PageReadAsCells(ReferenceAdapter):
    """Reads vLLM's NVFP4 page as cells, like its per-token-head fp8 record: head slot j < H
    holds K's [values | scales], j >= H V's, instead of four planes per block."""

    def read_fields(self, cache, layout, *, page_size=None):
        want = super().read_fields(cache, layout, page_size=page_size)  # the refusals
        spec = get_layout(layout)
        if not spec.planes:
            return want
        heads = cache.shape[1] // 2
        data = want["k"].shape[-1]
        out = {}
        for part, rows in (("k", cache[:, :heads]), ("v", cache[:, heads:])):
            cells = rows.permute(0, 2, 1, 3)  # [blocks, slots, heads, record]
            out[part] = cells[..., :data]
            scale = want[f"{part}_scale"]
            out[f"{part}_scale"] = cells[..., data:].view(scale.dtype)
        return _split_like(out, want)


def _whole(plane: Plane) -> Plane:
    axes = [a for a in plane.axes if a != "slots_lo"]
    return Plane(plane.field, tuple("slots" if a == "slots_hi" else a for a in axes), None)


@mutant("LAYOUT-8.2")
class SplitSlotsReadWhole(ReferenceAdapter):
    """Reads a split slot axis as one: vLLM's SM100 V scales linear like K's, SGLang's
    [32, 4] interleave as 128 rows in storage order (slot t at t, not at [t % 32, t // 32])."""

    def read_fields(self, cache, layout, *, page_size=None):
        want = super().read_fields(cache, layout, page_size=page_size)
        spec = get_layout(layout)
        flat = replace(
            spec,
            name=f"{spec.name}-whole",
            planes=tuple(_whole(p) if p.split else p for p in spec.planes),
            side=tuple(
                SideField(s.field, s.of, _whole(s.plane)) if s.plane.split else s for s in spec.side
            ),
        )
        return _split_like(field_views(cache, flat, block_size=page_size), want)


@mutant("LAYOUT-8.2")
class SwizzleOnKScalesToo(ReferenceAdapter):
    """Applies the SM100 4-token V-scale swizzle to K's scales as well, where only V's
    plane is split."""

    def read_fields(self, cache, layout, *, page_size=None):
        want = super().read_fields(cache, layout, page_size=page_size)
        spec = get_layout(layout)
        split = [p for p in spec.planes if p.split]
        if not split:
            return want
        both = replace(
            spec,
            name=f"{spec.name}-both",
            planes=tuple(
                Plane(p.field, split[0].axes, split[0].unit) if p.field.endswith("scale") else p
                for p in spec.planes
            ),
        )
        read = field_views(cache, both, block_size=page_size)
        return {
            n: v.flatten(1, 2) if v.dim() == 5 and want[n].dim() == 4 else v
            for n, v in read.items()
        }


@mutant("LAYOUT-8.3")
class SideScalesSwapped(ReferenceAdapter):
    """Takes K's scales from V's side tensor and V's from K's (the scale buffers listed K's
    then V's, indexed the other way round)."""

    def read_fields(self, cache, layout, *, page_size=None):
        want = super().read_fields(cache, layout, page_size=page_size)
        if not get_layout(layout).side:
            return want
        k, v, ks, vs, *rest = cache
        return field_views((k, v, vs, ks, *rest), layout, block_size=page_size)


@mutant("LAYOUT-8.4")
class ChecksOnlyTheDataWidth(ReferenceAdapter):
    """Checks what vLLM's kernel checks (head_size a multiple of 16) and no more: a head_dim
    off the swizzle's 64 (or MXFP8's 32), or a page size other than 128, is read anyway."""

    def read_fields(self, cache, layout, *, page_size=None):
        spec = get_layout(layout)
        if not spec.scaled:
            return super().read_fields(cache, layout, page_size=page_size)
        loose: CacheLayout = replace(
            spec, name=f"{spec.name}-loose", fixed_block_size=None, head_dim_multiple=None
        )
        return field_views(cache, loose, block_size=page_size)
