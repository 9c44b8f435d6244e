"""Attention-backend cache layouts: named, read as views, converted, detected only when unambiguous.

An engine keeps one layer's KV cache in a backend-specific layout [LAYOUT-1]. The spec
reads every layout into the same per-tensor form — for K and V (or the MLA latent), a
view ``[num_blocks, block_size, heads, head_dim]`` of the cache's own storage
[LAYOUT-2] — so that gathering, scattering and converting [LAYOUT-3] are written
once. Which layout a cache is in is stated by name; :func:`detect_layout` answers from
the shape only when exactly one layout fits and otherwise asks for the name [LAYOUT-4].

This package is the LAYOUT family's rules (:data:`CLAUSES`, LAYOUT-1..6 below; LAYOUT-7
is in :mod:`kvspec.memory.records`, LAYOUT-8 in :mod:`kvspec.memory.planes`) and its
public names, each from the module of its concern:

- :mod:`~kvspec.memory.cache_layout.registry`: the presets by what their cells hold
  (:data:`LAYOUTS`, :data:`CROSS_LAYER`, :data:`RECORDS`, :data:`SCALED`) and
  :func:`get_layout`, a layout by preset name or file [LAYOUT-1, LAYOUT-5];
- :mod:`~kvspec.memory.cache_layout.shape`: what a cache holds read as a layout
  (:class:`CacheShape`, :func:`cache_shape`, :func:`cache_dtype`) and the refusals of a
  cache that does not fit it [LAYOUT-1];
- :mod:`~kvspec.memory.cache_layout.views`: the cache read as views, every field in its
  own dtype (:func:`kv_views`, :func:`field_views`, :func:`layer_views`) [LAYOUT-2,
  LAYOUT-5, LAYOUT-6];
- :mod:`~kvspec.memory.cache_layout.conversion`: :func:`empty_cache` and
  :func:`convert`, slot for slot, bit for bit [LAYOUT-3, LAYOUT-6];
- :mod:`~kvspec.memory.cache_layout.detection`: :func:`detect_layout` [LAYOUT-4].

The layouts themselves are data: :mod:`kvspec.memory.layout_model` says what a layout
is, :mod:`kvspec.memory.presets` names the files under ``kvspec/memory/layouts/``.
"""

from __future__ import annotations

from kvspec.core.clause import Clause, must, refuses
from kvspec.memory.cache_layout.conversion import convert, empty_cache
from kvspec.memory.cache_layout.detection import detect_layout, read_as
from kvspec.memory.cache_layout.registry import (
    CROSS_LAYER,
    LAYOUTS,
    RECORDS,
    SCALED,
    LayoutRef,
    get_layout,
    holds_attention,
    layouts_for,
    require_layout,
)
from kvspec.memory.cache_layout.shape import (
    CacheShape,
    LayerCache,
    cache_dtype,
    cache_shape,
    describe_cache,
)
from kvspec.memory.cache_layout.views import field_views, kv_views, layer_views
from kvspec.memory.layout_model import CacheLayout, Field
from kvspec.memory.presets import PRESETS

__all__ = [
    "CLAUSES",
    "CROSS_LAYER",
    "LAYOUTS",
    "PRESETS",
    "RECORDS",
    "SCALED",
    "CacheLayout",
    "CacheShape",
    "Field",
    "LayerCache",
    "LayoutRef",
    "cache_dtype",
    "cache_shape",
    "convert",
    "describe_cache",
    "detect_layout",
    "empty_cache",
    "field_views",
    "get_layout",
    "holds_attention",
    "kv_views",
    "layer_views",
    "layouts_for",
    "read_as",
    "require_layout",
]


CLAUSES = (
    Clause(
        "LAYOUT-1",
        "Named cache layouts",
        "A layer's cache is read and written only under a named layout: flash_attn "
        "[2, num_blocks, block_size, heads, head_dim]; flash_attn_hnd [2, num_blocks, heads, "
        "block_size, head_dim]; flashinfer [num_blocks, 2, block_size, heads, head_dim]; "
        "flashinfer_hnd [num_blocks, 2, heads, block_size, head_dim]; kv_tuple (K, V), each "
        "[num_blocks, block_size, heads, head_dim]; mla [num_blocks, block_size, latent]; "
        "token_major (K, V), each [seq, heads, head_dim], or (latent,) as [seq, 1, latent] — "
        "the request form a payload carries. Index 0 of a K/V axis or tuple is K. An unknown "
        "name is refused listing the known ones; a cache whose tensors do not have the "
        "named layout's rank, K/V axis of size 2, equal K and V shapes, dtypes and devices, "
        "an allowed dtype [DTYPE-1], or the heads, head_dim or block_size the caller states, "
        "is refused with its shape.",
        obligations=(
            must(
                "each named layout reads K at index 0 and V at index 1 of its K/V axis or tuple, "
                "and blocks, slots, heads and head_dim from its own axes"
            ),
            refuses("an unknown layout name"),
            refuses(
                "a cache without the named layout's rank, K/V axis of size 2, or equal K and V "
                "shapes"
            ),
        ),
    ),
    Clause(
        "LAYOUT-2",
        "Reading a cache is a view",
        "Reading a layer's cache gives, for K and V (or the latent), a tensor [num_blocks, "
        "block_size, heads, head_dim] that is a view of the cache's own storage: no element "
        "is copied and writing through the view writes the cache. MLA reads as heads = 1, "
        "head_dim = latent [MODEL-2]; token_major reads as num_blocks = seq and "
        "block_size = 1, i.e. block i holds token i.",
        obligations=(
            must("reading a cache returns views of its storage: nothing is copied"),
            must(
                "token_major reads as one token per block (block_size 1), MLA as one head of the "
                "latent's width"
            ),
        ),
    ),
    Clause(
        "LAYOUT-3",
        "Conversion moves every slot, bit for bit",
        "Two layouts carry the same information when they hold the same number of tensors "
        "per layer (K and V, or one latent). Converting between them puts slot s of each "
        "tensor (s = block * block_size + offset, blocks in order) at slot s of the target, "
        "bit-equal [DTYPE-2]; the target's block size may differ when it divides the number "
        "of slots (token_major has block size 1). The result is a new cache that shares no "
        "storage with the input. A conversion between layouts that carry different "
        "information (K/V to a latent), or to a block size that does not divide the slots, "
        "is refused: nothing is dropped or padded.",
        obligations=(
            must(
                "conversion puts slot s of K and V (or the latent) at slot s of the target, "
                "bit for bit"
            ),
            must(
                "the converted cache shares no storage with the input, even when the layout is the "
                "same"
            ),
            refuses(
                "a conversion between layouts that carry different information (K and V to a "
                "latent)"
            ),
            refuses(
                "a target block size that does not divide the cache's slots (larger or smaller "
                "than the source's)"
            ),
        ),
    ),
    Clause(
        "LAYOUT-4",
        "Detection answers only when unambiguous",
        "Given a cache and what the caller knows of it (heads, head_dim, block_size; each "
        "optional, and each narrows the answer), layout detection returns the one layout "
        "whose shape the cache fits. When several fit — a stacked cache with exactly 2 "
        "blocks fits both flash_attn and flashinfer; a head count equal to block_size (or "
        "an unstated one) fits both an NHD and an HND variant — it refuses, listing every "
        "candidate with the num_blocks, block_size and heads it would read, and asks for "
        "the layout by name. When none fits it refuses, listing the layouts' shapes. It "
        "never guesses, and never reads strides.",
        obligations=(
            must("when exactly one layout fits, detection names it"),
            refuses("a shape that fits several layouts (two blocks; heads equal to block_size)"),
            must("each stated fact (heads, head_dim, block_size) narrows the candidates"),
            refuses("a cache no layout fits, including one that contradicts a stated fact"),
        ),
    ),
    Clause(
        "LAYOUT-5",
        "A layout is data, and presets cite their source",
        "A cache layout is a value: the physical axes of each stored tensor (outermost "
        "first), the engine's logical axis order (its stride order is the permutation from "
        "logical to physical), where K and V live (their own axis, a tuple of tensors, packed "
        "one after the other in the last axis, or one latent), the record each (slot, head) "
        "cell holds in its last axis (fields with their dtype and width, inline scales among "
        "them), an optional layers axis (one tensor holds every layer), and the element type. "
        "A preset names such a value and cites the engine file and release it was read from, "
        "saying what was not confirmed there. Field f of cell (layer, block, slot, head) is "
        "at the byte these give: the dense strides of the physical order times the indices, "
        "plus f's offset in the record; a token pool (blocks and slots on one axis) keeps "
        "slot s of block b in row b * block_size + s, so its page size is stated, never read "
        "from the shape, and must divide its rows. Layer i of a cross-layer tensor is index i "
        "of its layers axis, read as the layout's per-layer preset through a view; where that "
        "preset is a tuple (K, V), index 0 and 1 of the layout's K/V axis are its two "
        "tensors.",
        obligations=(
            must(
                "each preset reads field f of (block, slot, head) from the byte its axes, stride "
                "order and record address: K before V in a packed last axis, row "
                "block * block_size + slot in a token pool"
            ),
            must(
                "layer i of a cross-layer cache is index i of its layers axis, read as the "
                "per-layer preset through a view"
            ),
            refuses(
                "a token pool read without its page size, or with a page size that does not "
                "divide its rows"
            ),
        ),
    ),
    Clause(
        "LAYOUT-6",
        "Inline scales unpack and repack bit for bit",
        "A layout whose record carries inline scales (vLLM's per-token-head modes: a float32 "
        "scale after each of K and V; FlashMLA's fp8 record: 512 fp8 NoPE values, 4 float32 "
        "scales, 64 bfloat16 RoPE values) is read as one view per field, each in its own "
        "dtype, [num_blocks, block_size, heads, width]; converting it moves every field of "
        "every cell to the same cell of the target, so each scale stays with its token and "
        "head, bit for bit. A field starts at a multiple of its dtype's size: a head_dim that "
        "puts a scale off that alignment is refused. Two layouts convert into one another "
        "only when their cells hold the same fields (name, dtype, width); a layout with inline "
        "scales into one without them, or the reverse, is refused: the information differs.",
        obligations=(
            must(
                "reading gives every field, inline scales included, as a view in its own dtype, "
                "[num_blocks, block_size, heads, width]"
            ),
            must(
                "conversion between two layouts with the same fields moves each scale with its "
                "token and head, bit for bit"
            ),
            refuses(
                "a conversion between a layout with inline scales and one without them, or with "
                "another record"
            ),
            refuses("a head_dim that puts an inline scale off its dtype's alignment"),
        ),
    ),
)
