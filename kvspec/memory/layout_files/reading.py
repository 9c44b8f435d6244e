"""Reading a layout file: bytes, JSON, then every field as the schema says [LAYOUT-5, SLAYOUT-1].

:func:`read_layout_file` reads at most :data:`~kvspec.memory.layout_files.format.
MAX_FILE_BYTES` of a file; :func:`layout_from_json` parses its text, refusing a key given
twice and a number JSON has no word for; :func:`layout_from_data` checks each field's
type, names, enums, required and unknown keys — the schema, enforced without jsonschema —
builds the :class:`~kvspec.memory.layout_model.CacheLayout` or
:class:`~kvspec.memory.layout_model.StateCacheLayout` value, and holds a cache layout to
the rules between its fields (:mod:`~kvspec.memory.layout_files.rules`). Every refusal
names the file, the field and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvspec.core.dtype_names import DTYPE_NAMES
from kvspec.core.untrusted_input import InputRefused, loads, read_regular_file
from kvspec.memory.layout_files import rules
from kvspec.memory.layout_files.format import (
    CACHE_FIELDS,
    CACHE_REQUIRED,
    KINDS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NUMBER,
    PLANE_FIELDS,
    RECORD_FIELDS,
    SIDE_FIELDS,
    SOURCE_FIELDS,
    SOURCE_REQUIRED,
    STATE_FIELDS,
    STATE_REQUIRED,
    Where,
    kind_of,
    written,
)
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

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_NAME_MAX = 64


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


def read_layout_file(
    path: str | Path, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout the file at ``path`` holds, or a :class:`LayoutFileError` naming the
    file, the field and why [LAYOUT-5, SLAYOUT-1]. ``known``: the layouts a ``per_layer``
    may name, and whose names a file may not reuse for another layout."""
    where = Where(str(path))
    try:
        raw = read_regular_file(path, MAX_FILE_BYTES)
    except InputRefused as refusal:
        raise where.error(None, str(refusal)) from None
    return layout_from_json(raw, str(path), known=known)


def layout_from_json(
    raw: bytes | str, where: str, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout a layout file's text holds (``where`` names it in refusals)."""
    at = Where(where)
    try:
        data = loads(raw, max_depth=MAX_DEPTH, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise at.error(dup.key, "is given twice: which one is meant is ambiguous") from None
    except InputRefused as refusal:
        raise at.error(None, str(refusal)) from None
    return layout_from_data(data, where, known=known)


def layout_from_data(
    data: object, where: str, *, known: Mapping[str, CacheLayout] | None = None
) -> CacheLayout | StateCacheLayout:
    """The layout ``data`` (a parsed layout file) describes; refuses what the schema or
    the rules between fields refuse, naming the field and why [LAYOUT-5, SLAYOUT-1]."""
    at = Where(where)
    if not isinstance(data, dict):
        raise at.error(None, f"holds a JSON {kind_of(data)}; a layout file holds one object")
    kind = data.get("kind")
    if "kind" not in data:
        raise at.error("kind", f"is missing: say what the file holds, one of {list(KINDS)}")
    if kind not in KINDS:
        raise at.error("kind", f"is {written(kind)}; it must be one of {list(KINDS)}")
    known = known or {}
    if kind == "state":
        return _state_layout(data, at)
    return _cache_layout(data, at, known)


def _fields(
    data: dict[str, Any],
    at: Where,
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


def _text(value: object, field: str, at: Where, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise at.error(field, f"is a {kind_of(value)}; it must be a string")
    if not value and not empty:
        raise at.error(field, "is empty")
    return value


def _name(value: object, field: str, at: Where) -> str:
    name = _text(value, field, at)
    if len(name) > _NAME_MAX or not set(name) <= _NAME_CHARS or name[0] in "_-":
        raise at.error(
            field,
            f"is {name!r}: a name is up to {_NAME_MAX} letters, digits, '_' and '-', starting "
            "with a letter or digit (no dots, so it never reads as a file)",
        )
    return name


def _choice(value: object, field: str, at: Where, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise at.error(field, f"is {written(value)}; it must be one of {', '.join(choices)}")
    return value


def _positive(value: object, field: str, at: Where) -> int:
    if type(value) is not int or not 1 <= value <= MAX_NUMBER:
        raise at.error(
            field, f"is {written(value)}; it must be a whole number from 1 to {MAX_NUMBER}"
        )
    return value


def _names(
    value: object, field: str, at: Where, choices: tuple[str, ...], what: str = "names"
) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise at.error(field, f"is {written(value)}; it must be a non-empty array of {what}")
    seen: set[str] = set()
    for i, item in enumerate(value):
        _choice(item, f"{field}[{i}]", at, choices)
        if item in seen:
            raise at.error(field, f"names {item!r} twice")
        seen.add(item)
    return tuple(value)


def _source(value: object, at: Where) -> Source:
    if not isinstance(value, dict):
        raise at.error(
            "source",
            f"is a {kind_of(value)}; it must be an object with fields {', '.join(SOURCE_FIELDS)}",
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


def _record(value: object, at: Where) -> tuple[Field, ...]:
    if not isinstance(value, list) or not value:
        raise at.error(
            "record", f"is {written(value)}; it must be a non-empty array of fields (or left out)"
        )
    fields: list[Field] = []
    for i, item in enumerate(value):
        here = f"record[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {kind_of(item)}; a field is an object")
        extra = [k for k in item if k not in RECORD_FIELDS]
        if extra:
            raise at.error(
                f"{here}.{extra[0]}",
                f"is not a field of a record field; its fields are {', '.join(RECORD_FIELDS)}",
            )
        if "name" not in item:
            raise at.error(f"{here}.name", "is missing")
        field = _field(item, here, at)
        if any(f.name == field.name for f in fields):
            raise at.error("record", f"names the field {field.name!r} twice")
        fields.append(field)
    return tuple(fields)


def _field(item: dict[str, object], here: str, at: Where) -> Field:
    """A field's name, and its dtype and width where given [LAYOUT-8]."""
    name = _name(item["name"], f"{here}.name", at)
    dtype = (
        _choice(item["dtype"], f"{here}.dtype", at, tuple(FIELD_DTYPES))
        if "dtype" in item
        else None
    )
    width = _width(item["width"], f"{here}.width", at) if "width" in item else None
    return Field(name, dtype, width)


def _width(value: object, field: str, at: Where) -> int | str:
    """A field width: a whole number of elements, or ``head_dim/N`` [LAYOUT-8]."""
    if isinstance(value, str):
        n = value.removeprefix(WIDTH_PREFIX)
        # ASCII digits only: str.isdigit() takes Unicode digits ('٣') the schema refuses
        ascii_digits = n.isascii() and n.isdigit()
        whole = ascii_digits and not n.startswith("0") and len(n) <= len(str(MAX_NUMBER))
        if value.startswith(WIDTH_PREFIX) and whole and int(n) <= MAX_NUMBER:
            return value
        raise at.error(
            field,
            f"is {value!r}; a width is a whole number from 1 to {MAX_NUMBER} or 'head_dim/N' "
            f"for a whole N from 1 to {MAX_NUMBER}",
        )
    return _positive(value, field, at)


def _plane(value: object, field: str, at: Where, axes: tuple[str, ...]) -> Plane:
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


def _planes(value: object, at: Where) -> tuple[Plane, ...]:
    if not isinstance(value, list) or not value:
        raise at.error("planes", f"is {written(value)}; it must be a non-empty array of planes")
    out = []
    for i, item in enumerate(value):
        here = f"planes[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {kind_of(item)}; a plane is an object")
        _fields(item, at, PLANE_FIELDS, ("field", "axes"), "a plane", prefix=here)
        name = _name(item["field"], f"{here}.field", at)
        plane = _plane(item["axes"], here, at, PLANE_AXES)
        out.append(Plane(name, plane.axes, _unit(item, here, at, plane.axes)))
    return tuple(out)


def _unit(item: dict[str, Any], here: str, at: Where, axes: tuple[str, ...]) -> int | None:
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


def _side(value: object, at: Where) -> tuple[SideField, ...]:
    if not isinstance(value, list) or not value:
        raise at.error("side", f"is {written(value)}; it must be a non-empty array of fields")
    out: list[SideField] = []
    for i, item in enumerate(value):
        here = f"side[{i}]"
        if not isinstance(item, dict):
            raise at.error(here, f"is a {kind_of(item)}; a side field is an object")
        _fields(item, at, SIDE_FIELDS, ("name", "of", "axes"), "a side field", prefix=here)
        field = _field(item, here, at)
        name = field.name
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
                field,
                of,
                Plane(name, plane.axes, _unit(item, here, at, plane.axes)),
            )
        )
    return tuple(out)


def _cache_layout(data: dict[str, Any], at: Where, known: Mapping[str, CacheLayout]) -> CacheLayout:
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
            "kv_tensors", f"is {written(kv)}; it must be 2 (K and V), 1 (a latent) or null"
        )
    tuple_form = data["tuple_form"]
    if type(tuple_form) is not bool:
        raise at.error("tuple_form", f"is {written(tuple_form)}; it must be true or false")
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
    rules.check_axes(at, axes, logical, per_layer)
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
    rules.check_placement(layout, at)
    rules.check_record(layout, at)
    rules.check_scaled(layout, at)
    rules.check_layers(layout, at, known)
    if per_layer is not None:  # the value each layer reads as, held, not looked up later
        layout = replace(layout, layer_form=known[per_layer])
    if name in known and known[name] != layout:
        raise at.error(
            "name",
            f"is {name!r}, the name of a layout kvspec already has, but the file describes "
            "another layout: which one the name means would be ambiguous; give it a name of "
            "its own",
        )
    return layout


def _state_layout(data: dict[str, Any], at: Where) -> StateCacheLayout:
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
