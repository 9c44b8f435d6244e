"""The sim's own small messages: JSON envelopes and control events, never pickle.

A data message on a KV socket is ``[envelope, *payload frames]``: the envelope names
the spec's key for the payload and when it was sent; the payload frames are the
spec's wire format (:mod:`kvspec.wire`). Control messages between ranks and the
parent are one JSON frame each. Parsing trusts nothing: a frame that is not the
expected JSON object is refused with :class:`MessageError`.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

MAX_ENVELOPE = 4096


class MessageError(ValueError):
    """A frame that is not a valid sim message; the text says what is wrong."""


def dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def load(frame: bytes | memoryview, *, limit: int = 1 << 20) -> dict[str, Any]:
    """A JSON object from one frame, refusing anything else."""
    data = bytes(frame)
    if len(data) > limit:
        raise MessageError(f"a {len(data)}-byte control frame exceeds the {limit}-byte limit")
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MessageError(f"not a JSON message: {error}") from None
    if not isinstance(message, dict):
        raise MessageError(f"expected a JSON object, got {type(message).__name__}")
    return message


def _envelope_crc(key: str, sent_at: float) -> int:
    return zlib.crc32(f"{key}|{sent_at!r}".encode())


def envelope(key: str, sent_at: float, *, checksum: bool = False) -> bytes:
    """The envelope of a data message; with ``checksum``, a CRC-32 of its own fields, so
    that a flipped bit in the key or the time is refused like one in the payload."""
    message: dict[str, Any] = {"key": key, "t": sent_at}
    if checksum:
        message["crc"] = _envelope_crc(key, sent_at)
    return dump(message)


def end_of_stream(keys: list[str], skipped: dict[str, str]) -> bytes:
    """The last message a sender sends a receiver: every key it sent (faults aside), and
    the keys it did not send with the reason (a request that failed upstream)."""
    return dump({"end": keys, "skipped": skipped})


def hello(rank: int) -> bytes:
    return dump({"hello": rank})


def read_envelope(frame: bytes | memoryview) -> dict[str, Any]:
    """The envelope heading a data message: ``{"key": str, "t": number}``."""
    message = load(frame, limit=MAX_ENVELOPE)
    if not isinstance(message.get("key"), str) or not isinstance(message.get("t"), int | float):
        raise MessageError(f"an envelope needs a string key and a number t, got {message}")
    if "crc" in message and message["crc"] != _envelope_crc(message["key"], message["t"]):
        raise MessageError("the envelope does not match its CRC-32: it was damaged on the way")
    return message


def read_single(frame: bytes | memoryview) -> dict[str, Any]:
    """A one-frame message on a KV socket: a hello or an end-of-stream."""
    message = load(frame, limit=1 << 24)
    if "end" in message:
        keys = message["end"]
        skipped = message.get("skipped", {})
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise MessageError("an end-of-stream lists the keys sent, as strings")
        if not isinstance(skipped, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in skipped.items()
        ):
            raise MessageError("an end-of-stream's skipped keys map key -> reason, as strings")
    elif not isinstance(message.get("hello"), int):
        raise MessageError(f"unknown one-frame message with fields {sorted(message)}")
    return message
