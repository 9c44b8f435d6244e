"""The streaming family's adapter protocols: ``streaming``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.tensors.kv import RequestKV
from kvspec.topology.case import TransferCase
from kvspec.transport.payload import Payload


class StreamingProtocol(AdapterProtocol, capability="streaming"):
    """Layer groups streamed while the prefill runs: their order, keys and merge [STREAM-1]."""

    def layer_groups(self, num_layers: int, groups: int) -> Sequence[range]:
        """The model's layers in ``groups`` groups, in the order they are streamed
        [STREAM-1.1]."""
        raise NotProvided

    def stream_key(
        self,
        request_id: str,
        from_stage: int,
        chunk_id: int,
        group: int,
        groups: int,
        from_rank: int,
        to_rank: int,
    ) -> str:
        """The key of layer group ``group`` of chunk ``chunk_id`` on one edge [STREAM-1.2]."""
        raise NotProvided

    def merge_layers(
        self, case: TransferCase, dst: int, group: range, received: Sequence[tuple[int, Payload]]
    ) -> RequestKV:
        """Receiver ``dst``'s :class:`~kvspec.tensors.kv.RequestKV` on the layers it owns in
        ``group``, from each source's part of the group (a Payload holding only the group's
        layers), in arrival order [STREAM-1.3]."""
        raise NotProvided
