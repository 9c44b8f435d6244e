"""The transfer family's adapter protocols: ``sender``, ``receiver``, ``marker``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.topology.case import TransferCase


class SenderProtocol(AdapterProtocol, capability="sender"):
    """What a sender puts on each of its edges [SLICE-1, RESHARD-1]."""

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        """What sender ``src`` puts on each of its edges, by target rank [SLICE-1].

        ``shard`` is the sender's own shard [RESHARD-1]; ``slicing`` is one of
        :attr:`slicing_modes`.
        """
        raise NotProvided


class ReceiverProtocol(AdapterProtocol, capability="receiver"):
    """A receiver's shard from the shipments it got [RESHARD-3]."""

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        """Receiver ``dst``'s shard from the shipments it got, in arrival order [RESHARD-3].

        Each shipment carries its sender (``shipment.edge.src``), its ``tp_head_slice``
        marker and its KV; the slice is applied (by the sender, or by
        :meth:`apply_marker` when the adapter has it). Refuse (raise) what cannot be
        combined.
        """
        raise NotProvided


class MarkerProtocol(AdapterProtocol, capability="marker"):
    """The receiver's step for a shipment's head-slice marker [SLICE-3]."""

    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        """Receiver ``dst``'s slice step for one shipment [SLICE-3].

        Cut an unapplied slice once and mark it applied by the receiver; return an
        applied one unchanged; refuse (raise) one marked for another rank. Adapters
        whose receiver applies slices inside :meth:`receiver_combine` may leave this out.
        """
        raise NotProvided
