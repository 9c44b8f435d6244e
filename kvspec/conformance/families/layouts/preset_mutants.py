"""Mutants of the layouts engines run now: re-blocking, token pools, cross-layer tensors and
inline scales [LAYOUT-3.4, LAYOUT-5, LAYOUT-6]."""

from __future__ import annotations

from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import (
    cache_shape,
    convert,
    empty_cache,
    field_views,
    get_layout,
    kv_views,
)
from kvspec.memory.layout_model import Field
from kvspec.tensors.dtypes import dtype_name


@mutant("LAYOUT-3.4")
class PadsTheLastBlock(ReferenceAdapter):
    """Re-blocks into a block size that does not divide the slots by rounding the number of
    blocks up and leaving the tail of the last block zero."""

    def convert_layout(self, cache, source, target, *, page_size=None, block_size=None):
        shape = cache_shape(cache, source, block_size=page_size)
        if block_size is None or shape.slots % block_size == 0:
            return super().convert_layout(
                cache, source, target, page_size=page_size, block_size=block_size
            )
        views = kv_views(cache, source, block_size=page_size)
        out_shape = replace(shape, num_blocks=-(-shape.slots // block_size), block_size=block_size)
        out = empty_cache(target, out_shape, dtype_name(views[0].dtype))
        page = get_layout(target).page_size(block_size)
        for have, want in zip(views, kv_views(out, target, block_size=page), strict=True):
            rows = have.reshape(*have.shape[:-4], -1, *have.shape[-2:])
            for slot in range(rows.shape[-3]):
                want[..., slot // block_size, slot % block_size, :, :] = rows[..., slot, :, :]
        return out


@mutant("LAYOUT-5.1")
class PackedReadInLogicalOrder(ReferenceAdapter):
    """Reads vLLM's NHD packed cache in the logical order its shape function states
    ([num_blocks, heads, block_size, 2*head_dim]), ignoring the stride order."""

    def read_layer(self, cache, layout, **facts):
        if layout == "vllm_packed_nhd":
            blocks, slots, heads, dim = cache.shape
            as_logical = cache.reshape(blocks, heads, slots, dim)
            return kv_views(as_logical, "vllm_packed_hnd")
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-5.1")
class PoolRowsSlotMajor(ReferenceAdapter):
    """Reads a token pool's rows as slot-major (row = slot * num_pages + page) instead of
    page-major."""

    def read_layer(self, cache, layout, *, page_size=None):
        views = super().read_layer(cache, layout, page_size=page_size)
        if get_layout(layout).merged_tokens and page_size:
            return tuple(
                v.reshape(v.shape[1], v.shape[0], *v.shape[2:]).transpose(0, 1) for v in views
            )
        return views


@mutant("LAYOUT-5.2")
class LayersAxisOutermost(ReferenceAdapter):
    """Indexes a cross-layer tensor as if its layers axis came first (vLLM's logical
    [L, B, ...] order), whatever the physical order puts first."""

    def read_layer(self, cache, layout, **facts):
        spec = get_layout(layout)
        if spec.cross_layer and spec.axes[0] != "layers":
            at = spec.axes.index("layers")
            sizes = list(cache.shape)
            sizes[0], sizes[at] = sizes[at], sizes[0]
            return kv_views(cache.reshape(sizes), spec, block_size=facts.get("page_size"))
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-5.2")
class PageMajorEntryAsKThenV(ReferenceAdapter):
    """Reads SGLang's page-major entry ``[K_0 | V_0 | K_1 | V_1 | ...]`` as every layer's K
    then every layer's V (``[K_0 | K_1 | ... | V_0 | V_1 | ...]``), the order of a pool
    whose K/V axis lies outside its layers axis."""

    def read_layer(self, cache, layout, **facts):
        spec = get_layout(layout)
        at = spec.axes.index("layers") if spec.cross_layer else -1
        if at >= 0 and spec.axes[at + 1 : at + 2] == ("kv",):
            sizes = list(cache.shape)
            sizes[at], sizes[at + 1] = sizes[at + 1], sizes[at]
            as_k_then_v = cache.reshape(sizes).transpose(at, at + 1)
            return kv_views(as_k_then_v, spec, block_size=facts.get("page_size"))
        return super().read_layer(cache, layout, **facts)


@mutant("LAYOUT-5.3")
class PoolPageSizeDefaultsToOne(ReferenceAdapter):
    """Reads a token pool whose page size was not stated with page size 1, SGLang's
    default, and floors a page size that does not divide the rows."""

    def read_layer(self, cache, layout, *, page_size=None):
        if get_layout(layout).merged_tokens:
            rows = (cache[0] if isinstance(cache, tuple) else cache).shape[0]
            page = page_size or 1
            if rows % page:
                cut = rows - rows % page
                cache = tuple(t[:cut] for t in cache) if isinstance(cache, tuple) else cache[:cut]
            return super().read_layer(cache, layout, page_size=page)
        return super().read_layer(cache, layout, page_size=page_size)


def _pth_scales_last(layout: str):
    """The per-token-head record read with both scales after both data halves."""
    spec = get_layout(layout)
    return replace(
        spec,
        record=(
            Field("k"),
            Field("v"),
            Field("k_scale", "float32", 1),
            Field("v_scale", "float32", 1),
        ),
    )


@mutant("LAYOUT-6.1")
class ScalesAfterBothHalves(ReferenceAdapter):
    """Reads a per-token-head record as [K | V | K scale | V scale]: the scales as a tail
    after the data, not after each half."""

    def read_fields(self, cache, layout, **facts):
        if layout.startswith("vllm_pth"):
            return field_views(cache, _pth_scales_last(layout), **facts)
        return super().read_fields(cache, layout, **facts)


@mutant("LAYOUT-6.2")
class ConvertsDataNotScales(ReferenceAdapter):
    """Converts the K and V data of a record and leaves the inline scale bytes zero, as a
    permute of "the KV" that forgets the padding it carries."""

    def convert_layout(self, cache, source, target, **facts):
        out = super().convert_layout(cache, source, target, **facts)
        if not get_layout(source).plain and not get_layout(target).plain:
            for name, view in field_views(out, target).items():
                if name.endswith("scale"):
                    view.zero_()
        return out


@mutant("LAYOUT-6.3")
class ScalesReadAsWiderHead(ReferenceAdapter):
    """Converts a per-token-head record into a plain packed layout by reading each half,
    scale included, as K or V of head_dim + 4: the scales become data."""

    def convert_layout(self, cache, source, target, **facts):
        if source.startswith("vllm_pth") and get_layout(target).plain:
            plain = "vllm_packed_hnd" if source.endswith("hnd") else "vllm_packed_nhd"
            return convert(cache, plain, target)
        return super().convert_layout(cache, source, target, **facts)


@mutant("LAYOUT-6.4")
class MisalignedScalesByCopy(ReferenceAdapter):
    """Reads a per-token-head record whose head_dim misaligns the scales by copying the
    scale bytes out, instead of refusing the cache."""

    def read_fields(self, cache, layout, **facts):
        try:
            return super().read_fields(cache, layout, **facts)
        except ValueError:
            if not layout.startswith("vllm_pth"):
                raise
        spec = get_layout(layout)
        order = [spec.axes.index(a) for a in ("blocks", "slots", "heads", "dim")]
        raw = cache.view(torch.uint8).permute(order)
        half = raw.shape[-1] // 2
        dim = half - 4
        out = {}
        for i, name in enumerate(("k", "v")):
            base = i * half
            out[name] = raw[..., base : base + dim].view(cache.dtype)
            out[f"{name}_scale"] = (
                raw[..., base + dim : base + half].contiguous().view(torch.float32)
            )
        return out
