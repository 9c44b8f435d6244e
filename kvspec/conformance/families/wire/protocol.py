"""The wire family's adapter protocols: ``wire``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.transport.payload import Payload


class WireProtocol(AdapterProtocol, capability="wire"):
    """A payload's frames on the wire, and back [WIRE-1, WIRE-4]."""

    def encode(self, payload: Payload) -> Sequence[Any]:
        """The frames of a :class:`~kvspec.transport.payload.Payload` in the spec's format
        [WIRE-1]."""
        raise NotProvided

    def decode(self, frames: Sequence[bytes]) -> Payload:
        """The payload of a list of frames; refuse anything malformed [WIRE-4]."""
        raise NotProvided
