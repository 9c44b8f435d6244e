"""Layout files: a cache layout as a JSON file under a published schema [LAYOUT-5, SLAYOUT-1].

A layout file is one :class:`~kvspec.memory.layout_model.CacheLayout` value (``"kind":
"cache"``) or one :class:`~kvspec.memory.layout_model.StateCacheLayout` value (``"kind":
"state"``) written as data: every key is a field of that value, and an optional field
left out takes the value's default. Nothing in the file is a new meaning; the format
is a serialisation, and :func:`layout_to_data` writes exactly what :func:`layout_from_data`
reads. The schema ships inside the package (:func:`schema`, ``kvspec/memory/layouts/
schema.json``); every preset is such a file (``kvspec/memory/layouts/presets/``).

Reading needs no jsonschema: :func:`layout_from_data` enforces the schema itself (types,
names, enums, required and unknown fields) and then the rules that tie fields together,
which a schema cannot state — a ``kv`` axis only where K and V share one tensor, a record
only where a cell is one (a packed K | V, a latent's fields), a layers axis with the
per-layer preset it reads as, a fixed-width record with the head_dim it holds. A file
that breaks one is refused, naming the file, the field and why [LAYOUT-5, LAYOUT-6].
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from kvspec.memory.layout_model import (
    AXES,
    FIELD_DTYPES,
    PLANE_AXES,
    SIDE_AXES,
    STATE_AXES,
    WIDTH_PREFIX,
    CacheLayout,
    Field,
    Plane,
    SideField,
    Source,
    StateCacheLayout,
)
from kvspec.tensors.dtype_names import DTYPE_NAMES

__all__ = [
    "CACHE_FIELDS",
    "CACHE_REQUIRED",
    "KINDS",
    "MAX_FILE_BYTES",
    "SOURCE_FIELDS",
    "SOURCE_REQUIRED",
    "STATE_FIELDS",
    "STATE_REQUIRED",
    "LayoutFileError",
    "dumps",
    "is_layout_file",
    "layout_from_data",
    "layout_to_data",
    "read_layout_file",
    "schema",
]

KINDS = ("cache", "state")
"""What a layout file holds: a KV cache layout, or a state cache's [LAYOUT-5, SLAYOUT-1]."""

CACHE_FIELDS = (
    "kind",
    "name",
    "shape",
    "axes",
    "logical",
    "kv_tensors",
    "tuple_form",
    "record",
    "element",
    "per_layer",
    "dtypes",
    "fixed_head_dim",
    "planes",
    "side",
    "fixed_block_size",
    "head_dim_multiple",
    "source",
)
"""The fields of a cache layout file, in the order :func:`layout_to_data` writes them."""

CACHE_REQUIRED = ("kind", "name", "shape", "axes", "kv_tensors", "tuple_form")
"""The fields a cache layout file must give: those with no default in :class:`CacheLayout`."""

STATE_FIELDS = ("kind", "name", "shape", "conv_axes", "logical", "source")
STATE_REQUIRED = ("kind", "name", "shape", "conv_axes", "source")
SOURCE_FIELDS = ("project", "file", "version", "confirmed", "unconfirmed")
SOURCE_REQUIRED = ("project", "file", "version", "confirmed")
RECORD_FIELDS = ("name", "dtype", "width")
PLANE_FIELDS = ("field", "axes", "unit")
SIDE_FIELDS = ("name", "dtype", "width", "of", "axes", "unit")

MAX_FILE_BYTES = 1 << 20
"""A layout file is a few hundred bytes; anything past 1 MiB is refused unread."""

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_NAME_MAX = 64


class LayoutFileError(ValueError):
    """A layout file that is not one: the message names the file, the field and why."""


def schema() -> dict[str, Any]:
    """The published JSON Schema of layout files (shipped as package data)."""
    text = resources.files("kvspec.memory").joinpath("layouts", "schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def is_layout_file(ref: object) -> bool:
    """Whether a layout reference names a file rather than a preset: a path ending in
    ``.json`` (no preset name contains a dot) [LAYOUT-1, LAYOUT-5]."""
    return isinstance(ref, (str, Path)) and str(ref).endswith(".json")


class _Where:
    """Builds the refusal for one file: ``layout file F: field 'X' <why>``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, field: str | None, why: str) -> LayoutFileError:
        at = f"field '{field}' " if field else ""
        return LayoutFileError(f"layout file {self.where}: {at}{why}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not a JSON number")


def read_layout_file(
    path: str | Path, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout the file at ``path`` holds, or a :class:`LayoutFileError` naming the
    file, the field and why [LAYOUT-5, SLAYOUT-1]. ``known``: the layouts a ``per_layer``
    may name, and whose names a file may not reuse for another layout."""
    where = _Where(str(path))
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise where.error(None, f"cannot be read: {error.strerror or error}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise where.error(None, f"is over {MAX_FILE_BYTES} bytes; a layout file is a few hundred")
    return layout_from_json(raw, str(path), known=known)


def layout_from_json(
    raw: bytes | str, where: str, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout a layout file's text holds (``where`` names it in refusals)."""
    at = _Where(where)
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise at.error(None, "is not UTF-8 text") from None
    except _Duplicate as dup:
        raise at.error(dup.key, "is given twice: which one is meant is ambiguous") from None
    except ValueError as error:
        raise at.error(None, f"is not JSON: {error}") from None
    return layout_from_data(data, where, known=known)


def layout_from_data(
    data: object, where: str, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout ``data`` (a parsed layout file) describes; refuses what the schema or
    the rules between fields refuse, naming the field and why [LAYOUT-5, SLAYOUT-1]."""
    at = _Where(where)
    if not isinstance(data, dict):
        raise at.error(None, f"holds a JSON {_kind_of(data)}; a layout file holds one object")
    kind = data.get("kind")
    if "kind" not in data:
        raise at.error("kind", f"is missing: say what the file holds, one of {list(KINDS)}")
    if kind not in KINDS:
        raise at.error("kind", f"is {_show(kind)}; it must be one of {list(KINDS)}")
    known = known or {}
    if kind == "state":
        return _state_layout(data, at)
    return _cache_layout(data, at, known)


def _kind_of(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _show(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def _fields(
    data: dict[str, Any],
    at: _Where,
    allowed: tuple[str, ...],
    required: tuple[str, ...],
    what: str,
    *,
    prefix: str = "",
) -> None:
    dot = f"{prefix}." if prefix else ""
    extra = [k for k in data if k not in allowed and (k != "$schema" or prefix)]
    if extra:
        raise at.error(
            f"{dot}{extra[0]}", f"is not a field of {what}; its fields are {', '.join(allowed)}"
        )
    for name in required:
        if name not in data:
            raise at.error(f"{dot}{name}", f"is missing; {what} must give {', '.join(required)}")
    if "$schema" in data and not isinstance(data["$schema"], str):
        raise at.error("$schema", "must be a string (the schema's address)")


def _text(value: object, field: str, at: _Where, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise at.error(field, f"is a {_kind_of(value)}; it must be a string")
    if not value and not empty:
        raise at.error(field, "is empty")
    return value


def _name(value: object, field: str, at: _Where) -> str:
    name = _text(value, field, at)
    if len(name) > _NAME_MAX or not set(name) <= _NAME_CHARS or name[0] in "_-":
        raise at.error(
            field,
            f"is {name!r}: a name is up to {_NAME_MAX} letters, digits, '_' and '-', starting "
            "with a letter or digit (no dots, so it never reads as a file)",
        )
    return name


def _choice(value: object, field: str, at: _Where, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise at.error(field, f"is {_show(value)}; it must be one of {', '.join(choices)}")
    return value


def _positive(value: object, field: str, at: _Where) -> int:
    if type(value) is not int or value < 1:
        raise at.error(field, f"is {_show(value)}; it must be a whole number >= 1")
    return value


def _names(
    value: object, field: str, at: _Where, choices: tuple[str, ...], what: str = "names"
) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise at.error(field, f"is {_show(value)}; it must be a non-empty array of {what}")
    seen: set[str] = set()
    for i, item in enumerate(value):
        _choice(item, f"{field}[{i}]", at, choices)
        if item in seen:
            raise at.error(field, f"names {item!r} twice")
        seen.add(item)
    return tuple(value)


def _source(value: object, at: _Where) -> Source:
    if not isinstance(value, dict):
        raise at.error(
            "source",
            f"is a {_kind_of(value)}; it must be an object with fields {', '.join(SOURCE_FIELDS)}",
        )
    extra = [k for k in value if k not in SOURCE_FIELDS]
    if extra:
        raise at.error(
            f"source.{extra[0]}",
            f"is not a field of a source; its fields are {', '.join(SOURCE_FIELDS)}",
        )
    for name in SOURCE_REQUIRED:
        if name not in value:
            raise at.error(
                f"source.{name}",
                "is missing; a source says the engine project, the file(s) read, the "
                "release, and what was confirmed there",
            )
    texts = {k: _text(value[k], f"source.{k}", at) for k in SOURCE_REQUIRED}
    unconfirmed = _text(value.get("unconfirmed", ""), "source.unconfirmed", at, empty=True)
    return Source(**texts, unconfirmed=unconfirmed)


def _record(value: object, at: _Where) -> tuple[Field, ...]:
    if not isinstance(value, list) or not value:
        raise at.error(
            "record", f"is {_show(value)}; it must be a non-empty array of fields (or left out)"
        )
    fields: list[Field] = []
    for i, item in enumerate(value):
        here = f"record[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {_kind_of(item)}; a field is an object")
        extra = [k for k in item if k not in RECORD_FIELDS]
        if extra:
            raise at.error(
                f"{here}.{extra[0]}",
                f"is not a field of a record field; its fields are {', '.join(RECORD_FIELDS)}",
            )
        if "name" not in item:
            raise at.error(f"{here}.name", "is missing")
        name = _name(item["name"], f"{here}.name", at)
        dtype = (
            _choice(item["dtype"], f"{here}.dtype", at, tuple(FIELD_DTYPES))
            if "dtype" in item
            else None
        )
        width = _width(item["width"], f"{here}.width", at) if "width" in item else None
        if any(f.name == name for f in fields):
            raise at.error("record", f"names the field {name!r} twice")
        fields.append(Field(name, dtype, width))
    return tuple(fields)


def _width(value: object, field: str, at: _Where) -> int | str:
    """A field width: a whole number of elements, or ``head_dim/N`` [LAYOUT-8]."""
    if isinstance(value, str):
        n = value.removeprefix(WIDTH_PREFIX)
        if value.startswith(WIDTH_PREFIX) and n.isdigit() and not n.startswith("0"):
            return value
        raise at.error(
            field,
            f"is {value!r}; a width is a whole number >= 1 or 'head_dim/N' for a whole N >= 1",
        )
    return _positive(value, field, at)


def _plane(value: object, field: str, at: _Where, axes: tuple[str, ...]) -> Plane:
    """Where a field lives: its axes (a split slot axis with its unit) [LAYOUT-8]."""
    names = _names(value, f"{field}.axes", at, axes, "axis names")
    if "heads" not in names or "dim" not in names:
        raise at.error(f"{field}.axes", f"is [{', '.join(names)}]; it must name 'heads' and 'dim'")
    split = [a for a in ("slots_hi", "slots_lo") if a in names]
    if split and len(split) != 2:
        raise at.error(
            f"{field}.axes",
            f"names {split[0]!r} alone; a split slot axis is 'slots_hi' and 'slots_lo' together",
        )
    whole = "slots" in names or "tokens" in names
    if split and whole:
        raise at.error(
            f"{field}.axes", "names 'slots' (or 'tokens') and its split parts: one or the other"
        )
    if not split and not whole:
        raise at.error(
            f"{field}.axes",
            "has no slot axis: name 'slots', or 'slots_hi' and 'slots_lo' with a unit",
        )
    return Plane("", names, None)


def _planes(value: object, at: _Where) -> tuple[Plane, ...]:
    if not isinstance(value, list) or not value:
        raise at.error("planes", f"is {_show(value)}; it must be a non-empty array of planes")
    out = []
    for i, item in enumerate(value):
        here = f"planes[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {_kind_of(item)}; a plane is an object")
        _fields(item, at, PLANE_FIELDS, ("field", "axes"), "a plane", prefix=here)
        name = _name(item["field"], f"{here}.field", at)
        plane = _plane(item["axes"], here, at, PLANE_AXES)
        out.append(Plane(name, plane.axes, _unit(item, here, at, plane.axes)))
    return tuple(out)


def _unit(item: dict[str, Any], here: str, at: _Where, axes: tuple[str, ...]) -> int | None:
    split = "slots_lo" in axes
    if "unit" not in item:
        if split:
            raise at.error(
                f"{here}.unit", "is missing: a split slot axis says how many slots 'slots_lo' has"
            )
        return None
    unit = _positive(item["unit"], f"{here}.unit", at)
    if not split:
        raise at.error(f"{here}.unit", "is given, but the slot axis is not split")
    if unit < 2:
        raise at.error(f"{here}.unit", f"is {unit}; a split needs a unit of 2 or more")
    return unit


def _side(value: object, at: _Where) -> tuple[SideField, ...]:
    if not isinstance(value, list) or not value:
        raise at.error("side", f"is {_show(value)}; it must be a non-empty array of fields")
    out: list[SideField] = []
    for i, item in enumerate(value):
        here = f"side[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {_kind_of(item)}; a side field is an object")
        _fields(item, at, SIDE_FIELDS, ("name", "of", "axes"), "a side field", prefix=here)
        name = _name(item["name"], f"{here}.name", at)
        dtype = (
            _choice(item["dtype"], f"{here}.dtype", at, tuple(FIELD_DTYPES))
            if "dtype" in item
            else None
        )
        width = _width(item["width"], f"{here}.width", at) if "width" in item else None
        of = _choice(item["of"], f"{here}.of", at, ("k", "v"))
        plane = _plane(item["axes"], here, at, SIDE_AXES)
        if ("blocks" in plane.axes) == ("tokens" in plane.axes):
            raise at.error(
                f"{here}.axes",
                "must name 'blocks' (pages, with their slots) or 'tokens' (a pool's rows), "
                "one of them",
            )
        if "tokens" in plane.axes and plane.split:
            raise at.error(f"{here}.axes", "splits the slots of 'tokens' rows; use 'blocks'")
        if name in ("k", "v") or any(s.field.name == name for s in out):
            raise at.error(f"{here}.name", f"is {name!r}, a field the layout already has")
        out.append(
            SideField(
                Field(name, dtype, width),
                of,
                Plane(name, plane.axes, _unit(item, here, at, plane.axes)),
            )
        )
    return tuple(out)


def _cache_layout(
    data: dict[str, Any], at: _Where, known: Mapping[str, CacheLayout]
) -> CacheLayout:
    """A cache layout file's value: the schema's rules, then those between fields."""
    _fields(data, at, CACHE_FIELDS, CACHE_REQUIRED, "a cache layout")
    name = _name(data["name"], "name", at)
    shape = _text(data["shape"], "shape", at)
    axes = _names(data["axes"], "axes", at, AXES, "axis names")
    logical = (
        _names(data["logical"], "logical", at, AXES, "axis names") if "logical" in data else None
    )
    kv = data["kv_tensors"]
    if kv not in (1, 2, None) or type(kv) is bool:
        raise at.error(
            "kv_tensors", f"is {_show(kv)}; it must be 2 (K and V), 1 (a latent) or null"
        )
    tuple_form = data["tuple_form"]
    if type(tuple_form) is not bool:
        raise at.error("tuple_form", f"is {_show(tuple_form)}; it must be true or false")
    record = _record(data["record"], at) if "record" in data else ()
    element = (
        _choice(data["element"], "element", at, tuple(FIELD_DTYPES)) if "element" in data else None
    )
    per_layer = _name(data["per_layer"], "per_layer", at) if "per_layer" in data else None
    dtypes = (
        _names(data["dtypes"], "dtypes", at, DTYPE_NAMES, "cache dtypes")
        if "dtypes" in data
        else None
    )
    fixed = (
        _positive(data["fixed_head_dim"], "fixed_head_dim", at)
        if "fixed_head_dim" in data
        else None
    )
    planes = _planes(data["planes"], at) if "planes" in data else ()
    side = _side(data["side"], at) if "side" in data else ()
    fixed_block = (
        _positive(data["fixed_block_size"], "fixed_block_size", at)
        if "fixed_block_size" in data
        else None
    )
    multiple = (
        _positive(data["head_dim_multiple"], "head_dim_multiple", at)
        if "head_dim_multiple" in data
        else None
    )
    source = _source(data["source"], at) if "source" in data else None
    _check_axes(at, axes, logical, per_layer)
    layout = CacheLayout(
        name=name,
        shape=shape,
        axes=axes,
        kv_tensors=kv,
        tuple_form=tuple_form,
        record=record,
        logical=logical,
        element=element,
        per_layer=per_layer,
        source=source,
        dtypes=dtypes,
        fixed_head_dim=fixed,
        planes=planes,
        side=side,
        fixed_block_size=fixed_block,
        head_dim_multiple=multiple,
    )
    _check_placement(layout, at)
    _check_record(layout, at)
    _check_scaled(layout, at)
    _check_layers(layout, at, known)
    if name in known and known[name] != layout:
        raise at.error(
            "name",
            f"is {name!r}, the name of a layout kvspec already has, but the file describes "
            "another layout: which one the name means would be ambiguous; give it a name of "
            "its own",
        )
    return layout


def _check_axes(
    at: _Where, axes: tuple[str, ...], logical: tuple[str, ...] | None, per_layer: str | None
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


def _check_placement(layout: CacheLayout, at: _Where) -> None:
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
            f"has a 'kv' axis (K at 0, V at 1) but kv_tensors is {_show(kv)}: a K/V axis holds "
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


def _check_record(layout: CacheLayout, at: _Where) -> None:
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
            + ("" if layout.kv_tensors == 2 else f"; kv_tensors is {_show(layout.kv_tensors)}"),
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


def _check_scaled(layout: CacheLayout, at: _Where) -> None:
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


def _check_layers(layout: CacheLayout, at: _Where, known: Mapping[str, CacheLayout]) -> None:
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
    return _show(value)


def _state_layout(data: dict[str, Any], at: _Where) -> StateCacheLayout:
    """A state layout file's value [SLAYOUT-1]."""
    _fields(data, at, STATE_FIELDS, STATE_REQUIRED, "a state layout")
    name = _name(data["name"], "name", at)
    shape = _text(data["shape"], "shape", at)
    conv = _names(data["conv_axes"], "conv_axes", at, STATE_AXES, "axis names")
    logical = (
        _names(data["logical"], "logical", at, STATE_AXES, "axis names")
        if "logical" in data
        else STATE_AXES
    )
    for field, axes in (("conv_axes", conv), ("logical", logical)):
        if sorted(axes) != sorted(STATE_AXES):
            raise at.error(
                field, f"is [{', '.join(axes)}]; it must order all of {', '.join(STATE_AXES)}"
            )
    if conv[0] != "blocks":
        raise at.error(
            "conv_axes", f"starts with {conv[0]!r}; a state page per block: 'blocks' first"
        )
    return StateCacheLayout(
        name=name, shape=shape, conv_axes=conv, source=_source(data["source"], at), logical=logical
    )


def layout_to_data(layout: CacheLayout | StateCacheLayout) -> dict[str, Any]:
    """``layout`` as a layout file's data: every field that is not its default, in the
    schema's order; :func:`layout_from_data` reads it back equal [LAYOUT-5, SLAYOUT-1]."""
    if isinstance(layout, StateCacheLayout):
        data: dict[str, Any] = {
            "kind": "state",
            "name": layout.name,
            "shape": layout.shape,
            "conv_axes": list(layout.conv_axes),
        }
        if layout.logical != STATE_AXES:
            data["logical"] = list(layout.logical)
        data["source"] = _source_data(layout.source)
        return data
    data = {
        "kind": "cache",
        "name": layout.name,
        "shape": layout.shape,
        "axes": list(layout.axes),
    }
    if layout.logical is not None:
        data["logical"] = list(layout.logical)
    data["kv_tensors"] = layout.kv_tensors
    data["tuple_form"] = layout.tuple_form
    if layout.record:
        data["record"] = [
            {
                "name": f.name,
                **({"dtype": f.dtype} if f.dtype is not None else {}),
                **({"width": f.width} if f.width is not None else {}),
            }
            for f in layout.record
        ]
    for name in ("element", "per_layer"):
        if getattr(layout, name) is not None:
            data[name] = getattr(layout, name)
    if layout.dtypes is not None:
        data["dtypes"] = list(layout.dtypes)
    if layout.fixed_head_dim is not None:
        data["fixed_head_dim"] = layout.fixed_head_dim
    if layout.planes:
        data["planes"] = [_plane_data(p.axes, p.unit, {"field": p.field}) for p in layout.planes]
    if layout.side:
        data["side"] = [
            _plane_data(
                s.plane.axes,
                s.plane.unit,
                {
                    "name": s.field.name,
                    **({"dtype": s.field.dtype} if s.field.dtype is not None else {}),
                    **({"width": s.field.width} if s.field.width is not None else {}),
                    "of": s.of,
                },
            )
            for s in layout.side
        ]
    for name in ("fixed_block_size", "head_dim_multiple"):
        if getattr(layout, name) is not None:
            data[name] = getattr(layout, name)
    if layout.source is not None:
        data["source"] = _source_data(layout.source)
    return data


def _plane_data(axes: tuple[str, ...], unit: int | None, head: dict[str, Any]) -> dict[str, Any]:
    return {**head, "axes": list(axes), **({"unit": unit} if unit is not None else {})}


def _source_data(source: Source) -> dict[str, str]:
    data = source.to_dict()
    if not data["unconfirmed"]:
        del data["unconfirmed"]
    return data


def dumps(layout: CacheLayout | StateCacheLayout) -> str:
    """The text of ``layout``'s layout file: its data indented, arrays of names and each
    record field on one line, ending in a newline."""
    return _format(layout_to_data(layout), "") + "\n"


def _format(value: object, indent: str) -> str:
    inner = indent + "  "
    flat = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, dict) and len(flat) <= 72 and "{" not in flat[1:]:
        return flat  # a record field: one line
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_format(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + _format(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)
