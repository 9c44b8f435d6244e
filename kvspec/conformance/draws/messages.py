"""What the wire and payload families share of a message: the payloads a case's receivers
get (:func:`edge_payloads`), one of them encoded (:func:`wire_frames`), its header read
and replaced (:func:`header_of`, :func:`with_header`) by the checks, and rewritten the way a
lenient decoder "repairs" it (:func:`rewritten`) by the mutants [WIRE, PAYLOAD-1].
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from kvspec.conformance.draws import Setup, inbox
from kvspec.transport.payload import Payload
from kvspec.transport.wire import encode

Header = dict[str, Any]
"""A message's header frame parsed as plain JSON."""


def edge_payloads(setup: Setup) -> list[tuple[int, int, Payload]]:
    """``(source, target, payload)`` of every edge of the example's plan."""
    return [(src, dst, payload) for dst in setup.receivers() for src, payload in inbox(setup, dst)]


def one_payload(setup: Setup) -> Payload:
    """One edge's payload, chosen by the example's seed."""
    rng = random.Random(setup.seed)
    return rng.choice(edge_payloads(setup))[2]


def wire_frames(payload: Payload, *, checksum: bool | str = False) -> list[bytes]:
    """The spec's encoding of ``payload``, each frame as bytes [WIRE-1]."""
    return [bytes(f) for f in encode(payload, checksum=checksum)]


def header_of(frames: Sequence[bytes]) -> Header:
    """The header of a valid message."""
    return json.loads(frames[0])


def with_header(frames: Sequence[bytes], header: object) -> list[bytes]:
    """The message with its header frame replaced by ``header`` as JSON."""
    return [json.dumps(header).encode(), *frames[1:]]


def parsed_header(frames: list) -> Header | None:
    """The header frame parsed as plain JSON, or None where it is no JSON object."""
    try:
        header = json.loads(bytes(frames[0]))
    except (ValueError, IndexError, TypeError):
        return None
    return header if isinstance(header, dict) else None


def rewritten(frames: Sequence[Any], edit: Callable[[Header, list], Header | None]) -> list[Any]:
    """``frames`` with the header (parsed as plain JSON) passed through ``edit``; the frames
    unchanged when the header is no JSON object or ``edit`` returns None."""
    frames = list(frames)
    header = parsed_header(frames)
    if header is None:
        return frames
    edited = edit(header, frames)
    if edited is None:
        return frames
    frames[0] = json.dumps(edited).encode()
    return frames
