"""The chunks family's adapter protocols: ``chunks``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.transport.payload import Payload


class ChunksProtocol(AdapterProtocol, capability="chunks"):
    """One whole-request payload from its chunks [CHUNK-2]."""

    def reassemble(self, chunks: Sequence[Payload]) -> Payload:
        """One whole-request :class:`~kvspec.transport.payload.Payload` from its chunks
        [CHUNK-2]."""
        raise NotProvided
