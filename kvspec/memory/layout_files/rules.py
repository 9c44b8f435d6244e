"""The rules between a cache layout file's fields, which a schema cannot state [LAYOUT-5,
LAYOUT-6, LAYOUT-8].

Each field of a file may be well formed and the layout still say nothing coherent: a
``kv`` axis where K and V are a tuple, a record where each cell holds K or V whole, a
layers axis without the per-layer preset it reads as, a fixed-width record without the
head_dim it holds, planes that are not one per field of the record. :mod:`~kvspec.memory.
layout_files.reading` holds every cache layout file to these rules once its fields are
read; each refusal names the field and why.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvspec.memory.layout_files.format import Where, written
from kvspec.memory.layout_model import CacheLayout, Field


def check_axes(
    at: Where, axes: tuple[str, ...], logical: tuple[str, ...] | None, per_layer: str | None
) -> None:
    """The rules on the axes and the layers axis [LAYOUT-5]."""
    if axes[-1] != "dim":
        raise at.error(
            "axes", f"ends with {axes[-1]!r}; the last axis is 'dim', each cell's record"
        )
    if "tokens" in axes and ("blocks" in axes or "slots" in axes):
        other = "blocks" if "blocks" in axes else "slots"
        raise at.error(
            "axes",
            f"has both 'tokens' and {other!r}: a token pool's rows are blocks and slots merged "
            "into one axis, so it has neither of them",
        )
    if "blocks" not in axes and "tokens" not in axes:
        raise at.error(
            "axes", "has neither 'blocks' nor 'tokens': a cache is blocks of slots or token rows"
        )
    if logical is not None and sorted(logical) != sorted(axes):
        raise at.error(
            "logical",
            f"is [{', '.join(logical)}], not a permutation of the axes [{', '.join(axes)}]: "
            "the stride order maps one onto the other",
        )
    if "layers" in axes and per_layer is None:
        raise at.error(
            "per_layer",
            "is missing: the axes have a 'layers' axis, so say which per-layer preset each "
            "layer reads as",
        )
    if per_layer is not None and "layers" not in axes:
        raise at.error("per_layer", "is given but the axes have no 'layers' axis")


def check_placement(layout: CacheLayout, at: Where) -> None:
    """Where K and V live is said once: a ``kv`` axis, a tuple, the packed record or a
    latent, never two of them [LAYOUT-1, LAYOUT-5]."""
    kv, tup = layout.kv_tensors, layout.tuple_form
    has_axis = "kv" in layout.axes
    if kv is None and not tup:
        raise at.error(
            "kv_tensors",
            "is null (either K and V or a latent), which only a tuple of tensors can hold; "
            "set tuple_form true or say 2 or 1",
        )
    if has_axis and kv != 2:
        raise at.error(
            "axes",
            f"has a 'kv' axis (K at 0, V at 1) but kv_tensors is {written(kv)}: a K/V axis holds "
            "K and V, kv_tensors 2",
        )
    if has_axis and tup:
        raise at.error(
            "tuple_form",
            "is true but the axes have a 'kv' axis: K and V are either separate tensors or "
            "one tensor's K/V axis, not both",
        )
    if kv == 1 and tup:
        raise at.error(
            "tuple_form", "is true for one latent (kv_tensors 1): a latent is one tensor"
        )
    if kv == 2 and not tup and not has_axis and not layout.packed:
        raise at.error(
            "record",
            "does not list 'k' and 'v', and the layout has no 'kv' axis and no tuple: K and V "
            "in one tensor without a K/V axis are packed in its last axis, so the record "
            "must name them",
        )


def check_record(layout: CacheLayout, at: Where) -> None:
    """A record is what a packed or latent cell holds; its fields place K and V once
    [LAYOUT-5, LAYOUT-6]."""
    names = [f.name for f in layout.record]
    if layout.record and ("kv" in layout.axes or (layout.tuple_form and layout.kv_tensors == 2)):
        raise at.error(
            "record",
            "is given, but K and V are on a 'kv' axis or a tuple, so each cell holds K or V "
            "whole: the record would be ignored (a record is a packed cell's or a latent's)",
        )
    if layout.record and layout.kv_tensors is None:
        raise at.error("record", "is given for kvspec's request form (kv_tensors null)")
    kv_named = [n for n in ("k", "v") if n in names]
    if kv_named and (len(kv_named) != 2 or layout.kv_tensors != 2):
        raise at.error(
            "record",
            f"names {' and '.join(repr(n) for n in kv_named)}: a packed record holds both 'k' "
            "and 'v' of a layout with kv_tensors 2"
            + ("" if layout.kv_tensors == 2 else f"; kv_tensors is {written(layout.kv_tensors)}"),
        )
    if layout.element is not None and layout.dtypes is None:
        raise at.error(
            "element",
            f"is {layout.element!r} but the file has no 'dtypes': a cache stored as "
            f"{layout.element} elements must say the cache dtypes its record holds",
        )
    fixed = bool(layout.record) and all(f.fixed for f in layout.record)
    if fixed and layout.fixed_head_dim is None:
        raise at.error(
            "fixed_head_dim",
            "is missing: every field of the record has a fixed width, so the head_dim (latent "
            "width) the record holds must be stated",
        )
    if not fixed and layout.fixed_head_dim is not None:
        raise at.error(
            "fixed_head_dim",
            "is given, but the record has a field as wide as head_dim: the head_dim follows "
            "from the tensor's last axis, and the value would be ignored",
        )


def check_scaled(layout: CacheLayout, at: Where) -> None:
    """Planes and side tensors [LAYOUT-8]: every record field is one plane of a block (the
    block outermost, no layers or token axis), a side field belongs with K or V of a
    tuple, and a plane's split unit divides the block size where that is fixed."""
    axes = layout.axes
    if "head_slots" in axes and not layout.planes:
        raise at.error(
            "axes",
            "has 'head_slots' (K's heads then V's on one axis), which only a layout of "
            "per-block planes has; give 'planes'",
        )
    if layout.planes:
        names = [p.field for p in layout.planes]
        record = [f.name for f in layout.record]
        if not layout.record:
            raise at.error("planes", "are given, but there is no record: a plane holds a field")
        if sorted(names) != sorted(record) or len(set(names)) != len(names):
            raise at.error(
                "planes",
                f"hold the fields [{', '.join(names)}]; each field of the record "
                f"[{', '.join(record)}] is one plane, once",
            )
        if axes[0] != "blocks" or any(a in axes for a in ("layers", "tokens", "kv")):
            raise at.error(
                "axes",
                f"are [{', '.join(axes)}]: a layout of per-block planes keeps each block's "
                "bytes together, so 'blocks' is its first axis and it has no 'layers', "
                "'tokens' or 'kv' axis",
            )
        if ("heads" in axes) == ("head_slots" in axes):
            raise at.error(
                "axes",
                "must name 'heads' or 'head_slots' (K's heads then V's), one of them",
            )
    if layout.side and not (layout.tuple_form and layout.kv_tensors == 2):
        raise at.error(
            "side",
            "is given, but K and V are not a tuple of tensors: a side field is a tensor "
            "beside K's and V's",
        )
    if layout.side and layout.cross_layer:
        raise at.error(
            "side", "is given for a layout with a layers axis; side tensors are per layer"
        )
    if layout.side and layout.record:
        raise at.error("side", "and 'record' are both given; a side layout's cells are K or V")
    unit_planes = [*layout.planes, *(s.plane for s in layout.side)]
    for plane in unit_planes:
        if plane.unit and layout.fixed_block_size and layout.fixed_block_size % plane.unit:
            raise at.error(
                "fixed_block_size",
                f"is {layout.fixed_block_size}, which field {plane.field}'s unit of "
                f"{plane.unit} slots does not divide",
            )
    if layout.fixed_block_size is not None and not layout.paged:
        raise at.error("fixed_block_size", "is given for a layout without blocks")


def check_layers(layout: CacheLayout, at: Where, known: Mapping[str, CacheLayout]) -> None:
    """The per-layer preset each layer of a layers axis reads as [LAYOUT-5]: the layout
    without its layers axis is that preset's; where the preset is a tuple (K, V) and the
    layout has a 'kv' axis, its index 0 and 1 are the tuple's two tensors."""
    if layout.per_layer is None:
        return
    base = known.get(layout.per_layer)
    if base is None:
        raise at.error(
            "per_layer",
            f"names {layout.per_layer!r}, which is no per-layer preset; the presets are "
            f"{', '.join(n for n, k in known.items() if not k.cross_layer)}",
        )
    if base.cross_layer:
        raise at.error("per_layer", f"names {base.name!r}, which itself has a layers axis")
    own = tuple(a for a in layout.axes if a != "layers")
    split = "kv" in layout.axes and base.tuple_form
    if split:
        # A tuple (K, V) per layer: index 0 and 1 of the 'kv' axis are its two tensors.
        own = tuple(a for a in own if a != "kv")
    for field, mine, theirs in (
        ("axes", own, base.axes),
        ("kv_tensors", layout.kv_tensors, base.kv_tensors),
        ("tuple_form", layout.tuple_form or split, base.tuple_form),
        ("record", layout.record, base.record),
        ("element", layout.element, base.element),
        ("dtypes", layout.dtypes, base.dtypes),
    ):
        if mine != theirs:
            shown = _plain(mine) + (" without 'layers'" if field == "axes" else "")
            raise at.error(
                "per_layer",
                f"names {base.name!r}, whose {field} is {_plain(theirs)}, but this layout's is "
                f"{shown}: each layer must read as that preset",
            )


def _plain(value: object) -> str:
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return f"[{', '.join(value)}]"
    if isinstance(value, tuple):
        return "[" + ", ".join(f.name if isinstance(f, Field) else str(f) for f in value) + "]"
    return written(value)
