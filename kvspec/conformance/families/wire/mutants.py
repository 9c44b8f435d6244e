"""Mutants of the wire codec [WIRE-1..7, PAYLOAD-1].

Most are lenient decoders: they "repair" one kind of malformed message (normalise a
version, drop an unknown key, fill a default, trust a length) and hand it to the
spec's decoder, which is how a permissive parser behaves. None of them runs anything
it receives: the one that falls back on a Python-literal parser evaluates no code.
"""

from __future__ import annotations

import ast
import json
import zlib
from collections.abc import Callable
from typing import Any

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import DTYPES
from kvspec.transport.payload import Payload
from kvspec.transport.wire import WireLimits, decode, encode

Header = dict[str, Any]


def _header(frames: list) -> Header | None:
    """The header frame parsed as plain JSON, or None where it is no JSON object."""
    try:
        header = json.loads(bytes(frames[0]))
    except (ValueError, IndexError, TypeError):
        return None
    return header if isinstance(header, dict) else None


def _rewritten(frames, edit: Callable[[Header, list], Header | None]) -> list:
    """``frames`` with the header (parsed as plain JSON) passed through ``edit``; the frames
    unchanged when the header is no JSON object or ``edit`` returns None."""
    frames = list(frames)
    header = _header(frames)
    if header is None:
        return frames
    edited = edit(header, frames)
    if edited is None:
        return frames
    frames[0] = json.dumps(edited).encode()
    return frames


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

        return super().decode(_rewritten(frames, edit))


@mutant("WIRE-1.2")
class FormatNotChecked(ReferenceAdapter):
    """Never looks at the header's format."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            return {**header, "format": "kvspec.payload"} if "format" in header else header

        return super().decode(_rewritten(frames, edit))


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

        return super().decode(_rewritten(frames, edit))


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

        return super().decode(_rewritten(frames, edit))


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

        return super().decode(_rewritten(frames, lambda h, f: integral(h)))


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
        header = _header(frames)
        if header is not None and isinstance(header.get("crc32"), dict):
            plain = {k: v for k, v in header.items() if k != "crc32"}
            if zlib.crc32(json.dumps(plain).encode()) != header["crc32"].get("header"):
                raise ValueError("the header does not match its CRC-32")
        return super().decode(frames)


@mutant("WIRE-6.2")
class CrcIgnored(ReferenceAdapter):
    """Ignores the crc32 key: damaged messages decode."""

    def decode(self, frames):
        return super().decode(_rewritten(frames, _crc_dropped))


@mutant("WIRE-6.2")
class HeaderCrcOnly(ReferenceAdapter):
    """Checks the header's CRC-32 and not the frames'."""

    def decode(self, frames):
        frames = list(frames)
        header = _header(frames)
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
        header = _header(frames)
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
            _rewritten(frames, lambda h, _: {k: v for k, v in h.items() if k != "crc32c"})
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

        return super().decode(_rewritten(frames, first))


_META_KEYS = ("block_size", "num_layers", "dtype", "seq_len", "tp_head_slice", "chunk")
_MARKER_KEYS = (
    "target_rank",
    "from_tp",
    "to_tp",
    "offset_in_shard",
    "num_slices",
    "applied",
    "side",
)


@mutant("PAYLOAD-1.1")
class LenientMetadata(ReferenceAdapter):
    """Reads the metadata keys it knows with defaults (block_size 16, final True) and
    ignores the others."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            meta = header.get("metadata")
            if not isinstance(meta, dict):
                return header
            meta = {k: v for k, v in meta.items() if k in _META_KEYS}
            meta.setdefault("block_size", 16)
            if isinstance(meta.get("tp_head_slice"), dict):
                meta["tp_head_slice"] = {
                    k: v for k, v in meta["tp_head_slice"].items() if k in _MARKER_KEYS
                }
            if isinstance(meta.get("chunk"), dict):
                meta["chunk"] = {"final": True, **meta["chunk"]}
            return {**header, "metadata": meta}

        return super().decode(_rewritten(frames, edit))


@mutant("PAYLOAD-1.2")
class TensorsReadAsMetadataDtype(ReferenceAdapter):
    """Reads every tensor as the metadata's dtype when the element sizes match, whatever
    its entry says."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            meta = header.get("metadata", {})
            dtype = meta.get("dtype") if isinstance(meta, dict) else None
            for entry in header.get("tensors", []):
                if (
                    isinstance(entry, dict)
                    and entry.get("field", "").endswith("_cache")
                    and entry.get("dtype") in DTYPES
                    and dtype in DTYPES
                    and DTYPES[entry["dtype"]].itemsize == DTYPES[dtype].itemsize
                ):
                    entry["dtype"] = dtype
            return header

        return super().decode(_rewritten(frames, edit))


@mutant("PAYLOAD-1.2")
class SeqLenFromTensors(ReferenceAdapter):
    """Takes seq_len from the tensors' first dimension, never comparing the metadata's."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            caches = [
                e for e in header.get("tensors", []) if isinstance(e, dict) and e.get("shape")
            ]
            meta = header.get("metadata")
            if caches and isinstance(meta, dict) and "seq_len" in meta:
                meta["seq_len"] = caches[0]["shape"][0]
            return header

        return super().decode(_rewritten(frames, edit))


@mutant("PAYLOAD-1.3")
class MissingScalesDefaulted(ReferenceAdapter):
    """Supplies a scale of 1.0 for an fp8 cache that arrived without its scale."""

    def decode(self, frames):
        frames = list(frames)
        try:
            header = json.loads(bytes(frames[0]))
            entries = header["tensors"]
            fp8 = header["metadata"]["dtype"].startswith("float8")
        except (ValueError, KeyError, TypeError, AttributeError):
            return super().decode(frames)
        if not fp8:
            return super().decode(frames)
        have = {(e["field"], e["layer"]) for e in entries}
        one = torch.ones((), dtype=torch.float32).numpy().tobytes()
        for e in list(entries):
            if e["field"].endswith("_cache"):
                scale = e["field"].replace("_cache", "_scale")
                if (scale, e["layer"]) not in have:
                    entries.append(
                        {"field": scale, "layer": e["layer"], "dtype": "float32", "shape": []}
                    )
                    frames.append(one)
        frames[0] = json.dumps(header).encode()
        return super().decode(frames)


@mutant("PAYLOAD-1.4")
class OutOfRangeValuesClamped(ReferenceAdapter):
    """Clamps what is out of range: block_size to at least 1, negative block ids dropped,
    an empty request id named 'unknown'."""

    def decode(self, frames):
        def edit(header: Header, frames: list) -> Header:
            meta = header.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("block_size"), int):
                meta["block_size"] = max(1, meta["block_size"])
            if isinstance(header.get("block_ids"), list):
                header["block_ids"] = [
                    b for b in header["block_ids"] if not isinstance(b, int) or b >= 0
                ]
            if header.get("request_id") == "":
                header["request_id"] = "unknown"
            return header

        return super().decode(_rewritten(frames, edit))
