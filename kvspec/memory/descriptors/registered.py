"""What a connector registers: one rank's cache as regions, and where each byte of it is
[DESC-1, DESC-2, LAYOUT-5].

A rank registers each tensor of its paged cache as a memory region: ``L{i}`` (one tensor
per layer), ``L{i}.K`` / ``L{i}.V`` (a tuple layout, with a region per side tensor) or
``cache`` (one cross-layer tensor). A :class:`RegisteredCache` states what the rank holds
(layout, layers, blocks, block size, heads, head_dim, dtype) and, where smaller than the
tensor, a region's registered size. From the layout's axes, stride order and record it
gives the byte address of every field of every (layer, block, slot, head)
(:meth:`RegisteredCache.addresses`, planes and side tensors included [LAYOUT-8]) and
says in words what any byte holds (:meth:`RegisteredCache.locate`), which every refusal
uses. A :class:`Descriptor` is one copy between two such regions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kvspec.core.errors import FormError
from kvspec.core.forms import build, read_form
from kvspec.core.require import require_int, show
from kvspec.memory.cache_layout import CacheShape, get_layout, require_layout
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.paged import PagedCache
from kvspec.memory.planes import check_scaled, plane_layout, side_shape
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout


class Descriptor(NamedTuple):
    """Copy ``length`` bytes from ``src_offset`` of ``src_region`` to ``dst_offset`` of
    ``dst_region`` [DESC-1]. A plain tuple: a list of them is plain data."""

    src_region: str
    src_offset: int
    dst_region: str
    dst_offset: int
    length: int

    def to_list(self) -> list[Any]:
        return list(self)

    @classmethod
    def of(cls, value: object) -> Descriptor:
        """A descriptor from a :class:`Descriptor` or a 5-sequence; anything else is refused."""
        if isinstance(value, Descriptor):
            return value
        if isinstance(value, (list, tuple)) and len(value) == 5:
            src, so, dst, do, n = value
            if (
                isinstance(src, str)
                and isinstance(dst, str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (so, do, n))
            ):
                return cls(src, so, dst, do, n)
        raise ValueError(
            f"a descriptor is (src region, src offset, dst region, dst offset, length) with "
            f"string regions and integer offsets; got {value!r:.120} [DESC-2]"
        )


@dataclass(frozen=True)
class RegisteredCache:
    """One rank's paged cache as a connector registers it [DESC-1, DESC-2].

    ``num_layers`` and ``heads`` are what the rank holds; ``region_bytes`` states a
    registered size for some regions (by name), which may be smaller than the layout's
    tensor: the default is each tensor's whole size. Regions are ``L{i}`` (one tensor per
    layer), ``L{i}.K`` / ``L{i}.V`` (a tuple layout) or ``cache`` (one cross-layer tensor).
    """

    layout: CacheLayout
    num_layers: int
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int
    dtype: str
    region_bytes: Mapping[str, int] = field(default_factory=dict)
    tensors_per_layer: int | None = None
    """K and V (2) or a latent (1): only token_major, which holds either, needs it."""

    def __post_init__(self) -> None:
        spec = require_layout("RegisteredCache.layout", self.layout)
        for name in ("num_layers", "num_blocks", "block_size", "heads", "head_dim"):
            require_int(name, getattr(self, name), minimum=1)
        if self.dtype not in FIELD_DTYPES:
            raise ValueError(f"unknown cache dtype {self.dtype!r} [DTYPE-1]")
        if not spec.paged and self.block_size != 1:
            raise ValueError(f"layout {spec.name} has block size 1, not {self.block_size}")
        if spec.scaled:
            check_scaled(spec, self.dtype, self.block_size, self.head_dim)
        object.__setattr__(self, "region_bytes", dict(self.region_bytes))
        unknown = sorted(set(self.region_bytes) - set(self._full_regions()))
        if unknown:
            raise ValueError(
                f"regions {unknown} are not regions of a {spec.name} cache; its regions are "
                f"{', '.join(self._full_regions())} [DESC-2]"
            )

    @classmethod
    def of_rank(
        cls,
        layout: CacheLayout,
        stage: StageLayout,
        model: ModelShape,
        rank: int,
        *,
        num_blocks: int,
        block_size: int,
        dtype: str | None = None,
    ) -> RegisteredCache:
        """The cache rank ``rank`` of ``stage`` registers in ``layout``: the layers and
        heads of ``model`` it owns [HEAD-1, LAYER-1], in ``dtype`` (the model's unless
        given) [DESC-2]."""
        owner = rank_ownership(stage, model, rank)
        return cls(
            layout,
            len(owner.layers),
            num_blocks,
            block_size,
            len(owner.heads),
            model.head_dim,
            dtype or model.dtype,
            tensors_per_layer=model.kv_tensors,
        )

    @property
    def spec(self) -> CacheLayout:
        return self.layout

    @property
    def kv(self) -> int:
        return self.spec.tensors(self.tensors_per_layer)

    def _tensor_count(self) -> int:
        return self.kv + len(self.spec.side) if self.spec.tuple_form else 1

    def _sizes(self) -> dict[str, int]:
        spec = self.spec
        return {
            "kv": self.kv,
            "layers": self.num_layers,
            "blocks": self.num_blocks,
            "slots": self.block_size,
            "tokens": self.num_blocks * self.block_size,
            "heads": self.heads,
            "head_slots": self.kv * self.heads,
            "dim": spec.dim_size(self.dtype, self.head_dim),
        }

    def element_size(self) -> int:
        return FIELD_DTYPES[self.spec.element_dtype(self.dtype)].itemsize

    def tensor_bytes(self) -> int:
        sizes = self._sizes()
        count = 1
        for axis in self.spec.axes:
            count *= sizes[axis]
        return count * self.element_size()

    def _full_regions(self) -> dict[str, int]:
        size = self.tensor_bytes()
        if self.spec.cross_layer:
            return {"cache": size}
        if self.spec.tuple_form:
            names = ("K", "V") if self.kv == 2 else ("latent",)
            sizes = {n: size for n in names}
            for side in self.spec.side:  # a side field's tensor is a region of its own
                sizes[side.field.name] = self._side_bytes(side.field.name)
            return {f"L{i}.{n}": b for i in range(self.num_layers) for n, b in sizes.items()}
        return {f"L{i}": size for i in range(self.num_layers)}

    def _side_bytes(self, name: str) -> int:
        side = next(s for s in self.spec.side if s.field.name == name)
        dtype, _ = side.field.resolve(self.dtype, self.head_dim)
        count = 1
        for n in side_shape(
            side, self.dtype, self.num_blocks, self.block_size, self.heads, self.head_dim
        ):
            count *= n
        return count * FIELD_DTYPES[dtype].itemsize

    def regions(self) -> dict[str, int]:
        """Every registered region and its size in bytes, in a fixed order [DESC-2]."""
        return {
            name: self.region_bytes.get(name, size) for name, size in self._full_regions().items()
        }

    def shape(self) -> CacheShape:
        return CacheShape(
            self.kv,
            self.num_blocks,
            self.block_size,
            self.heads,
            self.head_dim,
            self.num_layers if self.spec.cross_layer else 1,
        )

    def strides(self) -> dict[str, int]:
        """Byte stride of each physical axis of one stored tensor: dense, outermost first."""
        sizes, stride, out = self._sizes(), self.element_size(), {}
        for axis in reversed(self.spec.axes):
            out[axis] = stride
            stride *= sizes[axis]
        return out

    def fields(self) -> dict[str, tuple[int, int, int]]:
        """field -> (part, byte offset in the record, bytes) [LAYOUT-5, LAYOUT-6]; a plane
        or side field has offset 0 in a part of its own (:meth:`addresses` places it)."""
        out = {}
        for part, fields in enumerate(self.spec.parts(self.kv)):
            offset = 0
            for f in fields:
                size = f.nbytes(self.dtype, self.head_dim)
                out[f.name] = (part, offset, size)
                offset += size
        for i, side in enumerate(self.spec.side):
            out[side.field.name] = (self.kv + i, 0, side.field.nbytes(self.dtype, self.head_dim))
        return out

    def element_count(self, name: str) -> int:
        """How many stored elements one (slot, head) of field ``name`` has."""
        spec = self.spec
        field = next(
            f for f in (*spec.fields(self.kv), *(s.field for s in spec.side)) if f.name == name
        )
        return field.resolve(self.dtype, self.head_dim)[1]

    def contiguous(self, name: str) -> bool:
        """Whether field ``name``'s bytes of one (slot, head) are consecutive: its width
        axis innermost (not so for vLLM's SM100 V scales, a 4-token group transposed)."""
        plane = self.spec.placement(name)
        return plane is None or plane.axes[-1] == "dim"

    def information(self) -> tuple[tuple[str, str, int | str], ...]:
        return self.spec.information(self.dtype, self.head_dim, self.kv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.ref,
            "num_layers": self.num_layers,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "heads": self.heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "region_bytes": dict(self.region_bytes),
            "tensors_per_layer": self.tensors_per_layer,
        }

    @classmethod
    def from_dict(cls, data: object) -> RegisteredCache:
        """Inverse of :meth:`to_dict`; anything else is refused with
        :class:`~kvspec.core.errors.FormError`."""
        form = read_form(
            "RegisteredCache",
            data,
            required=(
                "layout",
                "num_layers",
                "num_blocks",
                "block_size",
                "heads",
                "head_dim",
                "dtype",
            ),
            optional=("region_bytes", "tensors_per_layer"),
        )
        regions = form.get("region_bytes", {})
        if not isinstance(regions, Mapping):
            raise FormError(
                f"RegisteredCache.region_bytes must be a JSON object, got {show(regions)}"
            )
        return build(
            "RegisteredCache",
            lambda: cls(
                **{**form, "layout": get_layout(form["layout"]), "region_bytes": dict(regions)}
            ),
        )

    @classmethod
    def of(cls, cache: PagedCache, head_dim: int | None = None) -> RegisteredCache:
        """The registration of a :class:`PagedCache`: every tensor whole."""
        shape = cache.shape
        return cls(
            cache.layout,
            cache.num_layers,
            shape.num_blocks,
            shape.block_size,
            shape.heads,
            head_dim or shape.head_dim,
            cache.dtype,
            tensors_per_layer=shape.kv,
        )

    def locate(self, region: str, offset: int) -> str:
        """What byte ``offset`` of ``region`` holds: (layer, block, slot, head, field, byte)."""
        names = list(self._full_regions())
        if region not in names:
            return f"no region {region!r}"
        index = names.index(region)
        spec, strides = self.spec, self.strides()
        if spec.scaled:
            return self._locate_placed(region, index, offset)
        if spec.cross_layer:
            layer, part = None, None
        elif spec.tuple_form:
            layer, part = divmod(index, self._tensor_count())
        else:
            layer, part = index, None
        coords: dict[str, int] = {}
        rest = offset
        for axis in spec.axes:
            coords[axis], rest = divmod(rest, strides[axis])
        byte = coords.get("dim", 0) * self.element_size() + rest
        if "tokens" in coords:
            coords["blocks"], coords["slots"] = divmod(coords["tokens"], self.block_size)
        part = coords.get("kv", part or 0)
        layer = coords.get("layers", layer)
        for name, (p, start, size) in self.fields().items():
            if p == part and start <= byte < start + size:
                return (
                    f"layer {layer}, block {coords.get('blocks', 0)}, slot "
                    f"{coords.get('slots', 0)}, head {coords.get('heads', 0)}, {name} byte "
                    f"{byte - start}"
                )
        return f"byte {offset} of {region}"

    def _locate_placed(self, region: str, index: int, offset: int) -> str:
        """What byte ``offset`` of a block-scaled cache's region holds, by plane or side
        tensor [LAYOUT-8]."""
        spec = self.spec
        if spec.planes:
            block, rest = divmod(offset, self.tensor_bytes() // self.num_blocks)
            planes = plane_layout(spec, self.dtype, self.heads, self.block_size, self.head_dim)
            for name, (start, size, _) in planes.items():
                if start <= rest < start + size:
                    return f"layer {index}, block {block}, {name} plane byte {rest - start}"
            return f"byte {offset} of {region}"
        layer, part = divmod(index, self._tensor_count())
        names = ["K", "V", *(s.field.name for s in spec.side)]
        return f"layer {layer}, {names[part]} tensor byte {offset}"

    def addresses(
        self,
        name: str,
        layers: torch.Tensor,
        blocks: torch.Tensor,
        slots: torch.Tensor,
        heads: torch.Tensor,
        index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(region index, byte offset) of field ``name`` of each (layer, block, slot, head),
        the index tensors broadcast together [LAYOUT-5]; ``index``, where given, is the
        element of the field (for a field whose elements are not consecutive)."""
        part, start, _ = self.fields()[name]
        spec, strides = self.spec, self.strides()
        if spec.scaled and spec.placement(name) is not None:
            return self._placed(name, layers, blocks, slots, heads, index)
        offset = torch.zeros((), dtype=torch.int64) + start
        element = index
        coords = {
            "kv": torch.tensor(part),
            "layers": layers,
            "blocks": blocks,
            "slots": slots,
            "heads": heads,
            "tokens": blocks * self.block_size + slots,
        }
        for axis in spec.axes:
            if axis != "dim":
                offset = offset + coords[axis] * strides[axis]
        if element is not None:
            dtype, _ = next(f for f in spec.fields(self.kv) if f.name == name).resolve(
                self.dtype, self.head_dim
            )
            offset = offset + element * FIELD_DTYPES[dtype].itemsize
        if spec.cross_layer:
            region = torch.zeros_like(offset)
        elif spec.tuple_form:
            region = layers * self._tensor_count() + part
        else:
            region = layers + torch.zeros_like(offset)
        region, offset = torch.broadcast_tensors(region, offset)
        return region, offset

    def _placed(
        self,
        name: str,
        layers: torch.Tensor,
        blocks: torch.Tensor,
        slots: torch.Tensor,
        heads: torch.Tensor,
        index: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Addresses of a plane or side field [LAYOUT-8.1, LAYOUT-8.3]."""
        spec = self.spec
        plane = spec.placement(name)
        assert plane is not None
        element = torch.zeros((), dtype=torch.int64) if index is None else index
        field = next(f for f in (*spec.record, *(s.field for s in spec.side)) if f.name == name)
        dtype, width = field.resolve(self.dtype, self.head_dim)
        item = FIELD_DTYPES[dtype].itemsize
        if spec.planes:
            block_bytes = self.tensor_bytes() // self.num_blocks
            start, _, _ = plane_layout(
                spec, self.dtype, self.heads, self.block_size, self.head_dim
            )[name]
            within = plane.offset(self.block_size, self.heads, width, heads, slots, element)
            offset = blocks * block_bytes + start + within * item
            region = layers + torch.zeros_like(offset)
        else:
            side = [s.field.name for s in spec.side].index(name)
            sizes = {
                **plane.sizes(self.block_size, self.heads, width),
                "blocks": self.num_blocks,
                "tokens": self.num_blocks * self.block_size,
            }
            unit = plane.unit or 1
            coords = {
                "blocks": blocks,
                "tokens": blocks * self.block_size + slots,
                "heads": heads,
                "slots": slots,
                "slots_hi": slots // unit,
                "slots_lo": slots % unit,
                "dim": element,
            }
            offset = torch.zeros((), dtype=torch.int64)
            stride = item
            for axis in reversed(plane.axes):
                offset = offset + coords[axis] * stride
                stride *= sizes[axis]
            region = layers * self._tensor_count() + self.kv + side + torch.zeros_like(offset)
        region, offset = torch.broadcast_tensors(region, offset)
        return region, offset
