"""The layout file format: its fields and limits, its schema, its refusal [LAYOUT-5, SLAYOUT-1].

Which fields a cache layout file and a state layout file have, in the order they are
written, and which of them a file must give; the size past which a file is refused
unread; the published JSON Schema (package data, ``kvspec/memory/layouts/schema.json``);
and :class:`LayoutFileError`, whose every refusal names the file, the field and why
(:class:`Where` builds it).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

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

MAX_DEPTH = 8
"""How deep a layout file's arrays and objects may nest: the format's deepest value (a
plane's or side field's ``axes``) is 4 deep; past 8 the text is refused before it is
parsed, so no nesting can exhaust the parser's stack."""

MAX_NUMBER = 1 << 16
"""The largest whole number a layout file may give (a fixed head_dim or block size, a
field width, a split slot axis's unit, the N of ``head_dim/N``): every field's engines
use numbers in the hundreds, and a bound keeps what a file implies (the cache a
conversion allocates) bounded too."""


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


class Where:
    """Builds the refusal for one file: ``layout file F: field 'X' <why>``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, field: str | None, why: str) -> LayoutFileError:
        at = f"field '{field}' " if field else ""
        return LayoutFileError(f"layout file {self.where}: {at}{why}")


def kind_of(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def written(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)
