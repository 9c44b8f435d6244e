"""Merging several senders' payloads into one receiver's shard: agreement first, then
placement by the plan [PAYLOAD-3].

Payloads to one receiver must agree on every fact of the request (id, tokens, layers,
dtype, block size, chunk) and carry every layer their edges carry; a disagreement is
refused naming every value. They are then handed to
:func:`~kvspec.tensors.reshard.receive` as shipments, so placement has one
implementation [RESHARD-3]. :func:`merge_to_request_kv` gives the shard as a
:class:`~kvspec.tensors.kv.RequestKV`, optionally landing it in a receiver's reused
buffer; :func:`merge_payloads` as a payload again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import torch

from kvspec.core.require import require_int, show
from kvspec.tensors.dtypes import torch_dtype
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment, landing_region, landing_shape, receive
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.plan import TransferPlan
from kvspec.topology.tokens import Tokens
from kvspec.transport.payload.form import CACHE_FIELDS, SCALE_FIELDS, TENSOR_FIELDS, Payload
from kvspec.transport.payload.shipments import layer_span, shipment_from_payload, slice_payload

_AGREED = ("request_id", "seq_len", "num_layers", "dtype", "block_size", "chunk")


def merge_to_request_kv(
    plan: TransferPlan,
    dst: int,
    received: Iterable[tuple[int, Payload]],
    *,
    landing: torch.Tensor | None = None,
) -> RequestKV:
    """Receiver ``dst``'s shard as one :class:`RequestKV`, from ``(source rank, payload)``
    pairs in any order [PAYLOAD-3]: the checks of :func:`merge_payloads` without building
    the dict form again, for a receiver that writes the shard into its cache next.

    ``landing``: a receiver's reused buffer, a 1-d uint8 tensor whose first bytes receive
    the shard (the result's data is a view of them) instead of fresh memory, whose pages
    would fault on first touch. Each payload's tensors are copied once, straight into
    their place in the shard (:func:`~kvspec.tensors.reshard.landing_region`), and
    :func:`~kvspec.tensors.reshard.receive` checks and places the shipments as always
    [RESHARD-3], finding those in place. Fresh memory is used instead when the shard does
    not fit the buffer or lives on another device; a payload whose place is not one view
    (its edge carries some of the shard's tokens [SLICE-4]) or that does not fit its place
    goes through fresh memory and is placed, or refused, by receive. On a refusal the
    buffer may hold part of the shard; nothing is returned from it."""
    pairs = list(received)
    for src, payload in pairs:
        require_int("source rank", src, minimum=0)
        if not isinstance(payload, Payload):
            raise ValueError(f"expected a Payload from source rank {src}, got {show(payload)}")
    _check_agreement(dst, pairs, tokens=plan.seq_len is not None)
    _check_layers(plan, dst, pairs)
    out = _landing_shard(plan, dst, pairs, landing)
    if out is None:
        shipments = [shipment_from_payload(plan, src, dst, p) for src, p in pairs]
        return receive(plan, dst, shipments)
    shipments = [_landed_shipment(plan, src, dst, p, out) for src, p in pairs]
    return receive(plan, dst, shipments, out=out)


def _landing_shard(
    plan: TransferPlan,
    dst: int,
    pairs: list[tuple[int, Payload]],
    landing: torch.Tensor | None,
) -> torch.Tensor | None:
    """Receiver ``dst``'s shard as a view of the first bytes of ``landing``, or None where
    the buffer does not apply (none given, no payload, too small, another device or
    dtype than the payloads') [PAYLOAD-3]."""
    if landing is None:
        return None
    if (
        not isinstance(landing, torch.Tensor)
        or landing.dtype != torch.uint8
        or landing.dim() != 1
        or not landing.is_contiguous()
    ):
        shown = (
            f"{landing.dtype} {list(landing.shape)}"
            if isinstance(landing, torch.Tensor)
            else show(landing)
        )
        raise ValueError(f"landing must be a contiguous 1-d uint8 tensor, got {shown}")
    if not pairs:
        return None
    first = pairs[0][1]
    dtype = torch_dtype(plan.model.dtype)
    if any(p.device != landing.device or p.dtype != plan.model.dtype for _, p in pairs):
        return None
    shape = landing_shape(plan, dst, first.seq_len)
    if shape is None:
        return None
    need = math.prod(shape) * dtype.itemsize
    if need > landing.numel():
        return None
    return landing[:need].view(dtype).view(shape)


def _landed_shipment(
    plan: TransferPlan, src: int, dst: int, payload: Payload, out: torch.Tensor
) -> Shipment:
    """The shipment of ``payload``, its tensors copied once into their place in receiver
    ``dst``'s shard ``out`` (receiver-side slicing cut first, as views [SLICE-3]); or,
    where there is no such place or the payload does not fit it, copied into fresh
    memory for :func:`~kvspec.tensors.reshard.receive` to place or refuse with its
    reasons [PAYLOAD-2, RESHARD-3]."""
    if src not in plan.sources_of(dst) or payload.head_slice.target_rank != dst:
        return shipment_from_payload(plan, src, dst, payload)
    edge = plan.edge(src, dst)
    region = landing_region(plan, edge, out)
    if region is None:
        return shipment_from_payload(plan, src, dst, payload)
    try:
        cut = slice_payload(payload, dst)
    except ValueError:
        return shipment_from_payload(plan, src, dst, payload)  # refused there, with reasons
    if not cut._fits(region):
        return shipment_from_payload(plan, src, dst, payload)
    return shipment_from_payload(plan, src, dst, cut, out=region)


def merge_payloads(
    plan: TransferPlan, dst: int, received: Iterable[tuple[int, Payload]]
) -> Payload:
    """Receiver ``dst``'s shard from ``(source rank, payload)`` pairs [PAYLOAD-3].

    The pairs may come in any order (``dict.items()`` of payloads by source rank, or
    as they arrived); the result does not depend on it.
    """
    pairs = list(received)
    if not pairs and not plan.sources_of(dst):
        raise ValueError(
            f"target rank {dst} has no edge in this plan (it holds no token of the request, or "
            "the request lives on another DP group): there is nothing to merge [PAYLOAD-3]"
        )
    kv = merge_to_request_kv(plan, dst, pairs)
    first = min(pairs, key=lambda pair: pair[0])[1]
    owner = plan.owner("target", dst)
    fp8 = kv.scales is not None
    layers: dict[str, list[torch.Tensor | None]] = {
        name: [None] * plan.model.num_layers for name in TENSOR_FIELDS
    }
    for i, layer in enumerate(owner.layers):
        for j in range(plan.model.kv_tensors):
            layers[CACHE_FIELDS[j]][layer] = kv.data[i, j]
            if kv.scales is not None:
                layers[SCALE_FIELDS[j]][layer] = kv.scales[i, j]
    tokens = None
    if plan.seq_len is not None:
        tokens = owner.tokens if owner.tokens is not None else Tokens.span(0, plan.seq_len)
    marker = HeadSlice(
        target_rank=dst,
        from_tp=plan.source.tp,
        to_tp=plan.target.tp,
        offset_in_shard=0,
        num_slices=1,
        applied=True,
        side="receiver",
        tokens=tokens,
    )
    return replace(
        first,
        seq_len=kv.seq_len,
        key_cache=tuple(layers["key_cache"]),
        value_cache=tuple(layers["value_cache"]),
        key_scale=tuple(layers["key_scale"]) if fp8 else None,
        value_scale=tuple(layers["value_scale"]) if fp8 else None,
        head_slice=marker,
    )


def _check_agreement(dst: int, pairs: list[tuple[int, Payload]], *, tokens: bool = False) -> None:
    """Refuse shards that disagree on any fact of one request, naming every value; with
    token shards each payload carries its own edge's tokens, so seq_len may differ."""
    problems = []
    for fact in _AGREED:
        if tokens and fact == "seq_len":
            continue
        values = {src: getattr(p, fact) for src, p in sorted(pairs, key=lambda pair: pair[0])}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"source rank {src}: {v!r}" for src, v in values.items())
            problems.append(f"{fact} ({shown})")
    if problems:
        raise ValueError(
            f"payloads to target rank {dst} disagree on " + "; ".join(problems) + " [PAYLOAD-3]"
        )


def _check_layers(plan: TransferPlan, dst: int, pairs: list[tuple[int, Payload]]) -> None:
    """A layer present on one shard and missing on another that should carry it [PAYLOAD-3]."""
    expected = {e.src: tuple(e.layers) for e in plan.edges_to(dst)}
    present = {src: set(p.layers) for src, p in pairs}
    for src, p in sorted(pairs, key=lambda pair: pair[0]):
        if src not in expected:
            continue  # refused with its reason by shipment_from_payload [RESHARD-3]
        missing = sorted(set(expected[src]) - set(p.layers))
        for layer in missing:
            holders = sorted(s for s, layers in present.items() if layer in layers and s != src)
            if holders:
                raise ValueError(
                    f"layer {layer} is present on the shard of source rank {holders[0]} and "
                    f"missing on the shard of source rank {src}, whose edge to target rank "
                    f"{dst} carries layers {layer_span(expected[src])} [PAYLOAD-3]"
                )
