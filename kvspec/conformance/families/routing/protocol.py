"""The routing family's adapter protocols: ``routing``, ``topology``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.topology.case import TransferCase


class RoutingProtocol(AdapterProtocol, capability="routing"):
    """Which source ranks each receiver takes KV from, and the inverse [PLAN-2..4]."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        """Source ranks receiver ``dst`` takes KV from [PLAN-2, PLAN-3], under the replica
        policy ``case.policy`` [PLAN-4].

        Refuse (raise) a ``case.policy`` the implementation does not implement, one in
        neither :attr:`policies` nor :attr:`policy_rules`, rather than route under another
        policy [PLAN-4.4]."""
        raise NotProvided

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        """Target ranks sender ``src`` sends KV to [PLAN-3]."""
        raise NotProvided


class TopologyProtocol(
    AdapterProtocol, capability="topology", older={"validate_topology": ("validate",)}
):
    """Refusing a pair of stages, in the transfer code [PLAN-1, DP-1]."""

    def validate_topology(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses to transfer between these two stages
        [PLAN-1]."""
        raise NotProvided
