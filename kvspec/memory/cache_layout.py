"""Attention-backend cache layouts: named, read as views, converted, detected only when unambiguous.

An engine keeps one layer's KV cache in a backend-specific layout [LAYOUT-1]. The spec
reads every layout into the same per-tensor form — for K and V (or the MLA latent), a
view ``[num_blocks, block_size, heads, head_dim]`` of the cache's own storage
[LAYOUT-2] — so that gathering, scattering and converting [LAYOUT-3] are written
once. Which layout a cache is in is stated by name; :func:`detect_layout` answers from
the shape only when exactly one layout fits and otherwise asks for the name [LAYOUT-4].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from kvspec._checks import require_int
from kvspec.clause import Clause, must, refuses
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout, Field
from kvspec.memory.layout_refs import is_layout_file, read_cache_file, read_name
from kvspec.memory.planes import (
    check_scaled,
    plane_views,
    side_shape,
    side_view,
    slot_rows,
    unit_of,
)
from kvspec.memory.presets import PRESETS
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import dtype_name, torch_dtype

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

LayerCache = torch.Tensor | tuple[torch.Tensor, ...]
"""One layer's cache as an engine holds it: one tensor, or a tuple of tensors [LAYOUT-1]."""

# The per-tensor form every layout is read into [LAYOUT-2]: blocks, slots in a block,
# heads, head_dim (the record); a cross-layer tensor keeps its layers axis first.
_CANONICAL = ("layers", "blocks", "slots", "heads", "dim")

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
    """The preset called ``name``, or the layout in the layout file ``name`` (a path ending
    in ``.json``), or a layout file's read in this process by its name; unknown names are
    refused with the known ones [LAYOUT-1, LAYOUT-5]."""
    if isinstance(name, CacheLayout):
        return name
    if isinstance(name, str) and name not in PRESETS:
        if is_layout_file(name):
            return read_cache_file(name)
        read = read_name(name)  # a layout file's, read in this process [LAYOUT-5]
        if read is not None:
            return read
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(
            f"unknown cache layout {name!r}; the layouts are {', '.join(PRESETS)} [LAYOUT-1]"
        )
    return PRESETS[name]


def layouts_for(attention: str, *, cross_layer: bool = False) -> tuple[str, ...]:
    """The layouts that can hold a model of attention kind ``attention`` ('mha' or 'mla'):
    the per-layer :data:`LAYOUTS`, and with ``cross_layer`` the plain cross-layer presets
    too (a paged cache holds those as one tensor) [LAYOUT-5]."""
    chosen = {**LAYOUTS, **(CROSS_LAYER if cross_layer else {})}
    return tuple(n for n, layout in chosen.items() if holds_attention(layout, attention))


def holds_attention(layout: str | CacheLayout, attention: str, *, cross_layer: bool = True) -> bool:
    """Whether ``layout`` (a preset or a layout file) is one of those :func:`layouts_for`
    would list for ``attention``: its cells hold only K and V (or a latent), of the kind's
    count, per layer or, with ``cross_layer``, in one tensor [LAYOUT-1, LAYOUT-5]."""
    spec = get_layout(layout)
    kv = 1 if attention == "mla" else 2
    return spec.plain and (cross_layer or not spec.cross_layer) and spec.kv_tensors in (kv, None)


@dataclass(frozen=True)
class CacheShape:
    """What a layer's cache holds, independent of its layout [LAYOUT-2].

    ``kv`` tensors (2: K and V; 1: a latent), each of ``num_blocks`` blocks of
    ``block_size`` slots, ``heads`` heads and ``head_dim`` elements per head; ``layers``
    is more than 1 only for a cross-layer cache.
    """

    kv: int
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int
    layers: int = 1

    def __post_init__(self) -> None:
        require_int("kv", self.kv, minimum=1)
        require_int("num_blocks", self.num_blocks, minimum=0)
        require_int("block_size", self.block_size, minimum=1)
        require_int("heads", self.heads, minimum=1)
        require_int("head_dim", self.head_dim, minimum=1)
        require_int("layers", self.layers, minimum=1)
        if self.kv not in (1, 2):
            raise ValueError(f"kv must be 2 (K and V) or 1 (an MLA latent), got {self.kv}")
        if self.kv == 1 and self.heads != 1:
            raise ValueError(
                f"a latent cache (kv=1) has no head axis, so heads must be 1, got {self.heads} "
                "[MODEL-2]"
            )

    @property
    def slots(self) -> int:
        """Token slots per tensor: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size


def describe_cache(cache: object) -> str:
    """A cache's structure for error messages: a shape, or a tuple of shapes."""
    if isinstance(cache, torch.Tensor):
        return f"tensor of shape {list(cache.shape)}"
    if isinstance(cache, (tuple, list)):
        parts = [
            str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in cache
        ]
        return f"tuple of {len(parts)} ({', '.join(parts)})"
    return f"{type(cache).__name__} (neither a tensor nor a tuple of tensors)"


def _cache_dtype(spec: CacheLayout, tensor: torch.Tensor, where: str) -> str:
    """The cache dtype a tensor of ``spec`` holds: its own, or the record's [DTYPE-1]."""
    if spec.element is not None:
        if tensor.dtype != FIELD_DTYPES[spec.element]:
            raise ValueError(
                f"a {where} stores {spec.element} bytes; got a {tensor.dtype} tensor [LAYOUT-5]"
            )
        assert spec.dtypes is not None
        return spec.dtypes[0]
    name = dtype_name(tensor.dtype)  # refuses dtypes outside DTYPE-1
    if spec.dtypes is not None and name not in spec.dtypes:
        raise ValueError(
            f"a {where} holds {', '.join(spec.dtypes)}; got a {name} tensor [LAYOUT-5]"
        )
    return name


def _tensors(cache: object, layout: CacheLayout) -> tuple[tuple[torch.Tensor, ...], str]:
    """The stored tensors of ``cache`` and its dtype, refusing the wrong container [LAYOUT-1]."""
    where = f"{layout.name} cache {layout.shape}"
    if layout.tuple_form:
        counts = (2,) if layout.kv_tensors == 2 else (1, 2)
        if layout.side:
            counts = (2 + len(layout.side),)
        if (
            not isinstance(cache, (tuple, list))
            or len(cache) not in counts
            or not all(isinstance(t, torch.Tensor) for t in cache)
        ):
            wanted = " or ".join(str(c) for c in counts)
            raise ValueError(
                f"a {where} is a tuple of {wanted} tensors"
                + (
                    f" (K, V, {', '.join(s.field.name for s in layout.side)})"
                    if layout.side
                    else ""
                )
                + f"; got {describe_cache(cache)} [LAYOUT-1, LAYOUT-8]"
            )
        tensors = tuple(cache)[:2] if layout.side else tuple(cache)
    else:
        if not isinstance(cache, torch.Tensor):
            raise ValueError(f"a {where} is one tensor; got {describe_cache(cache)} [LAYOUT-1]")
        tensors = (cache,)
    first = tensors[0]
    for t in tensors:
        if t.dim() != len(layout.axes):
            raise ValueError(
                f"a {where} has {len(layout.axes)}-d tensors; got {describe_cache(cache)} "
                "[LAYOUT-1]"
            )
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"K and V of a {where} must agree in shape, dtype and device; got "
                f"{[(list(x.shape), str(x.dtype), str(x.device)) for x in tensors]} [LAYOUT-1]"
            )
    return tensors, _cache_dtype(layout, first, where)


def _side_tensors(cache: LayerCache, layout: CacheLayout) -> tuple[torch.Tensor, ...]:
    """A side layout's side tensors, after K and V in its tuple [LAYOUT-8.3]."""
    assert isinstance(cache, (tuple, list))
    return tuple(cache[2:])


def cache_dtype(cache: LayerCache, layout: str | CacheLayout) -> str:
    """The cache dtype ``cache`` holds when read as ``layout``: its tensors' own, or, for a
    layout that stores records as bytes, the dtype its record is of [DTYPE-1, LAYOUT-5]."""
    return _tensors(cache, get_layout(layout))[1]


def _check_alignment(spec: CacheLayout, dtype: str, head_dim: int) -> None:
    """Every field starts at a multiple of its dtype's size [LAYOUT-6]."""
    if spec.planes:
        return  # planes start aligned, or are refused where they are read [LAYOUT-8]
    for part in spec.parts():
        offset = 0
        for f in part:
            name, _ = f.resolve(dtype, head_dim)
            size = FIELD_DTYPES[name].itemsize
            if offset % size:
                raise ValueError(
                    f"a {spec.name} cell of head_dim {head_dim} ({dtype}) puts its {f.name} "
                    f"({name}) at byte {offset}, not a multiple of {size}: head_dim must keep "
                    "every field aligned [LAYOUT-6]"
                )
            offset += f.nbytes(dtype, head_dim)


def cache_shape(
    cache: LayerCache,
    layout: str | CacheLayout,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
    block_size: int | None = None,
) -> CacheShape:
    """What ``cache`` holds when read as ``layout``; refuses a cache that does not fit [LAYOUT-1].

    ``heads``, ``head_dim`` and ``block_size``, when given, must match; token_major's block
    size is 1 [LAYOUT-2]; a token pool's is not in its shape and must be given [LAYOUT-5].
    """
    spec = get_layout(layout)
    tensors, dtype = _tensors(cache, spec)
    sizes = dict(zip(spec.axes, tensors[0].shape, strict=True))
    if spec.kv_axis is not None and sizes["kv"] != 2:
        raise ValueError(
            f"a {spec.name} cache {spec.shape} has a K/V axis of size 2 at dim {spec.kv_axis}; "
            f"got {describe_cache(cache)} [LAYOUT-1]"
        )
    kv = sizes.get("kv", len(tensors) if spec.tuple_form else spec.kv_tensors or 1)
    if "head_slots" in sizes:
        if sizes["head_slots"] % kv:
            raise ValueError(
                f"a {spec.name} cache {spec.shape} has K's heads then V's on one axis; got "
                f"{describe_cache(cache)}, whose {sizes['head_slots']} head slots are not "
                f"{kv} x heads [LAYOUT-8]"
            )
        sizes["heads"] = sizes["head_slots"] // kv
    if kv == 1 and "heads" in sizes and sizes["heads"] != 1:
        raise ValueError(
            f"a {spec.name} cache with one tensor holds an MLA latent, which has one head; got "
            f"{describe_cache(cache)} with {sizes['heads']} heads [LAYOUT-1, MODEL-2]"
        )
    dim = spec.head_dim_of(sizes["dim"], dtype)
    if dim is None:
        raise ValueError(
            f"a {spec.name} cache {spec.shape} of {dtype} has a last axis of "
            f"{_record_text(spec, dtype)} records; got "
            f"{describe_cache(cache)}, whose last axis {sizes['dim']} fits no head_dim "
            "[LAYOUT-1, LAYOUT-5]"
        )
    if spec.merged_tokens:
        if block_size is None:
            raise ValueError(
                f"a {spec.name} pool {spec.shape} keeps blocks and slots on one axis: its page "
                f"size is not in the shape {describe_cache(cache)}; state block_size [LAYOUT-5]"
            )
        require_int("block_size", block_size, minimum=1)
        if sizes["tokens"] % block_size:
            raise ValueError(
                f"a {spec.name} pool of {sizes['tokens']} token rows cannot have pages of "
                f"{block_size}: {block_size} does not divide {sizes['tokens']} [LAYOUT-5]"
            )
        sizes["blocks"], sizes["slots"] = sizes["tokens"] // block_size, block_size
    shape = CacheShape(
        kv=kv,
        num_blocks=sizes["blocks"],
        block_size=sizes.get("slots", 1),
        heads=sizes.get("heads", 1),
        head_dim=dim,
        layers=sizes.get("layers", 1),
    )
    _check_alignment(spec, dtype, dim)
    if spec.scaled:
        check_scaled(spec, dtype, shape.block_size, dim)
    if spec.side:
        _check_side(cache, spec, shape, dtype)
    stated = {"heads": heads, "head_dim": head_dim, "block_size": block_size}
    wrong = [
        f"{name} {getattr(shape, name)} != stated {value}"
        for name, value in stated.items()
        if value is not None and getattr(shape, name) != value
    ]
    if wrong:
        raise ValueError(
            f"{describe_cache(cache)} read as {spec.name} {spec.shape} has "
            f"{'; '.join(wrong)} [LAYOUT-1]"
        )
    return shape


def _record_text(spec: CacheLayout, dtype: str) -> str:
    if spec.plain:
        return "whole"
    if any(not f.fixed for f in spec.parts()[0]):
        return "head_dim-wide"
    return str(spec.record_bytes(0, dtype, 1))


def _check_side(cache: LayerCache, spec: CacheLayout, shape: CacheShape, dtype: str) -> None:
    """Each side tensor has the shape K and V imply, and one-byte elements [LAYOUT-8.4]."""
    for tensor, side in zip(_side_tensors(cache, spec), spec.side, strict=True):
        want = side_shape(
            side, dtype, shape.num_blocks, shape.block_size, shape.heads, shape.head_dim
        )
        name, _ = side.field.resolve(dtype, shape.head_dim)
        size = FIELD_DTYPES[name].itemsize
        if list(tensor.shape) != want or tensor.element_size() != size:
            raise ValueError(
                f"a {spec.name} cache's {side.field.name} tensor is [{', '.join(side.plane.axes)}]"
                f" = {want} of {name}; got {list(tensor.shape)} of {tensor.dtype} "
                f"({describe_cache(cache)}) [LAYOUT-8]"
            )


def _canonical(tensor: torch.Tensor, axes: Sequence[str], block_size: int | None) -> torch.Tensor:
    """Permute ``tensor`` to [layers?, blocks, slots, heads, dim], unmerging a token axis and
    inserting size-1 axes it lacks (a layers axis only when it has one)."""
    if "tokens" in axes:
        assert block_size is not None
        at = list(axes).index("tokens")
        tensor = tensor.unflatten(at, (-1, block_size))
        axes = [*axes[:at], "blocks", "slots", *axes[at + 1 :]]
    order = [a for a in _CANONICAL if a in axes]
    view = tensor.permute([list(axes).index(a) for a in order])
    wanted = _CANONICAL if "layers" in axes else _CANONICAL[1:]
    for i, axis in enumerate(wanted):
        if axis not in axes:
            view = view.unsqueeze(i)
    return view


def _records(
    cache: LayerCache, spec: CacheLayout, block_size: int | None
) -> tuple[list[torch.Tensor], CacheShape, str]:
    """Each part's cells as a view [layers?, blocks, slots, heads, dim]: whole records."""
    shape = cache_shape(cache, spec, block_size=block_size)
    tensors, dtype = _tensors(cache, spec)
    if spec.kv_axis is not None:
        axes = [a for a in spec.axes if a != "kv"]
        stored = [tensors[0].select(spec.kv_axis, k) for k in range(2)]
    else:
        axes, stored = list(spec.axes), list(tensors)
    page = shape.block_size if spec.merged_tokens else None
    return [_canonical(t, axes, page) for t in stored], shape, dtype


def field_views(
    cache: LayerCache, layout: str | CacheLayout, *, block_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Every field of ``cache``'s cells, each a view in its own dtype [LAYOUT-5, LAYOUT-6].

    Each view is ``[num_blocks, block_size, heads, width]`` (``[layers, ...]`` first for a
    cross-layer cache); K and V of a stacked or tuple layout are the fields ``k`` and
    ``v``, a latent ``latent``; inline scales are fields of their own. Nothing is copied.
    """
    spec = get_layout(layout)
    if spec.scaled:
        return _scaled_views(cache, spec, block_size)
    records, shape, dtype = _records(cache, spec, block_size)
    out: dict[str, torch.Tensor] = {}
    for part, canon in zip(spec.parts(len(records)), records, strict=True):
        resolved = [f.resolve(dtype, shape.head_dim) for f in part]
        if all(FIELD_DTYPES[d] == canon.dtype for d, _ in resolved):
            start = 0
            for f, (_, width) in zip(part, resolved, strict=True):
                out[f.name] = canon.narrow(-1, start, width)
                start += width
            continue
        raw = canon.view(torch.uint8)  # the record's bytes: fields of several dtypes
        start = 0
        for f, (name, width) in zip(part, resolved, strict=True):
            size = width * FIELD_DTYPES[name].itemsize
            out[f.name] = raw.narrow(-1, start, size).view(FIELD_DTYPES[name])
            start += size
    return out


def _scaled_views(
    cache: LayerCache, spec: CacheLayout, block_size: int | None
) -> dict[str, torch.Tensor]:
    """Every field of a block-scaled cache: planes of its blocks, K and V of its tuple, and
    its side tensors, in the order of :meth:`CacheLayout.fields` [LAYOUT-8]."""
    shape = cache_shape(cache, spec, block_size=block_size)
    tensors, dtype = _tensors(cache, spec)
    views: dict[str, torch.Tensor] = {}
    if spec.planes:
        views.update(
            plane_views(
                tensors[0],
                spec,
                dtype,
                shape.num_blocks,
                shape.block_size,
                shape.heads,
                shape.head_dim,
            )
        )
    else:
        axes = list(spec.axes)
        for name, tensor in zip(("k", "v"), tensors, strict=True):
            views[name] = _canonical(tensor, axes, shape.block_size)
    sides = _side_tensors(cache, spec) if spec.side else ()
    for tensor, side in zip(sides, spec.side, strict=True):
        views[side.field.name] = side_view(tensor, side, dtype, shape.block_size, shape.head_dim)
    return {f.name: views[f.name] for f in spec.fields(shape.kv)}


def kv_views(
    cache: LayerCache, layout: str | CacheLayout, *, block_size: int | None = None
) -> tuple[torch.Tensor, ...]:
    """K and V (or the latent) of ``cache``, each a view [LAYOUT-2].

    Each is ``[num_blocks, block_size, heads, head_dim]`` (``[layers, ...]`` for a
    cross-layer cache); nothing is copied: every returned tensor shares the cache's
    storage. A token pool needs its ``block_size`` [LAYOUT-5]; inline scales are read with
    :func:`field_views` [LAYOUT-6].
    """
    spec = get_layout(layout)
    fields = field_views(cache, spec, block_size=block_size)
    if "k" in fields:
        return (fields["k"], fields["v"])
    if "latent" in fields:
        return (fields["latent"],)
    raise ValueError(
        f"a {spec.name} cell is a record of {', '.join(fields)}, not K and V or one latent "
        "of one dtype; read its fields with field_views [LAYOUT-6]"
    )


def layer_views(
    cache: torch.Tensor, layout: str | CacheLayout, *, block_size: int | None = None
) -> tuple[LayerCache, ...]:
    """Each layer of a cross-layer ``cache``: index i of its layers axis, a view in the
    layout's per-layer preset [LAYOUT-5]; where that preset is a tuple (K, V), the layer
    is the tuple of index 0 and 1 of the layout's K/V axis. A token pool needs its
    ``block_size``."""
    spec = get_layout(layout)
    if not spec.cross_layer:
        raise ValueError(f"layout {spec.name} has no layers axis; it holds one layer [LAYOUT-5]")
    cache_shape(cache, spec, block_size=block_size)
    at = spec.axes.index("layers")
    layers = [cache.select(at, i) for i in range(cache.shape[at])]
    assert spec.per_layer is not None
    if spec.kv_axis is None or not get_layout(spec.per_layer).tuple_form:
        return tuple(layers)
    kv = [a for a in spec.axes if a != "layers"].index("kv")
    return tuple((layer.select(kv, 0), layer.select(kv, 1)) for layer in layers)


def empty_cache(
    layout: str | CacheLayout, shape: CacheShape, dtype: str, device: str | torch.device = "cpu"
) -> LayerCache:
    """A zero-filled cache of ``shape`` in ``layout`` [LAYOUT-1]."""
    return _allocate(get_layout(layout), shape, dtype, device, torch.zeros)


def _allocate(
    spec: CacheLayout,
    shape: CacheShape,
    dtype: str,
    device: str | torch.device,
    factory: Callable[..., torch.Tensor],
) -> LayerCache:
    _check_holds(spec, shape)
    dtype_name(torch_dtype(dtype))
    if spec.dtypes is not None and dtype not in spec.dtypes:
        raise ValueError(
            f"layout {spec.name} holds {', '.join(spec.dtypes)} caches, not {dtype} [LAYOUT-5]"
        )
    _check_alignment(spec, dtype, shape.head_dim)
    if spec.scaled:
        check_scaled(spec, dtype, shape.block_size, shape.head_dim)
    if spec.fixed_head_dim is not None and shape.head_dim != spec.fixed_head_dim:
        raise ValueError(
            f"layout {spec.name} holds a latent of {spec.fixed_head_dim}, not {shape.head_dim} "
            "[LAYOUT-5]"
        )
    sizes = {
        "kv": shape.kv,
        "layers": shape.layers,
        "blocks": shape.num_blocks,
        "slots": shape.block_size,
        "tokens": shape.slots,
        "heads": shape.heads,
        "head_slots": shape.kv * shape.heads,
        "dim": spec.dim_size(dtype, shape.head_dim),
    }
    dims = [sizes[a] for a in spec.axes]
    element = FIELD_DTYPES[spec.element_dtype(dtype)]
    tensors = [
        factory(dims, dtype=element, device=device)
        for _ in range(shape.kv if spec.tuple_form else 1)
    ]
    for side in spec.side:  # each side field a tensor of its own [LAYOUT-8]
        name, _ = side.field.resolve(dtype, shape.head_dim)
        tensors.append(
            factory(
                side_shape(
                    side, dtype, shape.num_blocks, shape.block_size, shape.heads, shape.head_dim
                ),
                dtype=FIELD_DTYPES[name],
                device=device,
            )
        )
    return tuple(tensors) if spec.tuple_form else tensors[0]


def _check_holds(spec: CacheLayout, shape: CacheShape) -> None:
    """Refuse a shape the layout cannot hold: other K/V count, or token_major blocks [LAYOUT-3]."""
    if spec.kv_tensors is not None and spec.kv_tensors != shape.kv:
        have = "K and V" if shape.kv == 2 else "one latent"
        holds = "K and V" if spec.kv_tensors == 2 else "one latent"
        raise ValueError(
            f"layout {spec.name} {spec.shape} holds {holds} per layer but the cache holds "
            f"{have}: they do not carry the same information; use one of "
            f"{', '.join(layouts_for('mha' if shape.kv == 2 else 'mla'))} [LAYOUT-3]"
        )
    if not spec.paged and shape.block_size != 1:
        raise ValueError(
            f"layout {spec.name} has block size 1 (block i is token i), not {shape.block_size} "
            "[LAYOUT-2, LAYOUT-3]"
        )
    if not spec.cross_layer and shape.layers != 1:
        raise ValueError(
            f"layout {spec.name} holds one layer, not {shape.layers}; use a layout with a "
            "layers axis [LAYOUT-5]"
        )


def convert(
    cache: LayerCache,
    source: str | CacheLayout,
    target: str | CacheLayout,
    *,
    block_size: int | None = None,
    source_block_size: int | None = None,
    out: LayerCache | None = None,
) -> LayerCache:
    """``cache`` (in ``source``) as a new cache in ``target``, bit for bit [LAYOUT-3, LAYOUT-6].

    ``block_size`` is the target's block size: by default the source's (1 from token_major,
    and always 1 into token_major); ``source_block_size`` is a token pool's page size.
    Slot ``s`` of every field stays slot ``s``; the two layouts' cells must hold the same
    fields. ``out``, a preallocated cache in ``target`` of the converted shape, dtype and
    device that shares no storage with ``cache``, is written and returned instead of a
    new one; every byte is moved once either way.
    """
    src, dst = get_layout(source), get_layout(target)
    shape = cache_shape(cache, src, block_size=source_block_size)
    if block_size is None:
        block_size = shape.block_size if dst.paged else 1
    require_int("block_size", block_size, minimum=1)
    if shape.slots % block_size:
        raise ValueError(
            f"cannot re-block {shape.num_blocks} blocks of {shape.block_size} slots "
            f"({shape.slots} slots) into blocks of {block_size}: {block_size} does not divide "
            f"{shape.slots}, and slots are never dropped or padded [LAYOUT-3]"
        )
    out_shape = replace(shape, num_blocks=shape.slots // block_size, block_size=block_size)
    _check_holds(dst, out_shape)
    if src.cross_layer != dst.cross_layer:
        raise ValueError(
            f"{src.name} and {dst.name}: one holds every layer, the other one layer; convert "
            "the layers of a cross-layer cache one by one (layer_views) [LAYOUT-5]"
        )
    _, dtype = _tensors(cache, src)
    have_info = src.information(dtype, shape.head_dim, shape.kv)
    want_info = dst.information(dtype, shape.head_dim, shape.kv)
    if have_info != want_info:
        raise ValueError(
            f"layout {src.name} cells hold {_fields_text(have_info)} but {dst.name} cells hold "
            f"{_fields_text(want_info)}: they do not carry the same information, so nothing is "
            "converted [LAYOUT-6]"
        )
    views = field_views(cache, src, block_size=source_block_size)
    device = next(iter(views.values())).device
    page = block_size if dst.merged_tokens else None
    if out is None:
        # Uninitialised is safe: every slot of the target is written below.
        out = _allocate(dst, out_shape, dtype, device, torch.empty)
    else:
        _check_out(out, cache, dst, out_shape, dtype, device, page)
    if src.scaled or dst.scaled:
        # Fields in planes or side tensors: each field slot by slot, whatever its axes.
        targets = field_views(out, dst, block_size=page)
        for name, have in views.items():
            _copy_split(have, unit_of(src, name), targets[name], unit_of(dst, name))
        return out
    if src.parts(shape.kv) == dst.parts(shape.kv) and src.element == dst.element:
        # The same record in the same order: move whole cells, fewer and longer copies.
        have_records, _, _ = _records(cache, src, source_block_size)
        want_records, _, _ = _records(out, dst, page)
        for have, want in zip(have_records, want_records, strict=True):
            _copy_slots(have, want)
        return out
    targets = field_views(out, dst, block_size=page)
    for name, have in views.items():
        _copy_slots(have, targets[name])
    return out


def _check_out(
    out: LayerCache,
    cache: LayerCache,
    dst: CacheLayout,
    shape: CacheShape,
    dtype: str,
    device: torch.device,
    page: int | None,
) -> None:
    """Refuse an ``out`` that is not a cache of ``shape`` in ``dst``, or shares ``cache``'s
    storage [LAYOUT-3]."""
    wanted = f"a {dst.name} cache {dst.shape} of {shape}, {dtype} on {device}"
    try:
        have = cache_shape(out, dst, block_size=page)
        tensors, have_dtype = _tensors(out, dst)
    except ValueError as error:
        raise ValueError(f"out must be {wanted}; got {describe_cache(out)}: {error}") from None
    if have != shape or have_dtype != dtype or any(t.device != device for t in tensors):
        raise ValueError(
            f"out must be {wanted}; got {describe_cache(out)}, read as {have}, {have_dtype} on "
            f"{tensors[0].device} [LAYOUT-3]"
        )
    inputs = cache if isinstance(cache, (tuple, list)) else (cache,)
    mine = {t.untyped_storage().data_ptr() for t in inputs}
    if any(t.untyped_storage().data_ptr() in mine for t in tensors):
        raise ValueError(
            "out shares storage with the cache being converted; the converted cache shares "
            "no storage with its input [LAYOUT-3]"
        )


def _fields_text(info: tuple[tuple[str, str, int | str], ...]) -> str:
    return ", ".join(f"{name} ({width} x {dtype})" for name, dtype, width in info)


def _copy_split(
    have: torch.Tensor, have_unit: int | None, want: torch.Tensor, want_unit: int | None
) -> None:
    """Copy slot s of a field view to slot s of another, either of them split [LAYOUT-8.2]."""
    if have_unit is None and want_unit is None:
        _copy_slots(have, want)
        return
    rows = slot_rows(have, have_unit).reshape(-1, *have.shape[-2:])
    copy_bits(want, rows.reshape(want.shape))


def _copy_slots(have: torch.Tensor, want: torch.Tensor) -> None:
    """Copy slot s of ``have`` to slot s of ``want``, both [.., blocks, slots, heads, width],
    as bits [LAYOUT-3, DTYPE-2].

    Their block sizes may differ. When one divides the other, the larger block axis is
    split into the smaller blocks and the block axis of the smaller side into groups of
    them — both views, whatever the strides — so re-blocking is one strided copy of each
    byte. Otherwise the target is viewed in the source's blocks where its strides allow,
    or the source is reshaped (which may copy).
    """
    small, large = sorted((have.shape[-3], want.shape[-3]))
    if small != large and large % small == 0:
        k = large // small
        have, want = (
            t.unflatten(-3, (k, small)) if t.shape[-3] == large else t.unflatten(-4, (-1, k))
            for t in (have, want)
        )
    elif small != large:
        try:
            want = want.view(have.shape)
        except RuntimeError:
            have = have.reshape(want.shape)
    copy_bits(want, have)


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
