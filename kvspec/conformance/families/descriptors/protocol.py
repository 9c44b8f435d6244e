"""The descriptors family's adapter protocols: ``descriptors``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.memory.descriptors import RegisteredCache
from kvspec.topology.case import TransferCase


class DescriptorsProtocol(AdapterProtocol, capability="descriptors"):
    """The byte ranges a pull connector posts for one edge [DESC-1..3]."""

    def descriptors(
        self,
        case: TransferCase,
        src: int,
        dst: int,
        source: RegisteredCache,
        source_ids: list[int],
        target: RegisteredCache,
        target_ids: list[int],
        tokens: range,
    ) -> Sequence[Any]:
        """The byte ranges a pull connector posts to realise edge ``src`` -> ``dst`` for
        ``tokens`` [DESC-1, DESC-2]: each ``(src region, src offset, dst region, dst offset,
        length)``. ``source`` and ``target`` are the two ranks'
        :class:`~kvspec.memory.descriptors.RegisteredCache` (layout, block size, the heads
        and layers each holds, region names and registered sizes); the ids are the
        request's blocks on each side. Refuse (raise) what cannot be done inside the
        registered regions. Lists are judged by what they write, in any order and any
        granularity; set :attr:`coalesces` to be held to the minimum count [DESC-3]."""
        raise NotProvided
