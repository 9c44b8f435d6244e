"""The lifecycle family's adapter protocols: ``lifecycle``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from typing import Any

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol


class LifecycleProtocol(AdapterProtocol, capability="lifecycle"):
    """The transfer and block-pool state machine [LIFE-1..7]."""

    def lifecycle(self, num_blocks: int) -> Any:
        """A fresh instance of the implementation's transfer and block-pool state machine
        for a pool of ``num_blocks`` blocks [LIFE-1..7]: an object with ``apply(event)``,
        which raises to refuse an event the rules forbid (and then changes nothing), and
        ``snapshot()``, which returns ``{"blocks": {id: state}, "handles": {id: state},
        "requests": {id: state}}`` in the vocabulary of :mod:`kvspec.lifecycle.machine`.
        """
        raise NotProvided
