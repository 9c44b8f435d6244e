"""The paged family's adapter protocols: ``paged``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.memory.paged import PagedCache
from kvspec.tensors.kv import RequestKV


class PagedProtocol(AdapterProtocol, capability="paged"):
    """A request copied out of a paged cache's blocks, and written into them [PAGED-1..5]."""

    def gather(self, cache: PagedCache, block_ids: list[int], seq_len: int) -> RequestKV:
        """A request from a :class:`~kvspec.memory.paged.PagedCache` by block ids [PAGED-1..3]."""
        raise NotProvided

    def scatter(self, kv: RequestKV, cache: PagedCache, block_ids: list[int]) -> None:
        """Write ``kv`` into the cache's blocks in place; refuse bad tables [PAGED-2..5]."""
        raise NotProvided
