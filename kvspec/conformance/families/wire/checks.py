"""Checks of the wire format: interoperation, refusals, zero copy and checksums [WIRE-1..7].

Interoperation: what the implementation encodes, the spec decodes to the same payload,
and the other way round. Refusals: a valid message of the spec with one thing changed —
another format or version, a missing or unknown key, a header over the limits, a frame
a byte short, a dtype alias, an entry twice, a frame too many, a pickle-like header, a
repeated JSON key, a float, a flipped bit under a CRC, a payload field out of range —
must be refused, and a fuzzed message never with anything but a ``ValueError``.
"""

from __future__ import annotations

import copy
import ctypes
import json
import random
from dataclasses import replace
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from kvspec.conformance.adapter import REFUSAL_TYPES, Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import crash_report, expect, expect_refused, fail
from kvspec.conformance.draws import TENSOR_PINS, Setup, tensor_examples
from kvspec.conformance.draws.messages import (
    edge_payloads,
    header_of,
    one_payload,
    wire_frames,
    with_header,
)
from kvspec.conformance.refusals import Probe, refuse_all
from kvspec.conformance.tiers import BREAKS
from kvspec.transport.payload import Payload, payload_equal
from kvspec.transport.wire import DEFAULT_LIMITS, WireError, decode

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

WEIGHT = 0.5


def _decoded(ctx: Context, frames: list[bytes], what: str, obligation: str) -> Payload:
    try:
        return ctx.adapter.decode(frames)
    except Exception as error:
        fail(
            f"{what}: the implementation refused a valid message: {error!r} [{obligation}]",
            tier=BREAKS,
        )


@check(
    "WIRE-1",
    "interoperate",
    "the implementation's frames decode as the spec's and the other way round",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=WEIGHT,
    covers=("WIRE-1.1",),
)
def interoperate(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    for src, dst, payload in edge_payloads(setup):
        where = f"{setup.case.describe()}: edge {src}->{dst}"
        try:
            ours = decode([bytes(f) for f in ctx.adapter.encode(payload)])
        except WireError as error:
            fail(f"{where}: the spec refuses the implementation's frames: {error} [WIRE-1.1]")
        expect(
            payload_equal(ours, payload),
            f"{where}: the implementation's frames decode to another payload [WIRE-1.1]",
        )
        theirs = _decoded(ctx, wire_frames(payload), where, "WIRE-1.1")
        expect(
            isinstance(theirs, Payload) and payload_equal(theirs, payload),
            f"{where}: the spec's frames decode to another payload in the implementation "
            "[WIRE-1.1]",
        )


# -- one change to a valid message -----------------------------------------------------


def _other_headers(frames: list[bytes]) -> list[Probe]:
    """The message with another format, another version, a key missing or an unknown key,
    each alone [WIRE-1]."""
    header = header_of(frames)
    found: list[Probe] = []
    for value in ("kvspec.transport.payload.v2", "kvspec", "", None):
        found.append(
            (
                "WIRE-1.2",
                f"format {value!r}",
                with_header(frames, {**header, "format": value}),
                (value,),
            )
        )
    for version in (2, 0, 1.0, "1", True, -1):
        found.append(
            (
                "WIRE-1.2",
                f"version {version!r}",
                with_header(frames, {**header, "version": version}),
                (version,),
            )
        )
    for key in sorted(header):
        missing = {k: v for k, v in header.items() if k != key}
        found.append(("WIRE-1.3", f"no {key!r} key", with_header(frames, missing), (key,)))
    for key in ("compression", "Format", "crc", "extra"):
        found.append(
            ("WIRE-1.3", f"an unknown key {key!r}", with_header(frames, {**header, key: 0}), (key,))
        )
    return found


@check(
    "WIRE-1",
    "refuses-other-header",
    "another format or version, a missing or an unknown header key is refused",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:2],
    weight=WEIGHT,
    covers=("WIRE-1.2", "WIRE-1.3"),
)
def refuses_other_header(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    refuse_all(ctx, setup, _other_headers(wire_frames(one_payload(setup))))


@check(
    "WIRE-2",
    "refuses-over-limits",
    "a header declaring more layers than max_layers, or longer than max_header_bytes, is refused",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:1],
    weight=0.25,
    covers=("WIRE-2.1", "WIRE-2.2"),
)
def refuses_over_limits(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    frames = wire_frames(one_payload(setup))
    header = header_of(frames)
    layers = DEFAULT_LIMITS.max_layers + 1 + setup.seed % 64
    many = copy.deepcopy(header)
    many["metadata"]["num_layers"] = layers
    long = {**header, "request_id": "r" * (DEFAULT_LIMITS.max_header_bytes + 1)}
    refuse_all(
        ctx,
        setup,
        [
            (
                "WIRE-2.1",
                f"num_layers {layers} (max_layers {DEFAULT_LIMITS.max_layers})",
                with_header(frames, many),
                (layers,),
            ),
            (
                "WIRE-2.2",
                f"a header of more than max_header_bytes {DEFAULT_LIMITS.max_header_bytes}",
                with_header(frames, long),
                (DEFAULT_LIMITS.max_header_bytes, len(with_header(frames, long)[0])),
            ),
        ],
    )


_DTYPE_ALIASES = ("bf16", "fp16", "half", "float", "torch.bfloat16", "float64", "object", "fp8")


def _mismatched_frames(frames: list[bytes], rng: random.Random) -> list[Probe]:
    """The message with one tensor entry or frame at odds with the other: a byte short or
    long, a dtype alias, a layer past num_layers, an entry twice, a frame missing or extra
    [WIRE-3]."""
    header = header_of(frames)
    i = rng.randrange(len(header["tensors"]))
    entry = header["tensors"][i]
    size = len(frames[i + 1])  # what the entry's shape and dtype need
    found: list[Probe] = [
        (
            "WIRE-3.1",
            f"frame {i + 1} one byte short",
            [*frames[: i + 1], frames[i + 1][:-1], *frames[i + 2 :]],
            (size - 1, size),
        ),
        (
            "WIRE-3.1",
            f"frame {i + 1} one byte long",
            [*frames[: i + 1], frames[i + 1] + b"\0", *frames[i + 2 :]],
            (size + 1, size),
        ),
    ]
    for name in _DTYPE_ALIASES:
        aliased = copy.deepcopy(header)
        aliased["tensors"][i]["dtype"] = name
        found.append(
            ("WIRE-3.2", f"tensors[{i}].dtype {name!r}", with_header(frames, aliased), (name,))
        )
    layers = header["metadata"]["num_layers"]
    for layer in (layers, layers + 1):
        past = copy.deepcopy(header)
        past["tensors"][i]["layer"] = layer
        found.append(
            (
                "WIRE-3.3",
                f"tensors[{i}].layer {layer} of {layers}",
                with_header(frames, past),
                (layer,),
            )
        )
    twice = copy.deepcopy(header)
    twice["tensors"].append(dict(entry))
    found.append(
        (
            "WIRE-3.3",
            f"tensors[{i}] listed twice (with its frame)",
            [*with_header(frames, twice), frames[i + 1]],
            (entry["field"],),
        )
    )
    entries = len(header["tensors"])  # a message has one frame per entry after the header
    found.append(("WIRE-3.4", "the last frame missing", frames[:-1], (entries - 1, entries)))
    found.append(
        (
            "WIRE-3.4",
            "one frame more than tensor entries",
            [*frames, frames[-1]],
            (entries + 1, entries),
        )
    )
    return found


@check(
    "WIRE-3",
    "refuses-mismatched-frames",
    "frames whose length, dtype, layer or count disagree with the header are refused",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:2],
    weight=WEIGHT,
    covers=("WIRE-3.1", "WIRE-3.2", "WIRE-3.3", "WIRE-3.4"),
)
def refuses_mismatched_frames(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    frames = wire_frames(one_payload(setup))
    refuse_all(ctx, setup, _mismatched_frames(frames, random.Random(setup.seed)))


@st.composite
def _fuzzed(draw: st.DrawFn, adapter: Adapter) -> Example:
    return {"base": draw(tensor_examples(adapter)), "fuzz": draw(st.integers(0, 2**32))}


@check(
    "WIRE-4",
    "refuses-malformed",
    "a damaged message is decoded as the spec decodes it or refused with a ValueError",
    needs=("wire",),
    strategy=_fuzzed,
    examples=({"base": TENSOR_PINS[0], "fuzz": 1}, {"base": TENSOR_PINS[5], "fuzz": 7}),
    weight=WEIGHT,
    covers=("WIRE-4.1",),
)
def refuses_malformed(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example["base"])
    messages = [wire_frames(p) for _, _, p in edge_payloads(setup)[:2]]
    rng = random.Random(example["fuzz"])
    for _ in range(4):
        frames = _mutate(messages, rng)
        try:
            want: Payload | None = decode(frames)
        except WireError:
            want = None
        try:
            got = ctx.adapter.decode(frames)
        except REFUSAL_TYPES["WIRE-4.1"]:
            continue
        except Exception as error:
            fail(
                f"{setup.case.describe()}: a damaged message ({len(frames)} frames, header "
                f"{frames[0][:80]!r}...) crashed instead of refusing: it raised "
                f"{crash_report(error)}; a decoder refuses with a ValueError (WireError), "
                "never another exception [WIRE-4.1]",
                tier=BREAKS,
            )
        expect(
            want is not None,
            f"{setup.case.describe()}: a damaged message the spec refuses ({len(frames)} "
            f"frames, header {frames[0][:80]!r}...) was decoded into "
            f"{type(got).__name__}; every malformed message is refused [WIRE-4.1]",
        )


def _mutate(messages: list[list[bytes]], rng: random.Random) -> list[bytes]:
    """A valid message with one or two random damages: a header value replaced or removed,
    a byte flipped, a frame cut, grown, dropped, repeated or swapped."""
    frames = list(rng.choice(messages))
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["header", "header", "flip", "truncate", "extend", "drop", "swap"])
        i = rng.randrange(len(frames))
        if kind == "header":
            try:
                header = json.loads(frames[0])
            except ValueError:
                continue
            _damage(header, rng)
            frames[0] = json.dumps(header).encode()
        elif kind == "flip" and frames[i]:
            frame = bytearray(frames[i])
            frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
            frames[i] = bytes(frame)
        elif kind == "truncate":
            frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
        elif kind == "extend":
            frames[i] += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == "drop" and len(frames) > 1:
            del frames[i]
        elif kind == "swap" and len(frames) > 1:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
    return frames


_VALUES: tuple[object, ...] = (None, -1, 0, 2**64, "x", [], {}, [1, 2], True, "float64", 1.5)


def _damage(node: object, rng: random.Random) -> None:
    """Replace or delete one value somewhere in a JSON object, in place."""
    while True:
        if isinstance(node, dict) and node:
            key = rng.choice(sorted(node))
            child = node[key]
            if isinstance(child, dict | list) and child and rng.random() < 0.6:
                node = child
                continue
            if rng.random() < 0.3:
                del node[key]
            else:
                node[key] = rng.choice(_VALUES)
            return
        if isinstance(node, list) and node:
            index = rng.randrange(len(node))
            child = node[index]
            if isinstance(child, dict | list) and child and rng.random() < 0.6:
                node = child
                continue
            node[index] = rng.choice(_VALUES)
            return
        return


def _not_strict_json(frames: list[bytes]) -> list[Probe]:
    """The message with a header that is no JSON (pickle's opening bytes, a Python literal)
    or not strict JSON (a repeated key, NaN, Infinity, a float) [WIRE-4]."""
    header = header_of(frames)
    text = frames[0].decode()
    rest = frames[1:]
    found: list[Probe] = [
        # pickle's opening bytes, as connectors that unpickle headers receive them
        ("WIRE-4.2", "a header opening like a pickle", [b"\x80\x04\x95" + frames[0][3:], *rest]),
        # the header as a Python literal (single quotes, True, None): no JSON either
        ("WIRE-4.2", "a header written as a Python literal", [repr(header).encode(), *rest]),
    ]
    for key in ("request_id", "format", "metadata"):
        decoy = json.dumps({key: header[key] if key != "request_id" else "other-request"})[1:-1]
        found.append(
            (
                "WIRE-4.3",
                f"the key {key!r} twice",
                [("{" + decoy + "," + text[1:]).encode(), *rest],
                (key,),
            )
        )
    for field in ("block_size", "seq_len"):
        for constant in ("NaN", "Infinity"):
            bad = text.replace(f'"{field}":{header["metadata"][field]}', f'"{field}":{constant}', 1)
            found.append(("WIRE-4.3", f"{field} {constant}", [bad.encode(), *rest], (constant,)))
    found.append(
        (
            "WIRE-4.3",
            "version 1.0",
            [text.replace('"version":1', '"version":1.0', 1).encode(), *rest],
            ("1.0",),
        )
    )
    layer = header["tensors"][0]["layer"]
    floated = text.replace(f'"layer":{layer}', f'"layer":{layer}.0', 1)
    found.append(
        (
            "WIRE-4.3",
            f"a tensor layer written {layer}.0",
            [floated.encode(), *rest],
            (f"{layer}.0",),
        )
    )
    return found


@check(
    "WIRE-4",
    "refuses-non-json",
    "a header that is not strict JSON (pickle bytes, a literal, a repeated key, NaN, a float)",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:2],
    weight=WEIGHT,
    covers=("WIRE-4.2", "WIRE-4.3"),
)
def refuses_non_json(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    payload = replace(one_payload(setup), request_id="req-1")
    refuse_all(ctx, setup, _not_strict_json(wire_frames(payload)))


def _address(buffer: Buffer) -> tuple[int, int]:
    """(first address, length) of a bytes-like object's memory; -1 for read-only memory
    (``bytes``), which is never a tensor's own."""
    view = memoryview(buffer).cast("B")
    if not view.nbytes:
        return 0, 0
    if view.readonly:
        return -1, view.nbytes
    return ctypes.addressof(ctypes.c_ubyte.from_buffer(view)), view.nbytes


def _contiguous(payload: Payload) -> Payload:
    return payload.with_layers(
        lambda values: tuple(None if t is None else t.contiguous().clone() for t in values)
    )


def _inside(address: int, length: int, regions: list[tuple[int, int]]) -> bool:
    return any(start <= address and address + length <= start + size for start, size in regions)


@check(
    "WIRE-5",
    "zero-copy",
    "encoding frames contiguous CPU tensors without a copy; decoding returns views of frames",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:3],
    weight=WEIGHT,
    covers=("WIRE-5.1", "WIRE-5.2"),
)
def zero_copy(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    payload = _contiguous(one_payload(setup)).to("cpu")
    tensors = [(t.data_ptr(), t.nbytes) for _, _, t in payload.tensors() if t.nbytes]
    frames = ctx.adapter.encode(payload)
    for i, frame in enumerate(list(frames)[1:], 1):
        address, length = _address(frame)
        if not length:
            continue
        expect(
            _inside(address, length, tensors),
            f"{setup.case.describe()}: frame {i} of a payload of contiguous CPU tensors is a "
            "copy, not a view of the tensor's memory [WIRE-5.1]",
        )
    received = [bytearray(f) for f in wire_frames(payload)]
    regions = [_address(f) for f in received[1:]]
    decoded = _decoded(ctx, list(received), setup.case.describe(), "WIRE-5.2")  # type: ignore[arg-type]  # bytearrays on purpose: the frames a view must point into
    for name, layer, tensor in decoded.tensors():
        if not tensor.nbytes:
            continue
        expect(
            _inside(tensor.data_ptr(), tensor.nbytes, regions),
            f"{setup.case.describe()}: the decoded {name}[{layer}] is a copy, not a view of its "
            "received frame [WIRE-5.2]",
        )


@check(
    "WIRE-6",
    "checksums",
    "a message with correct CRC-32s decodes; one flipped bit under a CRC is refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(tensor_examples(adapter), st.integers(0, 2**32)),
    examples=((TENSOR_PINS[0], 0), (TENSOR_PINS[3], 5)),
    weight=WEIGHT,
    covers=("WIRE-6.1", "WIRE-6.2"),
)
def checksums(ctx: Context, example: tuple[Example, int]) -> None:
    base, where = example
    setup = Setup(ctx, base)
    payload = one_payload(setup)
    frames = wire_frames(payload, checksum=True)
    got = _decoded(ctx, frames, f"{setup.case.describe()}: a message with CRC-32s", "WIRE-6.1")
    expect(
        isinstance(got, Payload) and payload_equal(got, payload),
        f"{setup.case.describe()}: a message with CRC-32s decodes to another payload [WIRE-6.1]",
    )
    damage = _damaged(frames, random.Random(where))
    if damage is None:
        return
    damaged, what = damage
    expect_refused(
        "WIRE-6.2",
        f"{setup.case.describe()}: a message with crc32 and {what}",
        lambda: ctx.adapter.decode(damaged),
    )


def _damaged(frames: list[bytes], rng: random.Random) -> tuple[list[bytes], str] | None:
    """``frames`` with one thing a checksum covers changed — a block id added to the header
    (valid JSON still) or one bit flipped in a tensor frame — and what; None when the
    frame drawn is empty."""
    damaged = list(frames)
    if rng.random() < 0.3 or len(frames) == 1:  # the header: an edit that stays valid JSON
        header = header_of(frames)
        header["block_ids"] = [*header["block_ids"], 7]
        damaged[0] = json.dumps(header).encode()
        return damaged, "a block id added to the header"
    i = rng.randrange(1, len(frames))
    if not frames[i]:
        return None
    frame = bytearray(frames[i])
    byte = rng.randrange(len(frame))
    frame[byte] ^= 1 << rng.randrange(8)
    damaged[i] = bytes(frame)
    return damaged, f"one bit flipped in byte {byte} of frame {i}"


@check(
    "WIRE-7",
    "crc32c-checksums",
    "a message with correct CRC-32Cs decodes; one flipped bit under one is refused; so is a "
    "header with both crc32 and crc32c",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(tensor_examples(adapter), st.integers(0, 2**32)),
    examples=((TENSOR_PINS[0], 0), (TENSOR_PINS[3], 5)),
    weight=WEIGHT,
    covers=("WIRE-7.1", "WIRE-7.2", "WIRE-7.3"),
)
def crc32c_checksums(ctx: Context, example: tuple[Example, int]) -> None:
    base, where = example
    setup = Setup(ctx, base)
    payload = one_payload(setup)
    frames = wire_frames(payload, checksum="crc32c")
    what = f"{setup.case.describe()}: a message with CRC-32Cs"
    got = _decoded(ctx, frames, what, "WIRE-7.1")
    expect(
        isinstance(got, Payload) and payload_equal(got, payload),
        f"{what} decodes to another payload [WIRE-7.1]",
    )
    both = header_of(frames)
    both["crc32"] = header_of(wire_frames(payload, checksum="crc32"))["crc32"]  # right values too
    expect_refused(
        "WIRE-7.3",
        f"{setup.case.describe()}: a header with both crc32 and crc32c, each right",
        lambda: ctx.adapter.decode(with_header(frames, both)),
        naming=("crc32", "crc32c"),
    )
    damage = _damaged(frames, random.Random(where))
    if damage is None:
        return
    damaged, change = damage
    expect_refused(
        "WIRE-7.2",
        f"{setup.case.describe()}: a message with crc32c and {change}",
        lambda: ctx.adapter.decode(damaged),
    )
