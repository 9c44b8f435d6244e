"""A cache layout is data: axes, stride order, where K and V live, the record of each cell.

Every layout kvspec knows is a :class:`CacheLayout` value [LAYOUT-5]: the physical axes
of each stored tensor (outermost first), the engine's logical axis order (whose
permutation into the physical order is the engine's *stride order*), where K and V
live — on their own axis, as a tuple of tensors, packed one after the other in the
last axis, or as one latent — the *record* each (slot, head) cell holds in its last
axis (fields with their dtype and width, inline scale fields included), an optional
layers axis (one cross-layer tensor holds every layer), the element type of the
stored tensors and the engine source the layout was read from. Names are presets of
this data (:mod:`kvspec.memory.presets`).

Axis names: ``kv`` (K at index 0, V at 1), ``layers``, ``blocks``, ``slots`` (a
block's token slots), ``tokens`` (blocks and slots merged into one axis, as a token
pool keeps them: row ``block * block_size + slot``), ``heads``, ``head_slots`` (K's
heads then V's on one axis, as vLLM's NVFP4 page counts them: ``2 * heads``) and
``dim`` (the record, in elements of the stored tensor's type).

A layout may keep its fields outside the cells [LAYOUT-8]: as *planes* of each block
(vLLM's NVFP4 page is ``[K values | K scales | V values | V scales]`` per block, each a
``[heads, block_size, width]`` plane), or in *side* tensors of their own (SGLang's MXFP8
scales). A plane or side tensor may split the slot axis in two, ``slots_hi`` (slot //
unit) and ``slots_lo`` (slot % unit), and place the two parts apart: that is how a
4-token swizzle or a 32 x 4 interleave is said as data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from kvspec.tensors.dtypes import DTYPES
from kvspec.tensors.scaled_oracle import E8M0, FOUR_BIT

AXES: tuple[str, ...] = (
    "kv",
    "layers",
    "blocks",
    "slots",
    "tokens",
    "heads",
    "head_slots",
    "dim",
)
"""Every axis name a layout's tensor may use."""

SPLIT_AXES: tuple[str, str] = ("slots_hi", "slots_lo")
"""A block's slot axis split in two: ``slots_hi`` is slot // unit, ``slots_lo`` slot % unit
[LAYOUT-8]."""

PLANE_AXES: tuple[str, ...] = ("heads", "slots", *SPLIT_AXES, "dim")
"""Axis names of a plane within a block [LAYOUT-8]."""

SIDE_AXES: tuple[str, ...] = ("blocks", "tokens", "heads", "slots", *SPLIT_AXES, "dim")
"""Axis names of a side tensor, one per layer and field [LAYOUT-8]."""

FIELD_DTYPES: dict[str, torch.dtype] = {
    **DTYPES,
    "int8": torch.int8,
    "uint8": torch.uint8,
    FOUR_BIT: torch.uint8,
    E8M0: torch.uint8,
}
"""Dtypes a record field or a stored tensor may have: the cache dtypes [DTYPE-1], the
1-byte integer types engines store quantised data and opaque records in, and the
block-scaled formats' packed fp4 pairs and e8m0 scales (read and written as their bytes,
uint8, so any torch reads them) [LAYOUT-8, ORACLE-8]."""

WIDTH_PREFIX = "head_dim/"
"""A field width ``head_dim/N`` is head_dim / N elements [LAYOUT-8]."""

SCALED_DTYPES: tuple[str, ...] = (FOUR_BIT, E8M0)
"""Field dtypes only a block-scaled layout's fields have; the oracle's values for them are
ORACLE-8's."""


@dataclass(frozen=True)
class Field:
    """One field of a cell's record [LAYOUT-5, LAYOUT-6].

    ``dtype`` None is the cache's dtype; ``width`` None is the head_dim (the latent width
    for a latent); a width ``"head_dim/N"`` is head_dim / N (a block scale's count, a
    packed pair's: widths as fractions of head_dim [LAYOUT-8]). A field named ``*_scale``
    is an inline scale.
    """

    name: str
    dtype: str | None = None
    width: int | str | None = None

    @property
    def per(self) -> int | None:
        """N of a width ``"head_dim/N"``; None for a width in elements or head_dim itself."""
        if isinstance(self.width, str):
            return int(self.width.removeprefix(WIDTH_PREFIX))
        return None

    @property
    def is_scale(self) -> bool:
        return self.name.endswith("scale")

    def resolve(self, dtype: str, head_dim: int) -> tuple[str, int]:
        """(dtype, width) of the field in a cache of ``dtype`` and ``head_dim``."""
        if self.per is not None:
            if head_dim % self.per:
                raise ValueError(
                    f"field {self.name} is head_dim/{self.per} wide: a head_dim of {head_dim} "
                    f"is not a multiple of {self.per} [LAYOUT-8]"
                )
            return (self.dtype or dtype, head_dim // self.per)
        assert not isinstance(self.width, str)
        return (self.dtype or dtype, self.width or head_dim)

    @property
    def fixed(self) -> bool:
        """Its width is a number of elements, whatever the head_dim."""
        return isinstance(self.width, int)

    def nbytes(self, dtype: str, head_dim: int) -> int:
        name, width = self.resolve(dtype, head_dim)
        return width * FIELD_DTYPES[name].itemsize


@dataclass(frozen=True)
class Plane:
    """Where one field lives outside the cells [LAYOUT-8]: a plane of every block of the
    layout's tensor (``axes`` of :data:`PLANE_AXES`), or a side tensor of its own per layer
    (``axes`` of :data:`SIDE_AXES`). ``unit`` is the size of ``slots_lo`` where the slot
    axis is split: slot t is at ``slots_hi`` t // unit and ``slots_lo`` t % unit."""

    field: str
    axes: tuple[str, ...]
    unit: int | None = None

    @property
    def split(self) -> bool:
        return "slots_lo" in self.axes

    def sizes(self, block_size: int, heads: int, width: int) -> dict[str, int]:
        """Each plane axis's size in a block of ``block_size`` slots."""
        unit = self.unit or 1
        return {
            "heads": heads,
            "slots": block_size,
            "slots_hi": block_size // unit,
            "slots_lo": unit,
            "dim": width,
        }

    def offset(
        self,
        block_size: int,
        heads: int,
        width: int,
        head: int | torch.Tensor,
        slot: int | torch.Tensor,
        index: int | torch.Tensor,
    ) -> int | torch.Tensor:
        """Element offset of element ``index`` of (``slot``, ``head``) within one block's plane
        (ints or broadcasting int64 tensors) [LAYOUT-8]."""
        unit = self.unit or 1
        coords = {
            "heads": head,
            "slots": slot,
            "slots_hi": slot // unit,
            "slots_lo": slot % unit,
            "dim": index,
        }
        sizes = self.sizes(block_size, heads, width)
        offset: int | torch.Tensor = 0
        stride = 1
        for axis in reversed([a for a in self.axes if a in sizes]):
            offset = offset + coords[axis] * stride
            stride *= sizes[axis]
        return offset


@dataclass(frozen=True)
class SideField:
    """A field in a tensor of its own, one per layer, beside K and V [LAYOUT-8]: SGLang's
    MXFP8 scales. ``of`` is the part it belongs with (``k`` or ``v``)."""

    field: Field
    of: str
    plane: Plane


@dataclass(frozen=True)
class Source:
    """Where a preset was read: project, file, version, and what was confirmed there."""

    project: str
    file: str
    version: str
    confirmed: str
    unconfirmed: str = ""

    def to_dict(self) -> dict[str, str]:
        return {
            "project": self.project,
            "file": self.file,
            "version": self.version,
            "confirmed": self.confirmed,
            "unconfirmed": self.unconfirmed,
        }


@dataclass(frozen=True)
class CacheLayout:
    """A cache layout as data [LAYOUT-1, LAYOUT-5].

    - ``axes``: the physical axes of each stored tensor, outermost first.
    - ``kv_tensors``: 2 (K and V), 1 (a latent), or None for token_major, which holds
      whichever its tuple has.
    - ``tuple_form``: K and V are separate tensors.
    - ``record``: the fields of the ``dim`` axis in byte order; empty means one field, the
      K or V of the tensor's part (``k``/``v`` by the K/V axis or tuple index) or the latent.
      A packed layout lists ``k`` and ``v`` (and inline scales) here.
    - ``logical``: the engine's logical axis order; the stride order is its permutation into
      ``axes``. None means the logical order is the physical one.
    - ``element``: the stored tensor's dtype; None means the cache's dtype.
    - ``per_layer``: for a layout with a ``layers`` axis, the preset each layer reads as.
    - ``source``: where the layout was read; None for kvspec's own forms.
    """

    name: str
    shape: str
    axes: tuple[str, ...]
    kv_tensors: int | None
    tuple_form: bool
    record: tuple[Field, ...] = ()
    logical: tuple[str, ...] | None = None
    element: str | None = None
    per_layer: str | None = None
    source: Source | None = None
    dtypes: tuple[str, ...] | None = None
    """The cache dtypes the layout holds (None: every allowed cache dtype [DTYPE-1])."""
    fixed_head_dim: int | None = None
    """The head_dim (latent width) a fixed-format record holds, e.g. 576 for FlashMLA's."""
    planes: tuple[Plane, ...] = ()
    """The record's fields as planes of each block, in byte order [LAYOUT-8]."""
    side: tuple[SideField, ...] = ()
    """Fields in tensors of their own, one per layer and field [LAYOUT-8]."""
    fixed_block_size: int | None = None
    """The one block (page) size the layout has, e.g. 128 for SGLang's MXFP8 interleave."""
    head_dim_multiple: int | None = None
    """head_dim must be a multiple of this (vLLM's NVFP4 swizzle: 64) [LAYOUT-8]."""
    layer_form: CacheLayout | None = field(default=None, compare=False, repr=False)
    """The per-layer preset's value (``per_layer`` is its name), set where the layout is
    read; not part of the layout's identity, which ``per_layer`` already states."""
    origin: str | None = field(default=None, compare=False, repr=False)
    """The path of the layout file it was read from (None: a preset or kvspec's own form);
    how it is written back where it is serialized (:attr:`ref`)."""

    def __post_init__(self) -> None:
        unknown = [a for a in self.axes if a not in AXES]
        if unknown or len(set(self.axes)) != len(self.axes):
            raise ValueError(
                f"layout {self.name}: axes {self.axes} must be distinct names of {AXES}"
            )
        if self.logical is not None and sorted(self.logical) != sorted(self.axes):
            raise ValueError(
                f"layout {self.name}: logical order {self.logical} is not a permutation of its "
                f"axes {self.axes} [LAYOUT-5]"
            )
        if ("layers" in self.axes) != (self.per_layer is not None):
            raise ValueError(f"layout {self.name}: a layers axis needs its per-layer preset")
        if self.layer_form is not None and self.layer_form.name != self.per_layer:
            raise ValueError(
                f"layout {self.name}: its per-layer layout is {self.per_layer!r}, not "
                f"{self.layer_form.name!r} [LAYOUT-5]"
            )

    @property
    def ref(self) -> str:
        """The text that names it wherever it is written (a configuration's JSON, a report):
        its layout file's path, or its preset name [LAYOUT-1, LAYOUT-5]."""
        return self.origin or self.name

    @property
    def layer_layout(self) -> CacheLayout:
        """The layout each layer reads as: the per-layer preset's value for a cross-layer
        layout, the layout itself otherwise [LAYOUT-5]."""
        if self.per_layer is None:
            return self
        if self.layer_form is None:
            raise ValueError(
                f"layout {self.name}: its per-layer layout {self.per_layer!r} was not read "
                "with it; read the layout from its file or a preset [LAYOUT-5]"
            )
        return self.layer_form

    def page_size(self, block_size: int | None) -> int | None:
        """The page size a reader must be told for a cache of ``block_size``: the block size
        for a token pool (its shape does not say it), None for any other layout [LAYOUT-5]."""
        return block_size if self.merged_tokens else None

    def tensors(self, kv: int | None = None) -> int:
        """K and V (2) or a latent (1): the layout's own count, else ``kv`` (token_major holds
        either), else 2 [LAYOUT-1]."""
        return self.kv_tensors or kv or 2

    def cell_bytes(self, dtype: str, head_dim: int, kv: int | None = None) -> int:
        """Bytes of one (layer, token, head) cell: every field of every part, inline scales
        and side fields included [LAYOUT-6, LAYOUT-8]."""
        return sum(f.nbytes(dtype, head_dim) for f in self.fields(kv))

    @property
    def kv_axis(self) -> int | None:
        return self.axes.index("kv") if "kv" in self.axes else None

    @property
    def paged(self) -> bool:
        """False for token_major, whose block size is always 1 [LAYOUT-2]."""
        return "slots" in self.axes or "tokens" in self.axes

    @property
    def merged_tokens(self) -> bool:
        """Blocks and slots share one axis: the block size is not in the shape."""
        return "tokens" in self.axes

    @property
    def cross_layer(self) -> bool:
        return "layers" in self.axes

    @property
    def packed(self) -> bool:
        """K and V (and their inline scales) share the last axis of one tensor."""
        return any(f.name == "k" for f in self.record)

    @property
    def plain(self) -> bool:
        """Its cells hold only K and V (or the latent) in the cache's dtype: no inline
        scales, no fixed-format record, no planes or side tensors [LAYOUT-6, LAYOUT-8]."""
        return not self.scaled and all(
            f.dtype is None and f.width is None and not f.is_scale for f in self.record
        )

    @property
    def scaled(self) -> bool:
        """Its fields live outside the cells: per-block planes or side tensors [LAYOUT-8]."""
        return bool(self.planes or self.side)

    def placement(self, name: str) -> Plane | None:
        """The plane or side tensor field ``name`` lives in, or None (it is in the cell)."""
        for plane in self.planes:
            if plane.field == name:
                return plane
        for side in self.side:
            if side.field.name == name:
                return side.plane
        return None

    @property
    def stride_order(self) -> tuple[int, ...]:
        """The engine's stride order: physical axis i is logical axis ``stride_order[i]``."""
        logical = self.logical or self.axes
        return tuple(logical.index(a) for a in self.axes)

    def parts(self, tensors: int | None = None) -> tuple[tuple[Field, ...], ...]:
        """The fields each part holds; a part is one index of the K/V axis, one tensor of
        the tuple, or the whole tensor [LAYOUT-5]."""
        if self.kv_axis is not None or (self.tuple_form and (self.kv_tensors or tensors) == 2):
            return ((Field("k"),), (Field("v"),))
        if self.record:
            return (self.record,)
        return ((Field("latent"),),)

    def fields(self, kv: int | None = None) -> tuple[Field, ...]:
        """Every field of a cell, over all parts: the information the layout holds (``kv``
        says which token_major holds: 2 tensors or 1). A side field comes after the part it
        belongs with [LAYOUT-8]."""
        out: list[Field] = []
        for part in self.parts(kv):
            out.extend(part)
            names = {f.name for f in part}
            out.extend(s.field for s in self.side if s.of in names)
        return tuple(out)

    def information(
        self, dtype: str, head_dim: int, kv: int | None = None
    ) -> tuple[tuple[str, str, int | str], ...]:
        """What a cell holds, independent of where: (field, dtype, width), sorted by name; a
        ``head_dim/N`` width that head_dim does not divide stays ``"head_dim/N"``.
        Two layouts convert into one another only when this is equal [LAYOUT-3, LAYOUT-6]."""
        return tuple(sorted(_held(f, dtype, head_dim) for f in self.fields(kv)))

    def record_bytes(self, part: int, dtype: str, head_dim: int) -> int:
        return sum(f.nbytes(dtype, head_dim) for f in self.parts()[part])

    def element_dtype(self, dtype: str) -> str:
        return self.element or dtype

    def dim_size(self, dtype: str, head_dim: int) -> int:
        """Size of the ``dim`` axis, in elements of the stored tensor [LAYOUT-5]; with a
        ``head_slots`` axis, each head slot holds 1/kv of a cell's bytes [LAYOUT-8]."""
        item = FIELD_DTYPES[self.element_dtype(dtype)].itemsize
        total = self.record_bytes(0, dtype, head_dim)
        if "head_slots" in self.axes:
            total //= self.kv_tensors or 1
        if total % item:
            raise ValueError(
                f"layout {self.name}: a {total}-byte record is not a whole number of "
                f"{self.element_dtype(dtype)} elements [LAYOUT-5]"
            )
        return total // item

    def head_dim_of(self, dim: int, dtype: str) -> int | None:
        """The head_dim that gives a ``dim`` axis of ``dim`` elements, or None."""
        item = FIELD_DTYPES[self.element_dtype(dtype)].itemsize
        part = self.parts()[0]
        fixed = sum(f.nbytes(dtype, 1) for f in part if f.fixed)
        per = sum(
            (
                Fraction(FIELD_DTYPES[f.dtype or dtype].itemsize, f.per or 1)
                for f in part
                if not f.fixed
            ),
            Fraction(0),
        )
        have = dim * item * ((self.kv_tensors or 1) if "head_slots" in self.axes else 1)
        rest = have - fixed
        if per == 0:
            return self.fixed_head_dim if rest == 0 else None
        head_dim = rest / per
        if rest <= 0 or head_dim.denominator != 1:
            return None
        if any(f.per and head_dim % f.per for f in part):
            return None
        return int(head_dim)


def _held(f: Field, dtype: str, head_dim: int) -> tuple[str, str, int | str]:
    if f.per is not None and head_dim % f.per:
        return (f.name, f.dtype or dtype, str(f.width))
    return (f.name, *f.resolve(dtype, head_dim))


STATE_AXES: tuple[str, ...] = ("blocks", "dim", "state_len")
"""Axis names of a conv-state tensor: ``blocks`` (one state page per block), ``dim`` (the
rank's conv channels) and ``state_len`` (the rows: conv_kernel - 1 + num_spec) [SLAYOUT-1]."""


@dataclass(frozen=True)
class StateCacheLayout:
    """How a state layer's cache sits in memory, as data [SLAYOUT-1].

    A state layer keeps one page per block; the page holds its tensors one after the
    other, conv state first, then the temporal state, each a strided view of the layer's
    buffer whose block stride is the page size. ``conv_axes`` is the conv-state tensor's
    physical order; ``logical`` is the order the engine's kernels index it in (dim first),
    so the stride order is the permutation of the one into the other, as for KV layouts
    (SD is to DS what NHD is to HND). The temporal state is contiguous within its page.
    """

    name: str
    shape: str
    conv_axes: tuple[str, ...]
    source: Source
    logical: tuple[str, ...] = STATE_AXES

    def __post_init__(self) -> None:
        if sorted(self.conv_axes) != sorted(STATE_AXES) or self.conv_axes[0] != "blocks":
            raise ValueError(
                f"state layout {self.name}: conv axes {self.conv_axes} must be blocks, then dim "
                "and state_len in some order [SLAYOUT-1]"
            )

    @property
    def dim_first(self) -> bool:
        """The DS order: a channel's rows are contiguous."""
        return self.conv_axes.index("dim") < self.conv_axes.index("state_len")

    @property
    def stride_order(self) -> tuple[int, ...]:
        """Physical axis i is logical axis ``stride_order[i]``."""
        return tuple(self.logical.index(a) for a in self.conv_axes)
