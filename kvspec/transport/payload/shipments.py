"""A payload is one edge's shipment: each into the other, and receiver-side slicing
[PAYLOAD-2, SLICE-3].

:func:`payload_from_shipment` puts a :class:`~kvspec.tensors.reshard.Shipment`'s KV at
its edge's global layers (views; nothing is copied); :func:`shipment_from_payload`
takes a received payload back to the shipment of its edge, refusing one whose sender is
not a source of the receiver, or whose layers, dtype or tensors per layer are not the
edge's and the model's [RESHARD-3]. :func:`slice_payload` cuts a whole payload to the
receiver's heads where the sender left the slicing to it [SLICE-3].
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch

from kvspec.tensors.dtypes import FP8_DTYPES, dtype_name
from kvspec.tensors.reshard import Shipment
from kvspec.tensors.slicing import apply_head_slice
from kvspec.topology.plan import TransferPlan
from kvspec.transport.payload.form import (
    CACHE_FIELDS,
    HEAD_AXIS,
    SCALE_FIELDS,
    TENSOR_FIELDS,
    Chunk,
    Layers,
    Payload,
)


def payload_from_shipment(
    plan: TransferPlan,
    shipment: Shipment,
    request_id: str,
    *,
    block_size: int = 16,
    block_ids: Iterable[int] = (),
    chunk: Chunk | None = None,
) -> Payload:
    """The payload of one shipment: its edge's layers, None elsewhere [PAYLOAD-2].

    Tensors are views of the shipment's KV; nothing is copied.
    """
    edge, kv = shipment.edge, shipment.kv
    layers: dict[str, list[torch.Tensor | None]] = {
        name: [None] * plan.model.num_layers for name in TENSOR_FIELDS
    }
    for i, layer in enumerate(edge.layers):
        for j in range(plan.model.kv_tensors):
            layers[CACHE_FIELDS[j]][layer] = kv.data[i, j]
            if kv.scales is not None:
                layers[SCALE_FIELDS[j]][layer] = kv.scales[i, j]
    fp8 = plan.model.dtype in FP8_DTYPES
    return Payload(
        request_id=request_id,
        key_cache=tuple(layers["key_cache"]),
        value_cache=tuple(layers["value_cache"]),
        block_ids=tuple(block_ids),
        block_size=block_size,
        dtype=dtype_name(kv.data.dtype),
        seq_len=kv.seq_len,
        head_slice=shipment.marker,
        chunk=Chunk() if chunk is None else chunk,
        key_scale=tuple(layers["key_scale"]) if fp8 else None,
        value_scale=tuple(layers["value_scale"]) if fp8 else None,
    )


def shipment_from_payload(
    plan: TransferPlan,
    src: int,
    dst: int,
    payload: Payload,
    *,
    out: torch.Tensor | None = None,
) -> Shipment:
    """The shipment a payload from ``src`` to ``dst`` stands for [PAYLOAD-2, RESHARD-3];
    its tensors copied into ``out`` when given (:meth:`Payload.to_request_kv`)."""
    if src not in plan.sources_of(dst):
        raise ValueError(
            f"target rank {dst} got a payload from source rank {src}, which is not one of its "
            f"plan sources {list(plan.sources_of(dst))} [RESHARD-3]"
        )
    edge = plan.edge(src, dst)
    model = plan.model
    where = f"payload from source rank {src} to target rank {dst}"
    if payload.num_layers != model.num_layers or payload.dtype != model.dtype:
        raise ValueError(
            f"{where} has num_layers={payload.num_layers}, dtype={payload.dtype!r}; the model "
            f"has num_layers={model.num_layers}, dtype={model.dtype!r} [PAYLOAD-2]"
        )
    if payload.kv_tensors != model.kv_tensors:
        raise ValueError(
            f"{where} carries {payload.kv_tensors} tensor(s) per layer; a {model.attention} "
            f"model has {model.kv_tensors} [PAYLOAD-2]"
        )
    if payload.layers != tuple(edge.layers):
        raise ValueError(
            f"{where} carries layers {layer_span(payload.layers)} but its edge carries "
            f"{layer_span(tuple(edge.layers))} [PAYLOAD-2]"
        )
    return Shipment(edge, payload.head_slice, payload.to_request_kv(out=out))


def slice_payload(payload: Payload, my_rank: int) -> Payload:
    """Receiver-side slicing of a whole payload [SLICE-3].

    A payload marked for another rank is refused; an applied slice is returned as is
    (the same object), so slicing twice is slicing once.
    """
    marker = payload.head_slice
    # Refuses a payload marked for another rank, whether or not its slice is applied.
    apply_head_slice(payload._first(), marker, my_rank=my_rank, head_axis=HEAD_AXIS)
    if marker.applied:
        return payload

    def cut(values: Layers) -> Layers:
        out = []
        for t in values:
            if t is not None:
                t, _ = apply_head_slice(t, marker, my_rank=my_rank, head_axis=HEAD_AXIS)
            out.append(t)
        return tuple(out)

    return replace(
        payload,
        key_cache=cut(payload.key_cache),
        value_cache=cut(payload.value_cache),
        head_slice=replace(marker, applied=True, side="receiver"),
    )


def layer_span(layers: tuple[int, ...]) -> str:
    if not layers:
        return "[]"
    if layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return str(list(layers))
