"""The sim's own small messages: JSON envelopes and control events, never pickle.

A data message on a KV socket is ``[envelope, *payload frames]``: the envelope names
the spec's key for the payload, its place in the edge's order (``seq``) and when it
was sent; the payload frames are the spec's wire format (:mod:`kvspec.transport.wire`).
Everything else is one JSON frame: control events and commands between ranks and the
parent, and on a KV socket the receiver's *hello*, the sender's *welcome* and the
sender's *end-of-stream* (see :mod:`sim.net.auth` for what is signed). Parsing trusts
nothing: a frame that is not the expected JSON object, or is larger than its limit,
is refused with :class:`MessageError`, whose text quotes at most a short prefix.
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any, TypeGuard

from kvspec.core.errors import InputError

MAX_ENVELOPE = 4096
MAX_HANDSHAKE = 4096
"""A hello or welcome; a sender's KV socket accepts nothing larger (ZMQ_MAXMSGSIZE)."""
MAX_CONTROL = 8 << 20
"""A control event or command."""
MAX_INT = (1 << 63) - 1


class MessageError(InputError):
    """A frame that is not a valid sim message; the text says what is wrong."""


def dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def _reject_constant(name: str) -> float:
    raise MessageError(f"{name} is not a JSON number")


def load(frame: bytes | memoryview, *, limit: int = MAX_CONTROL) -> dict[str, Any]:
    """A JSON object from one frame, refusing anything else (NaN and Infinity included)."""
    size = len(frame)
    if size > limit:
        raise MessageError(f"a {size}-byte frame exceeds the {limit}-byte limit")
    try:
        message = json.loads(bytes(frame), parse_constant=_reject_constant)
    # ValueError covers more than JSONDecodeError: an integer of more than 4,300 digits
    # (Python's int-from-string limit) is refused by json.loads with a plain ValueError.
    except (ValueError, RecursionError) as error:
        raise MessageError(f"not a JSON message: {str(error)[:80]}") from None
    if not isinstance(message, dict):
        raise MessageError(f"expected a JSON object, got {type(message).__name__}")
    return message


def short(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about untrusted values."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<a deeply nested {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _crc(*fields: object) -> int:
    return zlib.crc32("|".join(map(repr, fields)).encode())


def envelope(
    key: str,
    seq: int,
    sent_at: float,
    *,
    epoch: int = 0,
    checksum: bool = False,
    ranges_crc: int | None = None,
    ranges_alg: str | None = None,
    started: float | None = None,
) -> bytes:
    """The envelope of a data message: its key, its place in the edge's order, its
    sender's epoch [LIFE-6] and when it was sent; with ``checksum``, a CRC-32 of its own
    fields, so that a flipped bit there is refused like one in the payload. A pull answer
    or a write (:mod:`sim.paths.pull`, :mod:`sim.paths.write`) carries ``ranges_crc``, the CRC
    of the byte ranges that follow, and ``ranges_alg``, its algorithm (``crc32`` [WIRE-6] or
    ``crc32c`` [WIRE-7]; ``crc32`` when absent)."""
    message: dict[str, Any] = {"key": key, "seq": seq, "epoch": epoch, "t": sent_at}
    if checksum:
        message["crc"] = _crc(key, seq, epoch, sent_at)
    if ranges_crc is not None:
        message["ranges_crc"] = ranges_crc
    if ranges_alg is not None:
        message["ranges_alg"] = ranges_alg
    if started is not None:
        message["t0"] = started  # when the sender began computing the request [STREAM-1]
    return dump(message)


def read_envelope(frame: bytes | memoryview) -> dict[str, Any]:
    """The envelope heading a data message: ``{"key": str, "seq": int, "t": number}``."""
    message = load(frame, limit=MAX_ENVELOPE)
    key, seq, sent_at = message.get("key"), message.get("seq"), message.get("t")
    epoch = message.get("epoch")
    if not (isinstance(key, str) and _is_int(seq) and _is_int(epoch) and _is_number(sent_at)):
        raise MessageError(
            f"an envelope needs a key, a seq, an epoch and a time, got {short(message)}"
        )
    if "crc" in message and message["crc"] != _crc(key, seq, epoch, sent_at):
        raise MessageError("the envelope does not match its CRC-32: it was damaged on the way")
    return message


def end_of_stream(keys: list[str], skipped: dict[str, str]) -> bytes:
    """The last message a sender sends a receiver: every key it sent (faults aside), and
    the keys it did not send with the reason (a request that failed upstream)."""
    return dump({"end": keys, "skipped": skipped})


def hello(rank: int, nonce: str, mac: str) -> bytes:
    return dump({"hello": rank, "nonce": nonce, "mac": mac})


def welcome(rank: int, mac: str) -> bytes:
    return dump({"welcome": rank, "mac": mac})


def read_handshake(frame: bytes | memoryview) -> dict[str, Any]:
    """A hello (receiver -> sender) or a welcome (sender -> receiver), fields checked."""
    message = load(frame, limit=MAX_HANDSHAKE)
    if "hello" in message:
        if not (
            _is_int(message["hello"])
            and isinstance(message.get("nonce"), str)
            and len(message["nonce"]) <= 64
            and isinstance(message.get("mac"), str)
        ):
            raise MessageError(f"a hello needs a rank, a nonce and a mac, got {short(message)}")
    elif "welcome" in message:
        if not (_is_int(message["welcome"]) and isinstance(message.get("mac"), str)):
            raise MessageError(f"a welcome needs a rank and a mac, got {short(message)}")
    else:
        raise MessageError(f"not a handshake: fields {short(sorted(message)[:8])}")
    return message


NOTICES: dict[str, type] = {"ack": str, "failed": str, "restart": int, "quiesced": int}
"""One-frame notices a sender sends a receiver [LIFE]: ``ack`` (request: nothing more
will be sent for it), ``failed`` (key: that send failed and wrote nothing), ``restart``
(epoch: the sender came back in this epoch), ``quiesced`` (epoch: nothing of that
epoch or older will land any more)."""


def notice(kind: str, value: str | int) -> bytes:
    return dump({kind: value})


def abort(request: str) -> bytes:
    """A receiver's request to a sender: stop sending ``request`` and acknowledge."""
    return dump({"abort": request})


def read_abort(frame: bytes | memoryview) -> str:
    message = load(frame, limit=MAX_HANDSHAKE)
    if set(message) != {"abort"} or not isinstance(message["abort"], str):
        raise MessageError(f"not an abort: {short(message)}")
    return message["abort"]


def read_single(frame: bytes | memoryview, *, limit: int) -> dict[str, Any]:
    """A one-frame message a receiver gets on a KV socket: a welcome, an end-of-stream or
    a notice (:data:`NOTICES`)."""
    message = load(frame, limit=limit)
    for kind, wanted in NOTICES.items():
        if kind in message:
            value = message[kind]
            ok = _is_int(value) and value >= 0 if wanted is int else isinstance(value, str)
            if len(message) != 1 or not ok:
                raise MessageError(f"a {kind} notice needs one {wanted.__name__}")
            return message
    if "end" in message:
        keys = message["end"]
        skipped = message.get("skipped", {})
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise MessageError("an end-of-stream lists the keys sent, as strings")
        if not isinstance(skipped, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in skipped.items()
        ):
            raise MessageError("an end-of-stream's skipped keys map key -> reason, as strings")
        return message
    return read_handshake(frame)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(float(value))
