"""DESC: the exact byte ranges a pull connector posts to realise one edge of a transfer plan.

A pull connector (NIXL, Mooncake, SGLang's) never sees tensors: each rank registers
memory regions and the receiver posts *descriptors* ``(src region, src offset, dst
region, dst offset, length)`` against them. For one edge of a transfer plan
[PLAN-2], the two ranks' registered caches (layout, block size, heads and layers they
hold, the regions) and the request's block ids on each side, :func:`plan_descriptors`
gives the list that writes the receiver's share exactly once from the right bytes
[DESC-1], never leaves a registered region [DESC-2], coalesced into maximal runs so
that its count is the minimum for the layout pair [DESC-3]. :func:`judge_descriptors`
judges any other list by its effect — any list that writes the same bytes from the
same bytes passes — and reports its count against that minimum;
:func:`execute_descriptors` carries a list out on byte buffers.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch

from kvspec._checks import require_int, show
from kvspec.clause import Clause, must, refuses
from kvspec.errors import FormError
from kvspec.forms import build, read_form
from kvspec.memory.cache_layout import CacheShape, get_layout
from kvspec.memory.layout_model import FIELD_DTYPES, CacheLayout
from kvspec.memory.paged import PagedCache, check_block_ids
from kvspec.memory.planes import check_scaled, plane_layout, side_shape
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import Edge, TransferPlan
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens, as_tokens

CLAUSES = (
    Clause(
        "DESC-1",
        "A descriptor list writes the receiver's share exactly once",
        "For one edge of a transfer plan, a request's token range and both ranks' registered "
        "caches (their regions, layout, block size, the heads and layers each holds, and the "
        "request's block ids on each side), a descriptor (src region, src offset, dst region, "
        "dst offset, length) copies length bytes. A list realises the edge when every byte of "
        "the receiver's share — each field of each (layer, token, head) the edge carries, in "
        "the receiver's blocks — is written exactly once, from the sender's byte that holds "
        "the same (layer, token, head, field, byte), and no other byte of the receiver is "
        "written: not another request's block, not a slot past the range in a last block, not "
        "another head or layer. The two ranks' layouts, block sizes (larger or smaller, with a "
        "partial last block) and head counts may differ. Where a stage splits requests by "
        "tokens [CP-1], the edge carries the range's tokens that are in its token set "
        "[PLAN-6], and a rank's cache holds its own tokens in ascending order: each token "
        "lives at its position among that rank's tokens, not at its position in the request. "
        "A list is judged by this effect alone: any order and any granularity with the same "
        "effect is right.",
        obligations=(
            must(
                "every byte of the receiver's share is written from the sender's byte holding "
                "the same (layer, token, head, field, byte)"
            ),
            must("no byte of the receiver is written twice"),
            must(
                "no byte outside the receiver's share is written (other blocks, slots past the "
                "range, other heads or layers)"
            ),
            must(
                "the list is right when the two ranks' layouts, block sizes (either larger, with "
                "a partial last block) and head counts differ"
            ),
        ),
    ),
    Clause(
        "DESC-2",
        "Descriptors stay inside the registered regions",
        "Every range of a list lies inside its registered region on both sides: offset >= 0, "
        "length >= 1, offset + length <= the region's registered size. A request whose block "
        "ids need bytes past the end of a registered region (the region is smaller than the "
        "cache the layout describes, or the ids are wrong) is refused before any descriptor "
        "is produced, naming the ids, the bytes they need and the region's size: a range is "
        "never clipped, and never posted past the region.",
        obligations=(
            must("every range lies inside its registered region, on both sides"),
            refuses("block ids whose bytes lie past the end of a registered region"),
        ),
    ),
    Clause(
        "DESC-3",
        "The spec's list is minimal",
        "The spec's list coalesces the share into maximal runs: bytes that are consecutive in "
        "both the sender's and the receiver's region are one descriptor. No list with the same "
        "effect has fewer descriptors, so its count is the minimum for that layout pair, and "
        "a connector's count is reported against it. A connector that declares its lists "
        "coalesced is held to that minimum: no two of its ranges may be contiguous in both "
        "regions.",
        obligations=(
            must(
                "a list declared coalesced has no two ranges contiguous in both regions: its "
                "count is the minimum"
            ),
        ),
    ),
)


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

    layout: str
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
        spec = get_layout(self.layout)
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
        layout: str,
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
        return get_layout(self.layout)

    @property
    def kv(self) -> int:
        return self.spec.kv_tensors or self.tensors_per_layer or 2

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
            "layout": self.layout,
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
        :class:`~kvspec.errors.FormError`."""
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
        return build("RegisteredCache", lambda: cls(**{**form, "region_bytes": dict(regions)}))

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
            offset = blocks * block_bytes + start + within * item  # type: ignore[operator]
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


@dataclass(frozen=True)
class DescriptorPlan:
    """The spec's list for one edge and its context [DESC-1..3]."""

    edge: Edge
    tokens: range | Tokens
    source: RegisteredCache
    target: RegisteredCache
    descriptors: tuple[Descriptor, ...]
    share_bytes: int
    count: int
    """How many descriptors the list has (also when only counted, ``descriptors`` empty)."""


def _local(held: range, wanted: range, what: str) -> torch.Tensor:
    if wanted.start < held.start or wanted.stop > held.stop:
        raise ValueError(f"the edge's {what} {wanted} are not all held ({held})")
    return torch.arange(wanted.start - held.start, wanted.stop - held.start)


def _check_same_information(source: RegisteredCache, target: RegisteredCache) -> None:
    if source.information() != target.information():
        raise ValueError(
            f"a {source.layout} sender's cells hold {source.information()} but the "
            f"{target.layout} receiver's hold {target.information()}: bytes cannot carry one "
            "into the other [LAYOUT-6, DESC-1]"
        )


def _atoms(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
) -> tuple[torch.Tensor, ...]:
    """Every (src region, src offset, dst region, dst offset, length) of the share, one per
    field of each (layer, token, head), all as int64 tensors [DESC-1]."""
    share = share_positions(plan, edge, tokens)
    src_owner = rank_ownership(plan.source, plan.model, edge.src)
    dst_owner = rank_ownership(plan.target, plan.model, edge.dst)
    for side, cache, owner in (("sender", source, src_owner), ("receiver", target, dst_owner)):
        if cache.heads != len(owner.heads) or cache.num_layers != len(owner.layers):
            raise ValueError(
                f"the {side}'s registered cache holds {cache.heads} heads and "
                f"{cache.num_layers} layers, but rank {owner.rank} owns heads {owner.heads} and "
                f"layers {owner.layers} [DESC-1]"
            )
    _check_same_information(source, target)
    src_ids = torch.tensor(
        check_block_ids(
            source_ids,
            num_blocks=source.num_blocks,
            block_size=source.block_size,
            seq_len=share.source_slots,
        ),
        dtype=torch.int64,
    )
    dst_ids = torch.tensor(
        check_block_ids(
            target_ids,
            num_blocks=target.num_blocks,
            block_size=target.block_size,
            seq_len=share.target_slots,
        ),
        dtype=torch.int64,
    )
    layers_src = _local(src_owner.layers, edge.layers, "layers").view(-1, 1, 1)
    layers_dst = _local(dst_owner.layers, edge.layers, "layers").view(-1, 1, 1)
    heads_src = _local(src_owner.heads, edge.heads, "heads").view(1, 1, -1)
    heads_dst = _local(dst_owner.heads, edge.heads, "heads").view(1, 1, -1)
    ts = torch.tensor(share.source.tokens(), dtype=torch.int64).view(1, -1, 1)
    td = torch.tensor(share.target.tokens(), dtype=torch.int64).view(1, -1, 1)
    parts = []
    for name, (_, _, size) in source.fields().items():
        src_at = (layers_src, src_ids[ts // source.block_size], ts % source.block_size, heads_src)
        dst_at = (layers_dst, dst_ids[td // target.block_size], td % target.block_size, heads_dst)
        index = None
        if not (source.contiguous(name) and target.contiguous(name)):
            # A field whose elements are not consecutive on a side: one atom per element,
            # which coalescing joins again where both sides run on [LAYOUT-8, DESC-3].
            count = source.element_count(name)
            index = torch.arange(count, dtype=torch.int64).view(1, 1, 1, -1)
            src_at = tuple(t.unsqueeze(-1) for t in src_at)  # type: ignore[assignment]
            dst_at = tuple(t.unsqueeze(-1) for t in dst_at)  # type: ignore[assignment]
            size //= count
        sr, so = source.addresses(name, *src_at, index=index)
        dr, do = target.addresses(name, *dst_at, index=index)
        parts.append((sr.flatten(), so.flatten(), dr.flatten(), do.flatten(), size))
    if not parts or not len(parts[0][0]):
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty, empty, empty, empty
    return (
        torch.cat([p[0] for p in parts]),
        torch.cat([p[1] for p in parts]),
        torch.cat([p[2] for p in parts]),
        torch.cat([p[3] for p in parts]),
        torch.cat([torch.full_like(p[0], p[4]) for p in parts]),
    )


class SharePositions(NamedTuple):
    """The tokens of one edge's share and where they sit on each side [DESC-1, CP-1].

    ``tokens`` are the request's token positions the share carries; ``source`` and
    ``target`` their positions in the sender's and the receiver's own tokens (the same as
    ``tokens`` on a side without token shards), in the same order.
    """

    tokens: Tokens
    source: Tokens
    target: Tokens

    @property
    def source_slots(self) -> int:
        """Cache slots the sender's block ids must cover: up to its last position."""
        return self.source.ranges[-1].stop if self.source else 0

    @property
    def target_slots(self) -> int:
        """Cache slots the receiver's block ids must cover: up to its last position."""
        return self.target.ranges[-1].stop if self.target else 0


def share_positions(plan: TransferPlan, edge: Edge, tokens: range | Tokens) -> SharePositions:
    """The share of ``edge`` in ``tokens`` (a range of the request, or a token set) and
    each token's position on both ranks [DESC-1, PLAN-6, CP-1].

    The share is the edge's token set within ``tokens``; each rank keeps its own tokens in
    ascending order, so a token's slot is its position among them (vLLM's prefill
    context parallelism read another shard's blocks where it used the request's
    position instead).
    """
    if isinstance(tokens, range) and (tokens.step != 1 or tokens.start < 0):
        raise ValueError(f"tokens must be a range of token positions, got {tokens!r}")
    wanted = as_tokens(tokens)
    share = wanted if edge.tokens is None else wanted.intersect(edge.tokens)
    sides = []
    for side, rank in (("source", edge.src), ("target", edge.dst)):
        held = plan.owner(side, rank).tokens
        sides.append(share if held is None else share.positions_in(held))
    return SharePositions(share, sides[0], sides[1])


def _check_bounds(
    cache: RegisteredCache,
    region: torch.Tensor,
    offset: torch.Tensor,
    length: torch.Tensor,
    ids: Sequence[int],
    side: str,
) -> None:
    """Refuse block ids whose bytes lie past a registered region's end [DESC-2.2]."""
    sizes = torch.tensor(list(cache.regions().values()), dtype=torch.int64)
    past = offset + length > sizes[region]
    if bool(past.any()):
        names = list(cache.regions())
        first = int(past.nonzero()[0, 0])
        r = int(region[first])
        need = int((offset + length)[region == r].max())
        where = cache.locate(names[r], int(offset[first]))
        raise ValueError(
            f"the {side}'s block ids {list(ids)} need bytes up to {need} of region "
            f"{names[r]!r}, which is registered with {int(sizes[r])} bytes ({where} lies past "
            "its end); a range is never posted past a region [DESC-2]"
        )


class Runs(NamedTuple):
    """The spec's maximal runs of one edge as five int64 tensors, in source address order
    [DESC-1..3]: region indices (into ``source.regions()`` and ``target.regions()``, in
    their order), offsets and lengths. The same list as :func:`plan_descriptors`', with no
    Python object per run: what a data path that moves the bytes needs."""

    src_region: torch.Tensor
    src_offset: torch.Tensor
    dst_region: torch.Tensor
    dst_offset: torch.Tensor
    length: torch.Tensor


def plan_runs(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
) -> Runs:
    """The minimal descriptor list realising ``edge`` for ``tokens`` [DESC-1..3], as
    tensors (:class:`Runs`); the arguments and refusals are :func:`plan_descriptors`'."""
    if not isinstance(tokens, range | Tokens):
        raise ValueError(
            f"tokens must be a range of token positions or a Tokens set, got {tokens!r}"
        )
    sr, so, dr, do, ln = _atoms(plan, edge, source, source_ids, target, target_ids, tokens)
    _check_bounds(source, sr, so, ln, source_ids, "sender")
    _check_bounds(target, dr, do, ln, target_ids, "receiver")
    return Runs(*_runs(sr, so, dr, do, ln))


def plan_descriptors(
    plan: TransferPlan,
    edge: Edge,
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    tokens: range | Tokens,
    *,
    count_only: bool = False,
) -> DescriptorPlan:
    """The minimal descriptor list realising ``edge`` for ``tokens`` [DESC-1..3].

    ``tokens`` is a range of the request's token positions or, where a stage has token
    shards, any token set; the edge carries those of them in its token set
    (:func:`share_positions`). ``source_ids`` / ``target_ids`` are the request's block
    ids on each side, exactly as many as the side's last position of the share needs
    (``tokens.stop`` without token shards) [PAGED-3]. Bytes of each (layer, token, head,
    field) of the share are paired, sorted by source address and merged where they
    continue in both regions: the maximal runs, whose count no list of the same effect
    can beat.
    ``count_only`` counts them without building the list.
    """
    runs = plan_runs(plan, edge, source, source_ids, target, target_ids, tokens)
    descriptors = (
        () if count_only else _descriptors(runs, list(source.regions()), list(target.regions()))
    )
    count = len(runs.length)
    share = int(runs.length.sum())
    return DescriptorPlan(edge, tokens, source, target, descriptors, share, count)


def _runs(
    sr: torch.Tensor,
    so: torch.Tensor,
    dr: torch.Tensor,
    do: torch.Tensor,
    ln: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Merge atoms into maximal runs, contiguous in both regions [DESC-3]: the runs as
    (src region, src offset, dst region, dst offset, length) tensors, in source order."""
    if not len(sr):
        return sr, so, dr, do, ln
    span = int(so.max()) + int(ln.max()) + 1
    order = torch.argsort(sr * span + so)
    sr, so, dr, do, ln = (x[order] for x in (sr, so, dr, do, ln))
    joins = (
        (sr[1:] == sr[:-1])
        & (dr[1:] == dr[:-1])
        & (so[1:] == so[:-1] + ln[:-1])
        & (do[1:] == do[:-1] + ln[:-1])
    )
    starts = torch.cat([torch.ones(1, dtype=torch.bool), ~joins])
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    lengths = torch.zeros(int(group[-1]) + 1, dtype=torch.int64).index_add_(0, group, ln)
    first = starts.nonzero().flatten()
    return sr[first], so[first], dr[first], do[first], lengths


def _descriptors(
    runs: tuple[torch.Tensor, ...], src_names: list[str], dst_names: list[str]
) -> tuple[Descriptor, ...]:
    sr, so, dr, do, ln = runs
    return tuple(
        map(
            Descriptor._make,
            zip(
                [src_names[i] for i in sr.tolist()],
                so.tolist(),
                [dst_names[i] for i in dr.tolist()],
                do.tolist(),
                ln.tolist(),
                strict=True,
            ),
        )
    )


def _coalesce(
    sr: torch.Tensor,
    so: torch.Tensor,
    dr: torch.Tensor,
    do: torch.Tensor,
    ln: torch.Tensor,
    src_names: list[str],
    dst_names: list[str],
) -> tuple[Descriptor, ...]:
    """Atoms merged into maximal runs, as descriptors [DESC-3]."""
    return _descriptors(_runs(sr, so, dr, do, ln), src_names, dst_names)


@dataclass(frozen=True)
class DescriptorVerdict:
    """What a list does compared with the spec's [DESC-1..3]: ``problems`` (empty when it
    has the same effect), its count and the minimum."""

    problems: tuple[str, ...]
    count: int
    minimum: int
    share_bytes: int

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def coalesced(self) -> bool:
        return self.count == self.minimum


def judge_descriptors(
    descriptors: Sequence[object], reference: DescriptorPlan, *, limit: int = 5
) -> DescriptorVerdict:
    """Judge ``descriptors`` by effect against the spec's plan [DESC-1, DESC-2].

    It must stay inside the registered regions, write each byte of the receiver's share
    once from the sender's byte the spec reads it from, and write nothing else; order and
    granularity are free. The first ``limit`` problems are listed, each with its values
    and its obligation.
    """
    problems: list[str] = []
    src_regions, dst_regions = reference.source.regions(), reference.target.regions()
    # The spec's runs, sorted by destination: a right range lies inside one of them.
    runs = sorted(reference.descriptors, key=lambda d: (d.dst_region, d.dst_offset))
    keys = [(d.dst_region, d.dst_offset) for d in runs]
    placed: list[tuple[str, int, int, int]] = []
    parsed = []
    for i, value in enumerate(descriptors):
        try:
            parsed.append(Descriptor.of(value))
        except ValueError as error:
            problems.append(f"descriptor {i}: {error}")
    for i, d in enumerate(parsed):
        for side, region, offset, regions in (
            ("src", d.src_region, d.src_offset, src_regions),
            ("dst", d.dst_region, d.dst_offset, dst_regions),
        ):
            if region not in regions:
                problems.append(
                    f"descriptor {i} {d.to_list()}: no {side} region {region!r} (the regions are "
                    f"{', '.join(regions)}) [DESC-2.1]"
                )
            elif offset < 0 or d.length < 1 or offset + d.length > regions[region]:
                problems.append(
                    f"descriptor {i} {d.to_list()}: {side} bytes [{offset}, {offset + d.length}) "
                    f"leave region {region!r} of {regions[region]} bytes [DESC-2.1]"
                )
        if problems and len(problems) >= limit:
            break
        if d.dst_region not in dst_regions or d.length < 1:
            continue
        at = bisect.bisect_right(keys, (d.dst_region, d.dst_offset)) - 1
        run = runs[at] if at >= 0 else None
        inside = (
            run is not None
            and run.dst_region == d.dst_region
            and d.dst_offset + d.length <= run.dst_offset + run.length
        )
        if not inside:
            where = reference.target.locate(d.dst_region, d.dst_offset)
            problems.append(
                f"descriptor {i} {d.to_list()}: writes receiver bytes [{d.dst_offset}, "
                f"{d.dst_offset + d.length}) of {d.dst_region!r} (from {where}) that are not "
                "all in the receiver's share [DESC-1.3]"
            )
            continue
        assert run is not None
        want = run.src_offset + (d.dst_offset - run.dst_offset)
        if d.src_region != run.src_region or d.src_offset != want:
            problems.append(
                f"descriptor {i} {d.to_list()}: receiver bytes at {d.dst_offset} of "
                f"{d.dst_region!r} ({reference.target.locate(d.dst_region, d.dst_offset)}) "
                f"come from sender byte {d.src_offset} of {d.src_region!r}; they are the "
                f"sender's byte {want} of {run.src_region!r} "
                f"({reference.source.locate(run.src_region, want)}) [DESC-1.1]"
            )
            continue
        placed.append((d.dst_region, d.dst_offset, d.dst_offset + d.length, i))
    placed.sort()
    for (r1, _, e1, i1), (r2, s2, e2, i2) in itertools.pairwise(placed):
        if r1 == r2 and s2 < e1:
            problems.append(
                f"descriptors {i1} and {i2} both write receiver bytes [{s2}, {min(e1, e2)}) of "
                f"{r1!r} ({reference.target.locate(r1, s2)}) [DESC-1.2]"
            )
    covered = sum(e - s for _, s, e, _ in placed)
    if not any("[DESC-1.2]" in p for p in problems) and covered < reference.share_bytes:
        missing = _first_gap(placed, runs)
        problems.append(
            f"{reference.share_bytes - covered} byte(s) of the receiver's share are never "
            f"written; the first at {missing} [DESC-1.1]"
        )
    return DescriptorVerdict(
        tuple(problems[:limit]), len(parsed), len(reference.descriptors), reference.share_bytes
    )


def _first_gap(placed: list[tuple[str, int, int, int]], runs: list[Descriptor]) -> str:
    by_region: dict[str, list[tuple[int, int]]] = {}
    for region, start, end, _ in placed:
        by_region.setdefault(region, []).append((start, end))
    for run in runs:
        cursor = run.dst_offset
        for start, end in sorted(by_region.get(run.dst_region, [])):
            if end <= cursor or start >= run.dst_offset + run.length:
                continue
            if start > cursor:
                break
            cursor = max(cursor, end)
        if cursor < run.dst_offset + run.length:
            return f"byte {cursor} of {run.dst_region!r}"
    return "an unknown byte"


def region_buffers(cache: PagedCache) -> dict[str, torch.Tensor]:
    """Each registered region of ``cache`` as a flat byte view of its memory [DESC-2]."""
    spec = get_layout(cache.layout)
    if spec.cross_layer:
        assert cache.base is not None
        tensors = {"cache": cache.base}
    elif spec.tuple_form:
        names: tuple[str, ...] = ("K", "V") if len(cache.layers[0]) >= 2 else ("latent",)
        names = (*names, *(side.field.name for side in spec.side))
        tensors = {
            f"L{i}.{n}": t
            for i, layer in enumerate(cache.layers)
            for n, t in zip(names, layer, strict=True)
        }
    else:
        # A layout that is not a tuple form keeps each layer as one tensor.
        tensors = {f"L{i}": cast(torch.Tensor, layer) for i, layer in enumerate(cache.layers)}
    out = {}
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(f"region {name} is not one contiguous range of memory [DESC-2]")
        out[name] = tensor.view(-1).view(torch.uint8)
    return out


def execute_descriptors(
    descriptors: Sequence[Descriptor],
    source: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
) -> int:
    """Carry out ``descriptors``: copy each range from ``source``'s byte buffers into
    ``target``'s; returns the bytes moved. Every range is checked against its buffer first."""
    for d in descriptors:
        for region, offset, buffers in (
            (d.src_region, d.src_offset, source),
            (d.dst_region, d.dst_offset, target),
        ):
            if region not in buffers or offset < 0 or offset + d.length > buffers[region].numel():
                raise ValueError(f"descriptor {d.to_list()} leaves region {region!r} [DESC-2]")
    moved = 0
    if all(t.device.type == "cpu" for t in (*source.values(), *target.values())):
        # Still one copy per range, as a connector pays [DESC-3], but each is a memcpy
        # between memoryviews: no tensor is built per range. (``array.data`` is
        # ``memoryview(array)``, in a form numpy's stubs type before Python 3.12.)
        src = {name: t.numpy().data for name, t in source.items()}
        dst = {name: t.numpy().data for name, t in target.items()}
        for d in descriptors:
            dst[d.dst_region][d.dst_offset : d.dst_offset + d.length] = src[d.src_region][
                d.src_offset : d.src_offset + d.length
            ]
            moved += d.length
        return moved
    for d in descriptors:
        target[d.dst_region][d.dst_offset : d.dst_offset + d.length].copy_(
            source[d.src_region][d.src_offset : d.src_offset + d.length]
        )
        moved += d.length
    return moved
