"""Checks of the wire format: interoperation, refusals, zero copy and checksums [WIRE-1..6,
PAYLOAD-1].

Interoperation: what the implementation encodes, the spec decodes to the same payload,
and the other way round. Refusals: a valid message of the spec with one thing changed —
another format or version, a missing or unknown key, a header over the limits, a frame
a byte short, a dtype alias, an entry twice, a frame too many, a pickled header, a
repeated JSON key, a float, a flipped bit under a CRC, a payload field out of range —
must be refused, and a fuzzed message never with anything but a ``ValueError``.
"""

from __future__ import annotations

import ctypes
import json
import pickle
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import (
    Context,
    Example,
    check,
    expect,
    expect_refused,
    fail,
)
from kvspec.conformance.checks.payloads import inbox
from kvspec.conformance.checks.transfer import TENSOR_PINS, Setup, tensor_examples
from kvspec.dtypes import DTYPES, FP8_DTYPES
from kvspec.payload import Payload, payload_equal
from kvspec.wire import DEFAULT_LIMITS, WireError, decode, encode

WEIGHT = 0.5


def _payloads(setup: Setup) -> list[tuple[int, int, Payload]]:
    """``(source, target, payload)`` of every edge of the example's plan."""
    return [
        (src, dst, payload)
        for dst in setup.case.target.ranks()
        for src, payload in inbox(setup, dst)
    ]


def _one_payload(setup: Setup) -> Payload:
    rng = random.Random(setup.seed)
    return rng.choice(_payloads(setup))[2]


def _frames(payload: Payload, *, checksum: bool = False) -> list[bytes]:
    return [bytes(f) for f in encode(payload, checksum=checksum)]


def _header(frames: Sequence[bytes]) -> dict[str, Any]:
    return json.loads(frames[0])


def _with_header(frames: Sequence[bytes], header: object) -> list[bytes]:
    return [json.dumps(header).encode(), *frames[1:]]


def _decoded(ctx: Context, frames: list[bytes], what: str, obligation: str) -> Payload:
    try:
        return ctx.adapter.decode(frames)
    except Exception as error:
        fail(f"{what}: the implementation refused a valid message: {error!r} [{obligation}]")


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
    for src, dst, payload in _payloads(setup):
        where = f"{setup.case.describe()}: edge {src}->{dst}"
        try:
            ours = decode([bytes(f) for f in ctx.adapter.encode(payload)])
        except WireError as error:
            fail(f"{where}: the spec refuses the implementation's frames: {error} [WIRE-1.1]")
        expect(
            payload_equal(ours, payload),
            f"{where}: the implementation's frames decode to another payload [WIRE-1.1]",
        )
        theirs = _decoded(ctx, _frames(payload), where, "WIRE-1.1")
        expect(
            isinstance(theirs, Payload) and payload_equal(theirs, payload),
            f"{where}: the spec's frames decode to another payload in the implementation "
            "[WIRE-1.1]",
        )


# -- one change to a valid message -----------------------------------------------------

_HEADER_CHANGES = {
    "format": "WIRE-1.2",
    "version": "WIRE-1.2",
    "missing-key": "WIRE-1.3",
    "unknown-key": "WIRE-1.3",
}


def _changed_header(
    frames: list[bytes], change: str, rng: random.Random
) -> tuple[str, list[bytes]]:
    header = _header(frames)
    if change == "format":
        value = rng.choice(["kvspec.payload.v2", "kvspec", "", None])
        return f"format {value!r}", _with_header(frames, {**header, "format": value})
    if change == "version":
        version = rng.choice([2, 0, 1.0, "1", True, -1])
        return f"version {version!r}", _with_header(frames, {**header, "version": version})
    if change == "missing-key":
        key = rng.choice(sorted(header))
        return f"no {key!r} key", _with_header(
            frames, {k: v for k, v in header.items() if k != key}
        )
    key = rng.choice(["compression", "Format", "crc", "extra"])
    return f"an unknown key {key!r}", _with_header(frames, {**header, key: 0})


@check(
    "WIRE-1",
    "refuses-other-header",
    "another format or version, a missing or an unknown header key is refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(
        tensor_examples(adapter), st.sampled_from(list(_HEADER_CHANGES))
    ),
    examples=((TENSOR_PINS[0], "version"), (TENSOR_PINS[1], "unknown-key")),
    weight=WEIGHT,
    covers=("WIRE-1.2", "WIRE-1.3"),
)
def refuses_other_header(ctx: Context, example: Example) -> None:
    base, change = example
    setup = Setup(ctx, base)
    what, frames = _changed_header(_frames(_one_payload(setup)), change, random.Random(setup.seed))
    expect_refused(
        _HEADER_CHANGES[change],
        f"{setup.case.describe()}: a message with {what}",
        lambda: ctx.adapter.decode(frames),
    )


@check(
    "WIRE-2",
    "refuses-over-limits",
    "a header declaring more layers than max_layers, or longer than max_header_bytes, is refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(
        tensor_examples(adapter), st.sampled_from(["layers", "header"])
    ),
    examples=((TENSOR_PINS[0], "layers"), (TENSOR_PINS[0], "header")),
    weight=0.25,
    covers=("WIRE-2.1", "WIRE-2.2"),
)
def refuses_over_limits(ctx: Context, example: Example) -> None:
    base, limit = example
    setup = Setup(ctx, base)
    frames = _frames(_one_payload(setup))
    header = _header(frames)
    if limit == "layers":
        layers = DEFAULT_LIMITS.max_layers + 1 + setup.seed % 64
        header["metadata"]["num_layers"] = layers
        what, obligation = (
            f"num_layers {layers} (max_layers {DEFAULT_LIMITS.max_layers})",
            "WIRE-2.1",
        )
    else:
        header["request_id"] = "r" * (DEFAULT_LIMITS.max_header_bytes + 1)
        what = f"a header of more than {DEFAULT_LIMITS.max_header_bytes} bytes (max_header_bytes)"
        obligation = "WIRE-2.2"
    bad = _with_header(frames, header)
    expect_refused(
        obligation,
        f"{setup.case.describe()}: a message declaring {what}",
        lambda: ctx.adapter.decode(bad),
    )


_FRAME_CHANGES = {
    "short": "WIRE-3.1",
    "long": "WIRE-3.1",
    "dtype": "WIRE-3.2",
    "layer": "WIRE-3.3",
    "twice": "WIRE-3.3",
    "frame-missing": "WIRE-3.4",
    "frame-extra": "WIRE-3.4",
}
_DTYPE_ALIASES = ("bf16", "fp16", "half", "float", "torch.bfloat16", "float64", "object", "fp8")


def _changed_frames(
    frames: list[bytes], change: str, rng: random.Random
) -> tuple[str, list[bytes]]:
    header = _header(frames)
    i = rng.randrange(len(header["tensors"]))
    entry = header["tensors"][i]
    if change == "short":
        return f"frame {i + 1} one byte short", [
            *frames[: i + 1],
            frames[i + 1][:-1],
            *frames[i + 2 :],
        ]
    if change == "long":
        return f"frame {i + 1} one byte long", [
            *frames[: i + 1],
            frames[i + 1] + b"\0",
            *frames[i + 2 :],
        ]
    if change == "dtype":
        itemsize = DTYPES[entry["dtype"]].itemsize
        same = {
            "float32": ("float", "torch.float32", "fp32"),
            "bfloat16": ("bf16", "torch.bfloat16"),
        }
        name = rng.choice(same.get(entry["dtype"], _DTYPE_ALIASES) if itemsize else _DTYPE_ALIASES)
        entry["dtype"] = name
        return f"tensors[{i}].dtype {name!r}", _with_header(frames, header)
    if change == "layer":
        entry["layer"] = header["metadata"]["num_layers"] + rng.randrange(2)
        return (
            f"tensors[{i}].layer {entry['layer']} (num_layers {header['metadata']['num_layers']})",
            _with_header(frames, header),
        )
    if change == "twice":
        header["tensors"].append(dict(entry))
        return f"tensors[{i}] listed twice (with its frame)", [
            *_with_header(frames, header),
            frames[i + 1],
        ]
    if change == "frame-missing":
        return "the last frame missing", frames[:-1]
    return "one frame more than tensor entries", [*frames, frames[-1]]


@check(
    "WIRE-3",
    "refuses-mismatched-frames",
    "frames whose length, dtype, layer or count disagree with the header are refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(
        tensor_examples(adapter), st.sampled_from(list(_FRAME_CHANGES))
    ),
    examples=tuple((TENSOR_PINS[0], c) for c in ("short", "dtype", "twice", "frame-extra")),
    weight=WEIGHT,
    covers=("WIRE-3.1", "WIRE-3.2", "WIRE-3.3", "WIRE-3.4"),
)
def refuses_mismatched_frames(ctx: Context, example: Example) -> None:
    base, change = example
    setup = Setup(ctx, base)
    what, frames = _changed_frames(_frames(_one_payload(setup)), change, random.Random(setup.seed))
    expect_refused(
        _FRAME_CHANGES[change],
        f"{setup.case.describe()}: a message with {what}",
        lambda: ctx.adapter.decode(frames),
    )


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
    messages = [_frames(p) for _, _, p in _payloads(setup)[:2]]
    rng = random.Random(example["fuzz"])
    for _ in range(4):
        frames = _mutate(messages, rng)
        try:
            want: Payload | None = decode(frames)
        except WireError:
            want = None
        try:
            got = ctx.adapter.decode(frames)
        except ValueError:
            continue
        except Exception as error:
            fail(
                f"{setup.case.describe()}: a damaged message ({len(frames)} frames, header "
                f"{frames[0][:80]!r}...) raised {type(error).__name__}: {error}; a decoder "
                "refuses with a ValueError (WireError), never another exception [WIRE-4.1]"
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


_NOT_JSON = {
    "pickle": "WIRE-4.2",
    "garbage": "WIRE-4.2",
    "repeated-key": "WIRE-4.3",
    "nan": "WIRE-4.3",
    "float": "WIRE-4.3",
}


def _not_strict_json(frames: list[bytes], kind: str, rng: random.Random) -> tuple[str, list[bytes]]:
    header = _header(frames)
    text = frames[0].decode()
    if kind == "pickle":  # a pickled header (harmless here: a plain dict)
        return "a pickled header", [pickle.dumps(header, protocol=4), *frames[1:]]
    if kind == "garbage":
        return "a header of bytes that are no JSON", [b"\x80\x04\x95" + frames[0][3:], *frames[1:]]
    if kind == "repeated-key":
        key = rng.choice(["request_id", "format", "metadata"])
        decoy = json.dumps({key: header[key] if key != "request_id" else "other-request"})[1:-1]
        return f"the key {key!r} twice", [("{" + decoy + "," + text[1:]).encode(), *frames[1:]]
    if kind == "nan":
        field = rng.choice(["block_size", "seq_len"])
        bad = text.replace(f'"{field}":{header["metadata"][field]}', f'"{field}":NaN', 1)
        return f"{field} NaN", [bad.encode(), *frames[1:]]
    where = rng.choice(["version", "layer"])
    if where == "version":
        return "version 1.0", [
            text.replace('"version":1', '"version":1.0', 1).encode(),
            *frames[1:],
        ]
    return "a tensor layer written 0.0", [
        text.replace('"layer":0', '"layer":0.0', 1).encode(),
        *frames[1:],
    ]


@check(
    "WIRE-4",
    "refuses-non-json",
    "a header that is not strict JSON (pickle, a repeated key, NaN, a float) is refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(tensor_examples(adapter), st.sampled_from(list(_NOT_JSON))),
    examples=tuple((TENSOR_PINS[0], k) for k in ("pickle", "repeated-key", "float")),
    weight=WEIGHT,
    covers=("WIRE-4.2", "WIRE-4.3"),
)
def refuses_non_json(ctx: Context, example: Example) -> None:
    base, kind = example
    setup = Setup(ctx, base)
    payload = replace(_one_payload(setup), request_id="req-1")
    what, frames = _not_strict_json(_frames(payload), kind, random.Random(setup.seed))
    if frames[0] == _frames(payload)[0]:
        return  # the text had nothing to change (no layer 0 present)
    expect_refused(
        _NOT_JSON[kind],
        f"{setup.case.describe()}: a message with {what}",
        lambda: ctx.adapter.decode(frames),
    )


def _address(buffer: object) -> tuple[int, int]:
    """(first address, length) of a bytes-like object's memory; -1 for read-only memory
    (``bytes``), which is never a tensor's own."""
    view = memoryview(buffer).cast("B")  # type: ignore[arg-type]
    if not view.nbytes:
        return 0, 0
    if view.readonly:
        return -1, view.nbytes
    return ctypes.addressof(ctypes.c_ubyte.from_buffer(view)), view.nbytes


def _contiguous(payload: Payload) -> Payload:
    def own(values: tuple | None) -> tuple | None:
        return (
            None
            if values is None
            else tuple(None if t is None else t.contiguous().clone() for t in values)
        )

    return replace(
        payload,
        key_cache=own(payload.key_cache),
        value_cache=own(payload.value_cache),
        key_scale=own(payload.key_scale),
        value_scale=own(payload.value_scale),
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
    payload = _contiguous(_one_payload(setup)).to("cpu")
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
    received = [bytearray(f) for f in _frames(payload)]
    regions = [_address(f) for f in received[1:]]
    decoded = _decoded(ctx, list(received), setup.case.describe(), "WIRE-5.2")
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
def checksums(ctx: Context, example: Example) -> None:
    base, where = example
    setup = Setup(ctx, base)
    payload = _one_payload(setup)
    frames = _frames(payload, checksum=True)
    got = _decoded(ctx, frames, f"{setup.case.describe()}: a message with CRC-32s", "WIRE-6.1")
    expect(
        isinstance(got, Payload) and payload_equal(got, payload),
        f"{setup.case.describe()}: a message with CRC-32s decodes to another payload [WIRE-6.1]",
    )
    rng = random.Random(where)
    damaged = list(frames)
    if rng.random() < 0.3 or len(frames) == 1:  # the header: an edit that stays valid JSON
        header = _header(frames)
        header["block_ids"] = [*header["block_ids"], 7]
        damaged[0] = json.dumps(header).encode()
        what = "a block id added to the header"
    else:
        i = rng.randrange(1, len(frames))
        if not frames[i]:
            return
        frame = bytearray(frames[i])
        byte = rng.randrange(len(frame))
        frame[byte] ^= 1 << rng.randrange(8)
        damaged[i] = bytes(frame)
        what = f"one bit flipped in byte {byte} of frame {i}"
    expect_refused(
        "WIRE-6.2",
        f"{setup.case.describe()}: a message with crc32 and {what}",
        lambda: ctx.adapter.decode(damaged),
    )


_PAYLOAD_CHANGES = {
    "metadata-unknown-key": "PAYLOAD-1.1",
    "metadata-missing-key": "PAYLOAD-1.1",
    "marker-unknown-key": "PAYLOAD-1.1",
    "entry-dtype": "PAYLOAD-1.2",
    "seq_len": "PAYLOAD-1.2",
    "missing-scale": "PAYLOAD-1.3",
    "block_size": "PAYLOAD-1.4",
    "block_id": "PAYLOAD-1.4",
    "request_id": "PAYLOAD-1.4",
}


def _invalid_payload(
    frames: list[bytes], change: str, rng: random.Random
) -> tuple[str, list[bytes]] | None:
    header = _header(frames)
    meta = header["metadata"]
    if change == "metadata-unknown-key":
        meta["compression"] = "none"
        return "an unknown metadata key 'compression'", _with_header(frames, header)
    if change == "metadata-missing-key":
        key = rng.choice(["block_size", "seq_len", "tp_head_slice", "dtype"])
        del meta[key]
        return f"no metadata key {key!r}", _with_header(frames, header)
    if change == "marker-unknown-key":
        meta["tp_head_slice"]["stride"] = 1
        return "an unknown tp_head_slice key 'stride'", _with_header(frames, header)
    if change == "entry-dtype":
        dtype = meta["dtype"]
        same = [n for n, d in DTYPES.items() if n != dtype and d.itemsize == DTYPES[dtype].itemsize]
        caches = [e for e in header["tensors"] if e["field"] in ("key_cache", "value_cache")]
        if not same or not caches:
            return None
        entry = rng.choice(caches)
        entry["dtype"] = same[0]
        return (
            f"{entry['field']}[{entry['layer']}] of dtype {same[0]} in a {dtype} payload",
            _with_header(frames, header),
        )
    if change == "seq_len":
        meta["seq_len"] += 1
        return f"metadata seq_len {meta['seq_len']}, one more than its tensors hold", _with_header(
            frames, header
        )
    if change == "missing-scale":
        scales = [i for i, e in enumerate(header["tensors"]) if e["field"].endswith("_scale")]
        if not scales:
            return None
        i = rng.choice(scales)
        entry = header["tensors"].pop(i)
        kept = [f for j, f in enumerate(frames) if j != i + 1]
        return f"{entry['field']}[{entry['layer']}] missing", _with_header(kept, header)
    if change == "block_size":
        meta["block_size"] = 0
        return "block_size 0", _with_header(frames, header)
    if change == "block_id":
        header["block_ids"] = [*header["block_ids"], -1]
        return "a block id -1", _with_header(frames, header)
    header["request_id"] = ""
    return "an empty request id", _with_header(frames, header)


@check(
    "PAYLOAD-1",
    "refuses-invalid-payload",
    "a message describing an invalid payload (keys, shapes, dtypes, scales, values) is refused",
    needs=("wire",),
    strategy=lambda adapter: st.tuples(
        tensor_examples(adapter), st.sampled_from(list(_PAYLOAD_CHANGES))
    ),
    examples=tuple(
        (pin, c)
        for pin, c in (
            (TENSOR_PINS[0], "metadata-unknown-key"),
            (TENSOR_PINS[0], "entry-dtype"),
            (TENSOR_PINS[0], "block_size"),
        )
    ),
    weight=WEIGHT,
    covers=("PAYLOAD-1.1", "PAYLOAD-1.2", "PAYLOAD-1.3", "PAYLOAD-1.4"),
)
def refuses_invalid_payload(ctx: Context, example: Example) -> None:
    base, change = example
    setup = Setup(ctx, base)
    if change == "missing-scale" and setup.case.model.dtype not in FP8_DTYPES:
        change = "seq_len"
    made = _invalid_payload(_frames(_one_payload(setup)), change, random.Random(setup.seed))
    if made is None:
        return
    what, frames = made
    expect_refused(
        _PAYLOAD_CHANGES[change],
        f"{setup.case.describe()}: a message with {what}",
        lambda: ctx.adapter.decode(frames),
    )
