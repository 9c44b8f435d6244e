"""Writing a layout as a layout file: every field not at its default, in the schema's order
[LAYOUT-5, SLAYOUT-1].

:func:`layout_to_data` gives a layout's data, which
:func:`~kvspec.memory.layout_files.reading.layout_from_data` reads back equal;
:func:`dumps` the text of its file, in the form every preset file is in (arrays of names
and each record field on one line).
"""

from __future__ import annotations

import json
from typing import Any

from kvspec.memory.layout_model import STATE_AXES, CacheLayout, Source, StateCacheLayout


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
