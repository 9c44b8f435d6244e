"""LAYOUT-5 / SLAYOUT-1 by fuzzing: for any bytes, reading a layout file returns a layout or
raises :class:`LayoutFileError` naming the file — never another exception (a
``RecursionError`` from deep nesting, a ``ValueError`` from a huge integer, a
``TypeError`` from a field of the wrong kind), and never changes what kvspec knows.

The inputs are the shipped presets' own files, mutated: bytes flipped, cut, repeated or
spliced from another preset, opened by thousands of brackets, and JSON values swapped in
at every field (deep nesting, huge and Unicode numbers, wrong kinds).
``KVSPEC_FUZZ_EXAMPLES`` raises the count (``make fuzz`` runs ``10**5``);
``make test`` runs the profile's sample.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS
from kvspec.memory.layout_files import LayoutFileError, layout_from_json
from kvspec.memory.layout_model import CacheLayout, StateCacheLayout

_FOLDER = resources.files("kvspec.memory").joinpath("layouts", "presets")
FILES: list[bytes] = sorted(
    entry.read_bytes() for entry in _FOLDER.iterdir() if entry.name.endswith(".json")
)

EXAMPLES = int(os.environ.get("KVSPEC_FUZZ_EXAMPLES", 0)) or 4 * settings.default.max_examples
FUZZ = settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_HOSTILE_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, 10**40, 1.5, True, None, "", "head_dim/\u0663", "head_dim/0"]),
    st.text(max_size=20),
    st.integers(min_value=1, max_value=40).map(lambda d: json.loads("[" * d + "]" * d)),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=8,
    ),
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a parsed file a value can be swapped in."""
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*prefix, index))
    return found


def _swapped(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        return {**data, head: _swapped(data[head], rest, value)}
    copy = list(data)
    copy[head] = _swapped(copy[head], rest, value)
    return copy


@st.composite
def hostile_files(draw: st.DrawFn) -> bytes:
    """A preset's file with one value swapped for a hostile one, or its bytes damaged."""
    raw = draw(st.sampled_from(FILES))
    how = draw(st.sampled_from(["swap", "flip", "cut", "splice", "repeat", "nest"]))
    if how == "swap":
        data = json.loads(raw)
        path = draw(st.sampled_from(_paths(data)))
        text = json.dumps(_swapped(data, path, draw(_HOSTILE_VALUES)))
        return text.encode()
    at = draw(st.integers(min_value=0, max_value=len(raw)))
    if how == "flip":
        byte = draw(st.integers(min_value=0, max_value=255))
        return raw[:at] + bytes([byte]) + raw[at + 1 :]
    if how == "cut":
        return raw[:at]
    if how == "splice":
        other = draw(st.sampled_from(FILES))
        return raw[:at] + other[draw(st.integers(min_value=0, max_value=len(other))) :]
    if how == "nest":  # open brackets, closed or not: the parser must not recurse on them
        opener = draw(st.sampled_from([b"[", b'{"a":', b'[{"b":']))
        depth = draw(st.integers(min_value=1, max_value=20_000))
        closer = {b"[": b"]", b'{"a":': b"}", b'[{"b":': b"}]"}[opener] * draw(
            st.sampled_from([0, depth])
        )
        return raw[:at] + opener * depth + closer + raw[at:]
    piece = raw[at : at + draw(st.integers(min_value=1, max_value=16))]
    return raw[:at] + piece * draw(st.integers(min_value=2, max_value=5000)) + raw[at:]


@FUZZ
@given(hostile_files())
def test_any_bytes_read_as_a_layout_or_are_refused_naming_the_file(raw: bytes) -> None:
    known = dict(PRESETS)
    try:
        layout = layout_from_json(raw, "fuzzed.json", known=PRESETS)
    except LayoutFileError as error:
        message = str(error)
        assert message.startswith("layout file fuzzed.json: "), message
        assert "\n" not in message
    else:
        assert isinstance(layout, (CacheLayout, StateCacheLayout))
    assert dict(PRESETS) == known  # reading a file changes nothing kvspec knows
