"""The payloads family's adapter protocols: ``payload``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.topology.case import TransferCase
from kvspec.transport.payload import Payload


class PayloadProtocol(AdapterProtocol, capability="payload"):
    """A receiver's shard from the payloads it got [PAYLOAD-3]."""

    def merge(
        self, case: TransferCase, dst: int, received: Sequence[tuple[int, Payload]]
    ) -> Payload:
        """Receiver ``dst``'s shard from ``(source rank, Payload)`` pairs in arrival order
        [PAYLOAD-3]; refuse shards that disagree."""
        raise NotProvided
