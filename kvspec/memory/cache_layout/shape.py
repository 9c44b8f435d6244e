"""What a cache holds when read as a layout: its shape, its dtype, its tensors [LAYOUT-1].

A layer's cache is one tensor or a tuple of tensors (:data:`LayerCache`). Read as a
named layout, it holds K and V (or one latent) of ``num_blocks`` blocks of
``block_size`` slots, ``heads`` heads and ``head_dim`` elements per head
(:class:`CacheShape`), whatever the layout's axes, stride order or record.
:func:`cache_shape` reads those from the tensors' shapes and refuses a cache that does
not have the layout's rank, K/V axis of size 2, equal K and V tensors, an allowed dtype
[DTYPE-1] or a record a head_dim fits, naming the shape it got.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.core.require import require_int
from kvspec.memory.cache_layout.registry import LayoutRef, get_layout
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.planes import check_scaled, side_shape
from kvspec.tensors.dtypes import dtype_name

LayerCache = torch.Tensor | tuple[torch.Tensor, ...]
"""One layer's cache as an engine holds it: one tensor, or a tuple of tensors [LAYOUT-1]."""


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


def stored_tensors(cache: object, layout: CacheLayout) -> tuple[tuple[torch.Tensor, ...], str]:
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


def side_tensors(cache: LayerCache, layout: CacheLayout) -> tuple[torch.Tensor, ...]:
    """A side layout's side tensors, after K and V in its tuple [LAYOUT-8.3]."""
    assert isinstance(cache, (tuple, list))
    return tuple(cache[2:])


def cache_dtype(cache: LayerCache, layout: LayoutRef) -> str:
    """The cache dtype ``cache`` holds when read as ``layout``: its tensors' own, or, for a
    layout that stores records as bytes, the dtype its record is of [DTYPE-1, LAYOUT-5]."""
    return stored_tensors(cache, get_layout(layout))[1]


def check_alignment(spec: CacheLayout, dtype: str, head_dim: int) -> None:
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
    layout: LayoutRef,
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
    tensors, dtype = stored_tensors(cache, spec)
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
    check_alignment(spec, dtype, dim)
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
    for tensor, side in zip(side_tensors(cache, spec), spec.side, strict=True):
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
