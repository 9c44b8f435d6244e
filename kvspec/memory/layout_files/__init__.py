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

The package's modules, one concern each:

- :mod:`~kvspec.memory.layout_files.format`: the format's fields and limits (``CACHE_FIELDS``,
  ``MAX_FILE_BYTES``, ...), its schema and its refusal (:class:`LayoutFileError`);
- :mod:`~kvspec.memory.layout_files.reading`: a file, its text or its parsed data read
  into a layout, field by field as the schema says (:func:`read_layout_file`,
  :func:`layout_from_json`, :func:`layout_from_data`);
- :mod:`~kvspec.memory.layout_files.rules`: the rules between a cache layout's fields
  that a schema cannot state;
- :mod:`~kvspec.memory.layout_files.writing`: a layout written as a file
  (:func:`layout_to_data`, :func:`dumps`).
"""

from __future__ import annotations

from kvspec.memory.layout_files.format import LayoutFileError, is_layout_file, schema
from kvspec.memory.layout_files.reading import layout_from_data, layout_from_json, read_layout_file
from kvspec.memory.layout_files.writing import dumps, layout_to_data

__all__ = [
    "LayoutFileError",
    "dumps",
    "is_layout_file",
    "layout_from_data",
    "layout_from_json",
    "layout_to_data",
    "read_layout_file",
    "schema",
]
