"""Every parser refuses with its documented error, for any JSON value (issue 30).

Each ``from_dict`` of the spec raises :class:`~kvspec.core.errors.FormError` and each message
reader of the sim raises :class:`~sim.net.messages.MessageError` (both
:class:`~kvspec.core.errors.InputError`) on anything it does not accept: never a ``KeyError``,
``TypeError`` or ``AttributeError`` from inside. The values that once escaped are pinned
below; Hypothesis draws the rest from JSON shaped like the forms (their keys, their kinds
of values) so that it gets past the first key check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.core.errors import FormError, InputError
from kvspec.memory.descriptors import RegisteredCache
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import KINDS, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import CACHE_FIELDS, Chunk, Payload
from kvspec.transport.payload.form import _META_KEYS, _META_OPTIONAL, _TOP_KEYS
from kvspec.transport.wire import WireError
from sim.net import messages
from sim.net.messages import MessageError
from sim.paths import pieces
from sim.run.config import SimConfig

FORMS: dict[str, Callable[[Any], object]] = {
    "StageLayout": StageLayout.from_dict,
    "ModelShape": ModelShape.from_dict,
    "TransferCase": TransferCase.from_dict,
    "RegisteredCache": RegisteredCache.from_dict,
    "layer group": group_from_dict,
    "tp_head_slice": HeadSlice.from_dict,
    "metadata.chunk": Chunk.from_dict,
    "payload": Payload.from_dict,
    "SimConfig": SimConfig.from_dict,
}

FORM_CLASSES = (StageLayout, ModelShape, TransferCase, RegisteredCache, HeadSlice, Chunk, SimConfig)
MESSAGE_KEYS = [
    "v",
    "type",
    "src",
    "group",
    "layers",
    "heads",
    "tokens",
    "part",
    "request",
    "hello",
    "nonce",
    "mac",
    "welcome",
    "end",
    "skipped",
    "abort",
    "key",
    "seq",
    "epoch",
    "t",
    "crc",
]
"""The sim's message fields (JSON written by sim.net.messages and sim.paths.pieces)."""
KEYS = sorted(
    {f.name for cls in (*FORM_CLASSES, *KINDS.values()) for f in dataclasses.fields(cls)}
    | _TOP_KEYS
    | _META_KEYS
    | _META_OPTIONAL
    | set(CACHE_FIELDS)
    | {"kind"}
    | set(MESSAGE_KEYS)
)
"""Every field name the forms and messages read, taken from the classes themselves, so
that Hypothesis reaches past each parser's first key check."""
WORDS = ("mha", "mla", "bfloat16", "float32", "contiguous", "zigzag", "lowest", "NHD", "HND")
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-2, 66)
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(WORDS)
)
JSON = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=7)
    ),
    max_leaves=24,
)
"""JSON values, with objects keyed mostly by the forms' own field names."""


def _refuses_only_with(error: type[Exception], call: Callable[[], object]) -> None:
    """Run ``call``; it may return or raise ``error``, and anything else fails the test."""
    with contextlib.suppress(error):
        call()


@pytest.mark.parametrize("name", FORMS)
@settings(max_examples=400, deadline=None)
@given(value=JSON)
def test_every_from_dict_refuses_with_form_error(name: str, value: Any) -> None:
    _refuses_only_with(FormError, lambda: FORMS[name](value))


@pytest.mark.parametrize(
    ("parse", "value", "named"),
    [
        (StageLayout.from_dict, {}, r"StageLayout: missing \['tp'\]"),
        (StageLayout.from_dict, None, "StageLayout must be a JSON object, got None"),
        (StageLayout.from_dict, {"tp": 2, "layer_partition": -1}, "layer_partition must be"),
        (StageLayout.from_dict, {"tp": 2, "layer_partiton": [1]}, "unknown keys"),
        (StageLayout.from_dict, {"tp": 10**5000}, "tp must be <= .* an integer of about"),
        (ModelShape.from_dict, "", "ModelShape must be a JSON object, got ''"),
        (ModelShape.from_dict, {"num_layers": 2}, "missing"),
        (RegisteredCache.from_dict, None, "RegisteredCache must be a JSON object"),
        (group_from_dict, {"kind": {}}, "unknown layer group kind"),
        (TransferCase.from_dict, {"source": [], "target": {}, "model": {}}, "TransferCase.source"),
    ],
)
def test_the_values_that_once_escaped_are_refused_naming_the_form(parse, value, named) -> None:
    with pytest.raises(FormError, match=named):
        parse(value)


def test_a_case_reads_out_of_a_record_that_holds_more() -> None:
    """A golden vector's case sits among its own keys (``id``, ``edges``): those are the
    record's, not misspellings, and the case reads the same."""
    case = TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 4, 8))
    record = {"id": "plan-000", "edges": [], **case.to_dict()}
    assert TransferCase.from_dict(record) == case


def test_the_errors_are_one_family() -> None:
    for error in (FormError, WireError, MessageError):
        assert issubclass(error, InputError) and issubclass(error, ValueError)


def _frames(value: Any) -> list[bytes]:
    text = json.dumps(value)
    return [text.encode(), text.encode()[: len(text) // 2], b"\xff" + text.encode()]


READERS: dict[str, Callable[[bytes], object]] = {
    "load": messages.load,
    "read_envelope": messages.read_envelope,
    "read_handshake": messages.read_handshake,
    "read_abort": messages.read_abort,
    "read_single": lambda frame: messages.read_single(frame, limit=messages.MAX_CONTROL),
    "read_pieces": lambda frame: pieces.read_pieces(
        [frame], model=ModelShape(2, 2, 4), src=0, dst=0
    ),
}


@pytest.mark.parametrize("name", READERS)
@settings(max_examples=300, deadline=None)
@given(value=JSON)
def test_every_message_reader_refuses_with_message_error(name: str, value: Any) -> None:
    for frame in _frames(value):
        _refuses_only_with(MessageError, lambda frame=frame: READERS[name](frame))


@settings(max_examples=300, deadline=None)
@given(header=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8), data=st.binary(max_size=64))
def test_a_hybrid_piece_header_refuses_with_message_error(header: dict, data: bytes) -> None:
    model = ModelShape(2, 2, 4)
    _refuses_only_with(
        MessageError,
        lambda: pieces.read_piece(header, data, model=model, src=0, dst=0),
    )


def test_an_integer_of_five_thousand_digits_is_a_message_error() -> None:
    """json.loads refuses an integer over 4,300 digits with a plain ValueError (Python's
    int-from-string limit); 11 of 4,010 fuzzed frames once escaped every caller this way."""
    frame = b'{"type": "progress", "rank": ' + b"9" * 5000 + b"}"
    with pytest.raises(MessageError, match="not a JSON message"):
        messages.load(frame)  # a control event's limit is 8 MiB
