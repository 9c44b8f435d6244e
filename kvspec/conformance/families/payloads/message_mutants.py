"""Mutants of decoding a message that describes an invalid payload [PAYLOAD-1].

Each is a lenient decoder: it "repairs" one kind of invalid payload (drops an unknown
key, fills a default, trusts the tensors over the metadata, clamps a value) and hands
the message to the spec's decoder, which is how a permissive parser behaves.
"""

from __future__ import annotations

import json

import torch

from kvspec.conformance.draws.messages import Header, rewritten
from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import DTYPES
from kvspec.transport.wire import WireError

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

        return super().decode(rewritten(frames, edit))


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

        return super().decode(rewritten(frames, edit))


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

        return super().decode(rewritten(frames, edit))


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

        return super().decode(rewritten(frames, edit))


@mutant("PAYLOAD-1.1", "PAYLOAD-1.2", "PAYLOAD-1.4", unclear=True)
class InvalidPayloadRefusedWithoutValue(ReferenceAdapter):
    """Refuses a message whose header is well formed but describes an invalid payload, as
    it must, with "the header describes an invalid payload" and no more: the key or the
    value that is wrong is logged, not raised (the wire's own refusals keep their words)."""

    def decode(self, frames):
        try:
            return super().decode(frames)
        except WireError as error:
            vague = "the header describes an invalid payload"
            if str(error).startswith(vague):
                raise WireError(vague) from None
            raise
