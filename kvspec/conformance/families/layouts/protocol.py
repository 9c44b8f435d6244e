"""The layouts family's adapter protocols: ``layouts``, ``conversion``, ``fields``, ``detection``,
``record-rows``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.topology.model import ModelShape


class LayoutsProtocol(AdapterProtocol, capability="layouts"):
    """K and V (or the latent) of one layer's cache in a named layout [LAYOUT-1, 2, 5]."""

    def read_layer(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> tuple[Any, ...]:
        """K and V (or the latent) of one layer's cache in the named ``layout``, each
        ``[num_blocks, block_size, heads, head_dim]`` and a view of the cache [LAYOUT-1, 2];
        a cross-layer cache reads ``[layers, ...]`` [LAYOUT-5].

        ``page_size`` is given for a token pool (``sglang_mha``, ``sglang_mla``), whose
        page size is not in its shape [LAYOUT-5]; an adapter whose method does not take it
        is not asked to read token pools."""
        raise NotProvided


class ConversionProtocol(AdapterProtocol, capability="conversion"):
    """A cache re-laid in another layout or block size, bit for bit [LAYOUT-3, 6]."""

    def convert_layout(
        self,
        cache: Any,
        source: str,
        target: str,
        *,
        page_size: int | None = None,
        block_size: int | None = None,
    ) -> Any:
        """A new cache in ``target`` holding ``cache``'s slots bit for bit [LAYOUT-3, 6], in
        blocks of ``block_size`` (default: the source's); ``page_size`` is a token pool's
        page size, as for :meth:`read_layer`. An adapter whose method does not take
        ``block_size`` is not asked to re-block."""
        raise NotProvided


class FieldsProtocol(AdapterProtocol, capability="fields"):
    """Every field of a cache's cells, inline scales included [LAYOUT-6]."""

    def read_fields(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> dict[str, Any]:
        """Every field of the cells of one layer's cache, inline scales included, by name
        (``k``, ``v``, ``k_scale``, ``latent``, ``nope``, ...), each a view in its own dtype,
        ``[num_blocks, block_size, heads, width]`` [LAYOUT-6]."""
        raise NotProvided


class DetectionProtocol(AdapterProtocol, capability="detection"):
    """The one layout a cache can be, from its shape [LAYOUT-4]."""

    def detect_layout(
        self,
        cache: Any,
        *,
        heads: int | None = None,
        head_dim: int | None = None,
        block_size: int | None = None,
    ) -> str:
        """The one layout ``cache`` can be; raise when several fit [LAYOUT-4]."""
        raise NotProvided


class RecordRowsProtocol(AdapterProtocol, capability="record-rows"):
    """A record cache's fields as the rows of bytes they travel as, and back [LAYOUT-7]."""

    def record_rows(self, fields: Mapping[str, Any], model: ModelShape, layout: str) -> Any:
        """A record cache's request fields (each ``[layers, seq, heads, width]``) as the
        rows of bytes it travels as, ``[layers, kv, seq, heads, row bytes]`` in one-byte
        elements of ``model``'s dtype [LAYOUT-7]; raise for a layout without a record."""
        raise NotProvided

    def record_fields(self, rows: Any, model: ModelShape, layout: str) -> Mapping[str, Any]:
        """The fields read back from rows of bytes, each in its own dtype [LAYOUT-7]."""
        raise NotProvided
