"""Mutants of the wire codec [WIRE-1..7].

Most are lenient decoders: they "repair" one kind of malformed message (normalise a
version, drop an unknown key, fill a default, trust a length) and hand it to the
spec's decoder, which is how a permissive parser behaves. None of them runs anything
it receives: the one that falls back on a Python-literal parser evaluates no code.
"""

from __future__ import annotations

import ast
import json
import zlib
from typing import Any

import torch

from kvspec.conformance.draws.messages import Header, parsed_header, rewritten
from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import DTYPES
from kvspec.transport.payload import Payload
from kvspec.transport.wire import WireError, WireLimits, decode, encode


def _crc_dropped(header: Header, frames: list) -> Header:
    return {k: v for k, v in header.items() if k != "crc32"}


@mutant("WIRE-1.1")
class EncodesStorageNotView(ReferenceAdapter):
    """Frames each tensor's whole storage, as if every tensor owned its memory: views of a
    shard (an edge's heads, its layers) send the wrong bytes."""

    def encode(self, payload: Payload):
        frames = list(encode(payload))
        for i, (_, _, tensor) in enumerate(payload.tensors(), 1):
            storage = tensor.untyped_storage()
            if storage.nbytes() != tensor.nbytes and tensor.nbytes:
                raw = torch.empty(storage.nbytes(), dtype=torch.uint8)
                raw.untyped_storage().copy_(storage)
                frames[i] = raw[: tensor.nbytes].numpy().tobytes()
        return frames


@mutant("WIRE-1.2")
class AnyVersionAccepted(ReferenceAdapter):
    """Reads every header as version 1."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            return {**header, "version": 1} if "version" in header else header

        return super().decode(rewritten(frames, edit))


@mutant("WIRE-1.2")
class FormatNotChecked(ReferenceAdapter):
    """Never looks at the header's format."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            return {**header, "format": "kvspec.payload"} if "format" in header else header

        return super().decode(rewritten(frames, edit))


_HEADER_KEYS = (
    "format",
    "version",
    "request_id",
    "block_ids",
    "metadata",
    "tensors",
    "crc32",
    "crc32c",
)


@mutant("WIRE-1.3")
class UnknownHeaderKeysIgnored(ReferenceAdapter):
    """Reads the keys it knows and ignores any other in the header."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            return {k: v for k, v in header.items() if k in _HEADER_KEYS}

        return super().decode(rewritten(frames, edit))


@mutant("WIRE-1.2", "WIRE-1.3", "WIRE-2.1", "WIRE-3.1", "WIRE-3.2", "WIRE-3.4", unclear=True)
class MalformedMessageRefusedWithoutProblem(ReferenceAdapter):
    """Refuses every malformed message with one WireError("malformed KV message"), a
    connector's catch-all around its decoder, naming neither the format, the key, the
    length nor the dtype that is wrong [WIRE-4: "raises WireError naming the problem"]."""

    def decode(self, frames):
        try:
            return super().decode(frames)
        except WireError:
            raise WireError("malformed KV message") from None


@mutant("WIRE-2.1")
class NoLayerLimit(ReferenceAdapter):
    """Decodes with no limit on num_layers (builds per-layer lists of any length)."""

    def decode(self, frames):
        return decode(list(frames), limits=WireLimits(max_layers=1 << 20))


@mutant("WIRE-2.2")
class NoHeaderLimit(ReferenceAdapter):
    """Decodes a header of any length."""

    def decode(self, frames):
        return decode(list(frames), limits=WireLimits(max_header_bytes=1 << 30))


@mutant("WIRE-3.1")
class DecoderTrustsLengths(ReferenceAdapter):
    """Reads each tensor from its frame without checking the frame's length."""

    def decode(self, frames):
        header = json.loads(frames[0])
        fixed = [frames[0]]
        for entry, frame in zip(header["tensors"], frames[1:], strict=False):
            want = 1
            for n in entry["shape"]:
                want *= max(n, 0)
            itemsize = DTYPES[entry["dtype"]].itemsize if entry["dtype"] in DTYPES else 1
            want *= itemsize
            fixed.append(bytes(frame[:want]) + b"\0" * max(0, want - len(frame)))
        return super().decode(fixed + list(frames[len(fixed) :]))


_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float": "float32",
    "fp32": "float32",
    "fp8": "float8_e4m3fn",
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
    "torch.float32": "float32",
}


@mutant("WIRE-3.2")
class DtypeAliasesDecoded(ReferenceAdapter):
    """Understands framework aliases of dtype names in tensor entries ('bf16', 'half', ...)."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            for entry in header.get("tensors", []):
                if isinstance(entry, dict) and entry.get("dtype") in _ALIASES:
                    entry["dtype"] = _ALIASES[entry["dtype"]]
            return header

        return super().decode(rewritten(frames, edit))


@mutant("WIRE-3.3")
class LaterEntryWins(ReferenceAdapter):
    """Stores tensors in a dict by (field, layer): an entry listed twice overwrites the first,
    and an entry past num_layers is skipped."""

    def decode(self, frames):
        frames = list(frames)
        try:
            header = json.loads(frames[0])
            entries = header["tensors"]
            layers = header["metadata"]["num_layers"]
            keys = [(e["field"], e["layer"]) for e in entries]
        except (ValueError, KeyError, TypeError):
            return super().decode(frames)
        keep = [
            i
            for i, key in enumerate(keys)
            if key not in keys[i + 1 :] and isinstance(key[1], int) and key[1] < layers
        ]
        if len(keep) == len(keys) or len(frames) != len(keys) + 1:
            return super().decode(frames)
        header["tensors"] = [entries[i] for i in keep]
        return super().decode([json.dumps(header).encode(), *(frames[i + 1] for i in keep)])


@mutant("WIRE-3.4")
class ExtraFramesIgnored(ReferenceAdapter):
    """Pairs entries with frames with ``zip``: frames after the last entry are ignored."""

    def decode(self, frames):
        frames = list(frames)
        try:
            count = len(json.loads(frames[0])["tensors"])
        except (ValueError, KeyError, TypeError):
            return super().decode(frames)
        return super().decode(frames[: count + 1])


@mutant("WIRE-4.1")
class DecoderIndexesBeforeChecking(ReferenceAdapter):
    """Reads header fields by subscript before validating them: a damaged header raises
    KeyError, TypeError or IndexError instead of a ValueError."""

    def decode(self, frames):
        frames = list(frames)
        header = json.loads(bytes(frames[0]))  # ValueError for no JSON: that much is right
        meta = header["metadata"]
        layers = [None] * int(meta["num_layers"])
        for entry in header["tensors"]:
            layers[entry["layer"]] = entry["shape"][0]
        return super().decode(frames)


@mutant("WIRE-4.2")
class PythonLiteralFallback(ReferenceAdapter):
    """Falls back to ``ast.literal_eval`` for a header that is no JSON, so a header written
    as a Python dict decodes (a parser that evaluates what it receives)."""

    def decode(self, frames):
        frames = list(frames)
        try:
            json.loads(bytes(frames[0]))
        except (ValueError, TypeError):
            try:
                header = ast.literal_eval(bytes(frames[0]).decode("utf-8"))
            except Exception:
                return super().decode(frames)
            if isinstance(header, dict):
                frames[0] = json.dumps(header).encode()
        return super().decode(frames)


@mutant("WIRE-4.3")
class PlainJsonLoads(ReferenceAdapter):
    """Parses the header with plain ``json.loads``: a repeated key keeps its last value and
    a float such as 1.0 is read as the integer it equals."""

    def decode(self, frames):
        def integral(value: Any) -> Any:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, dict):
                return {k: integral(v) for k, v in value.items()}
            if isinstance(value, list):
                return [integral(v) for v in value]
            return value

        return super().decode(rewritten(frames, lambda h, f: integral(h)))


@mutant("WIRE-5.1")
class EncoderCopies(ReferenceAdapter):
    """Frames every tensor as ``bytes`` (a copy) even when it is contiguous on CPU."""

    def encode(self, payload):
        return [bytes(f) for f in super().encode(payload)]


@mutant("WIRE-5.2")
class DecoderCopies(ReferenceAdapter):
    """Copies each decoded tensor out of its frame (``.clone()``)."""

    def decode(self, frames):
        return (
            super()
            .decode(frames)
            .with_layers(lambda values: tuple(None if t is None else t.clone() for t in values))
        )


@mutant("WIRE-6.1")
class HeaderCrcOverSentBytes(ReferenceAdapter):
    """Checks the header's CRC over the header as re-serialised in key order of arrival,
    not over the canonical form: every checksummed message is refused."""

    def decode(self, frames):
        frames = list(frames)
        header = parsed_header(frames)
        if header is not None and isinstance(header.get("crc32"), dict):
            plain = {k: v for k, v in header.items() if k != "crc32"}
            if zlib.crc32(json.dumps(plain).encode()) != header["crc32"].get("header"):
                raise ValueError("the header does not match its CRC-32")
        return super().decode(frames)


@mutant("WIRE-6.2")
class CrcIgnored(ReferenceAdapter):
    """Ignores the crc32 key: damaged messages decode."""

    def decode(self, frames):
        return super().decode(rewritten(frames, _crc_dropped))


@mutant("WIRE-6.2")
class HeaderCrcOnly(ReferenceAdapter):
    """Checks the header's CRC-32 and not the frames'."""

    def decode(self, frames):
        frames = list(frames)
        header = parsed_header(frames)
        if header is None:
            return super().decode(frames)
        sums = header.get("crc32")
        if isinstance(sums, dict) and isinstance(sums.get("frames"), list):
            sums = {**sums, "frames": [zlib.crc32(bytes(f)) for f in frames[1:]]}
            plain = {k: v for k, v in header.items() if k != "crc32"}
            canonical = json.dumps(plain, separators=(",", ":"), sort_keys=True).encode()
            if zlib.crc32(canonical) == sums.get("header"):
                return super().decode([json.dumps({**header, "crc32": sums}).encode(), *frames[1:]])
        return super().decode(frames)


@mutant("WIRE-7.1")
class Crc32cCheckedWithZlib(ReferenceAdapter):
    """Reads crc32c as "the CRC-32" and checks it with zlib.crc32, the CRC it already had:
    every message with CRC-32Cs is refused as damaged."""

    def decode(self, frames):
        frames = list(frames)
        header = parsed_header(frames)
        if header is None:
            return super().decode(frames)
        sums = header.get("crc32c")
        if isinstance(sums, dict) and isinstance(sums.get("frames"), list):
            plain = {k: v for k, v in header.items() if k not in ("crc32", "crc32c")}
            canonical = json.dumps(plain, separators=(",", ":"), sort_keys=True).encode()
            if zlib.crc32(canonical) != sums.get("header"):
                raise ValueError("the header does not match its CRC-32C")
        return super().decode(frames)


@mutant("WIRE-7.2")
class Crc32cIgnored(ReferenceAdapter):
    """Knows only the crc32 key and drops crc32c as an extension it does not check:
    damaged messages protected by CRC-32C decode."""

    def decode(self, frames):
        return super().decode(
            rewritten(frames, lambda h, _: {k: v for k, v in h.items() if k != "crc32c"})
        )


@mutant("WIRE-7.3")
class FirstChecksumWins(ReferenceAdapter):
    """With both crc32 and crc32c in a header, checks the first it knows (crc32) and
    ignores the other, instead of refusing the header."""

    def decode(self, frames):
        def first(header: Header, _: list) -> Header | None:
            if "crc32" in header and "crc32c" in header:
                return {k: v for k, v in header.items() if k != "crc32c"}
            return None

        return super().decode(rewritten(frames, first))
