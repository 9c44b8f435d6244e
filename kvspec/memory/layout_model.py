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
pool keeps them: row ``block * block_size + slot``), ``heads`` and ``dim`` (the
record, in elements of the stored tensor's type).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.tensors.dtypes import DTYPES

AXES: tuple[str, ...] = ("kv", "layers", "blocks", "slots", "tokens", "heads", "dim")
"""Every axis name a layout may use."""

FIELD_DTYPES: dict[str, torch.dtype] = {
    **DTYPES,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
"""Dtypes a record field or a stored tensor may have: the cache dtypes [DTYPE-1], plus the
1-byte integer types engines store quantised data and opaque records in."""


@dataclass(frozen=True)
class Field:
    """One field of a cell's record [LAYOUT-5, LAYOUT-6].

    ``dtype`` None is the cache's dtype; ``width`` None is the head_dim (the latent width
    for a latent). A field named ``*_scale`` is an inline scale.
    """

    name: str
    dtype: str | None = None
    width: int | None = None

    @property
    def is_scale(self) -> bool:
        return self.name.endswith("scale")

    def resolve(self, dtype: str, head_dim: int) -> tuple[str, int]:
        """(dtype, width) of the field in a cache of ``dtype`` and ``head_dim``."""
        return (self.dtype or dtype, self.width or head_dim)

    def nbytes(self, dtype: str, head_dim: int) -> int:
        name, width = self.resolve(dtype, head_dim)
        return width * FIELD_DTYPES[name].itemsize


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
        scales, no fixed-format record [LAYOUT-6]."""
        return all(f.dtype is None and f.width is None and not f.is_scale for f in self.record)

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
        says which token_major holds: 2 tensors or 1)."""
        return tuple(f for part in self.parts(kv) for f in part)

    def information(
        self, dtype: str, head_dim: int, kv: int | None = None
    ) -> tuple[tuple[str, str, int], ...]:
        """What a cell holds, independent of where: (field, dtype, width), sorted by name.
        Two layouts convert into one another only when this is equal [LAYOUT-3, LAYOUT-6]."""
        return tuple(sorted((f.name, *f.resolve(dtype, head_dim)) for f in self.fields(kv)))

    def record_bytes(self, part: int, dtype: str, head_dim: int) -> int:
        return sum(f.nbytes(dtype, head_dim) for f in self.parts()[part])

    def element_dtype(self, dtype: str) -> str:
        return self.element or dtype

    def dim_size(self, dtype: str, head_dim: int) -> int:
        """Size of the ``dim`` axis, in elements of the stored tensor [LAYOUT-5]."""
        item = FIELD_DTYPES[self.element_dtype(dtype)].itemsize
        total = self.record_bytes(0, dtype, head_dim)
        if total % item:
            raise ValueError(
                f"layout {self.name}: a {total}-byte record is not a whole number of "
                f"{self.element_dtype(dtype)} elements [LAYOUT-5]"
            )
        return total // item

    def head_dim_of(self, dim: int, dtype: str) -> int | None:
        """The head_dim that gives a ``dim`` axis of ``dim`` elements, or None."""
        item = FIELD_DTYPES[self.element_dtype(dtype)].itemsize
        fixed = sum(f.nbytes(dtype, 1) for f in self.parts()[0] if f.width is not None)
        per = sum(
            FIELD_DTYPES[f.resolve(dtype, 1)[0]].itemsize
            for f in self.parts()[0]
            if f.width is None
        )
        rest = dim * item - fixed
        if per == 0:
            return self.fixed_head_dim if rest == 0 else None
        if rest <= 0 or rest % per:
            return None
        return rest // per


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
