"""The naming family's adapter protocols: ``keys``, ``edge-keys``, ``ports``, ``dp-ports``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.naming.ports import PortScheme
from kvspec.topology.case import TransferCase
from kvspec.topology.stage import StageLayout


class KeysProtocol(AdapterProtocol, capability="keys"):
    """The connector keys of one edge and of two single-rank stages [KEY-1..3]."""

    def rank_aware_key(
        self, request_id: str, from_stage: int, chunk_id: int, from_rank: int, to_rank: int
    ) -> str:
        """The rank-aware connector key; raise for inputs outside the domain [KEY-1, KEY-3]."""
        raise NotProvided

    def legacy_key(self, request_id: str, from_stage: int, to_stage: int) -> str:
        """The legacy key of two single-rank stages [KEY-2, KEY-3]."""
        raise NotProvided


class EdgeKeysProtocol(AdapterProtocol, capability="edge-keys"):
    """The keys a sender puts and a receiver waits for [KEY-4]."""

    def send_keys(
        self, case: TransferCase, request_id: str, src: int, *, from_stage: int, to_stage: int
    ) -> Sequence[tuple[str, int]]:
        """``(key, target rank)`` for everything sender ``src`` sends [KEY-4]."""
        raise NotProvided

    def recv_keys(
        self, case: TransferCase, request_id: str, dst: int, *, from_stage: int, to_stage: int
    ) -> Sequence[tuple[str, int]]:
        """``(key, source rank)`` for everything receiver ``dst`` expects [KEY-4]."""
        raise NotProvided


class PortsProtocol(AdapterProtocol, capability="ports"):
    """A sender's KV port [PORT-1..3]."""

    def kv_port(self, base: int, stage: int, rank: int, replica: int) -> int:
        """The KV port of sender (stage, rank, replica); raise outside the domain [PORT-1..3]."""
        raise NotProvided


class DpPortsProtocol(AdapterProtocol, capability="dp-ports"):
    """The KV port of a rank of a stage with attention-DP groups [PORT-1, STAGE-2]."""

    def stage_port(
        self,
        base: int,
        stage: int,
        layout: StageLayout,
        rank: int,
        replica: int,
        scheme: PortScheme,
    ) -> int:
        """The KV port of stage-local ``rank`` of a stage with attention-DP groups under a
        port ``scheme`` (with or without a dp_stride) [PORT-1, STAGE-2]."""
        raise NotProvided
