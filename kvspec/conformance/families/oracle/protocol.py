"""The oracle family's adapter protocols: ``oracle``, ``verifier``, ``record-oracle``, ``state-
oracle``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.tensors.kv import RequestKV
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens


class OracleProtocol(AdapterProtocol, capability="oracle"):
    """The coordinate-hash values of a region of one request [ORACLE-1..4]."""

    def oracle_fill(
        self,
        model: ModelShape,
        request_id: str,
        *,
        tokens: range | Tokens,
        layers: range,
        heads: range,
        seed: int,
    ) -> RequestKV:
        """The coordinate-hash values of a region of one request [ORACLE-1..4]; ``tokens``
        may be a token set (a context-parallel rank's tokens, in ascending order)."""
        raise NotProvided


class VerifierProtocol(AdapterProtocol, capability="verifier"):
    """How many elements of KV differ from the oracle's [ORACLE-5]."""

    def oracle_verify(
        self,
        kv: RequestKV,
        model: ModelShape,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> int:
        """How many elements and fp8 scales of ``kv`` differ from the oracle's [ORACLE-5];
        raise for KV of another shape or dtype than the ranges imply."""
        raise NotProvided


class RecordOracleProtocol(AdapterProtocol, capability="record-oracle"):
    """The oracle's fields of a record layout, and their check [ORACLE-6]."""

    def record_fill(
        self,
        model: ModelShape,
        layout: str,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> Mapping[str, Any]:
        """Every field of the cells of a region of one request in a record ``layout``
        (``k``, ``k_scale``, ``nope``, ...), each ``[layers, tokens, heads, width]`` in its
        own dtype [ORACLE-6]; raise for a layout that cannot hold ``model``."""
        raise NotProvided

    def record_verify(
        self,
        fields: Mapping[str, Any],
        model: ModelShape,
        layout: str,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> int:
        """How many elements of ``fields`` (every field, inline scales included) differ from
        the oracle's [ORACLE-6]."""
        raise NotProvided


class StateOracleProtocol(AdapterProtocol, capability="state-oracle"):
    """The state oracle's values of a state group [ORACLE-7]."""

    def state_oracle(
        self,
        model: ModelShape,
        group: int,
        request_id: str,
        *,
        layers: tuple[int, ...],
        attn_tp: int,
        attn_tp_rank: int,
        seed: int,
    ) -> Mapping[str, torch.Tensor]:
        """The state oracle's values of ``layers`` of state group ``group`` that
        attention-TP rank ``attn_tp_rank`` of ``attn_tp`` holds: by part name,
        ``[layers, units held, width * rows]`` in the part's dtype [ORACLE-7]."""
        raise NotProvided
