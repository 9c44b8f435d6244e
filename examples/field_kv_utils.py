"""A module shaped like the KV-transfer helpers engines in the field ship.

It is NOT part of kvspec: it stands for "your implementation" in the adapter examples
(the README's and docs/conformance.md's) and in the tests. It follows the API the design describes
(``KVTPTopology``, rank routing by TP ratio, ``_``-joined keys, a port formula,
head slicing on dim 1, merging by concatenation in the given order, layout reading
by shape) and keeps that API's known limits on purpose: its topology has no head
count, so it cannot express replicated heads; it merges shards in arrival order;
it only warns about a payload marked for another rank; it carries no fp8 scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

KV_TRANSFER_PORT_OFFSET = 100
KV_RANK_PORT_STRIDE = 16


@dataclass(frozen=True)
class KVTPTopology:
    source_tp_size: int
    target_tp_size: int
    local_rank: int

    def __post_init__(self) -> None:
        if self.source_tp_size <= 0 or self.target_tp_size <= 0:
            raise ValueError(
                f"TP sizes must be positive: {self.source_tp_size}, {self.target_tp_size}"
            )
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")

    @property
    def is_heterogeneous(self) -> bool:
        return self.source_tp_size != self.target_tp_size

    @property
    def ratio(self) -> int:
        big, small = (
            max(self.source_tp_size, self.target_tp_size),
            min(self.source_tp_size, self.target_tp_size),
        )
        return big // small


def validate_kv_tp_topology(topo: KVTPTopology) -> None:
    big, small = (
        max(topo.source_tp_size, topo.target_tp_size),
        min(topo.source_tp_size, topo.target_tp_size),
    )
    if big % small:
        raise ValueError(f"TP sizes must divide: {topo.source_tp_size} and {topo.target_tp_size}")


def get_kv_target_ranks(topo: KVTPTopology) -> list[int]:
    """Receivers of sender ``local_rank`` (fan-in: one; fan-out: ``ratio`` consecutive)."""
    validate_kv_tp_topology(topo)
    if topo.source_tp_size >= topo.target_tp_size:
        return [topo.local_rank // topo.ratio]
    return [topo.local_rank * topo.ratio + i for i in range(topo.ratio)]


def get_kv_source_ranks(topo: KVTPTopology) -> list[int]:
    """Senders of receiver ``local_rank``: every source rank that maps to it."""
    validate_kv_tp_topology(topo)
    if topo.source_tp_size >= topo.target_tp_size:
        return [topo.local_rank * topo.ratio + i for i in range(topo.ratio)]
    return [topo.local_rank // topo.ratio]


def get_kv_connector_key(
    req_id: str, from_stage: int | str, chunk_id: int, from_rank: int, to_rank: int
) -> str:
    return f"{req_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"


def kv_zmq_port(base_port: int, from_stage: int, local_rank: int = 0) -> int:
    return base_port + KV_TRANSFER_PORT_OFFSET + local_rank * KV_RANK_PORT_STRIDE + from_stage


def slice_kv_tensor_heads(
    tensor: torch.Tensor | None, offset_in_shard: int, num_slices: int
) -> torch.Tensor | None:
    """Slice ``offset_in_shard`` of ``num_slices`` equal parts of dim 1 (heads)."""
    if tensor is None:
        return None
    heads = tensor.shape[1]
    if heads % num_slices:
        raise ValueError(f"cannot split {heads} heads into {num_slices} slices")
    width = heads // num_slices
    return tensor[:, offset_in_shard * width : (offset_in_shard + 1) * width].contiguous()


def slice_layer_blocks(
    layer_blocks: dict[str, list], offset_in_shard: int, num_slices: int
) -> dict[str, list]:
    return {
        name: [
            slice_kv_tensor_heads(t, offset_in_shard, num_slices)
            for t in layer_blocks.get(name, [])
        ]
        for name in ("key_cache", "value_cache")
    }


def merge_received_rank_shards(payloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Concatenate the payloads' tensors on dim 1, in the order given."""
    if not payloads:
        return None
    if len(payloads) == 1:
        return payloads[0]
    merged = {k: v for k, v in payloads[0].items() if k != "layer_blocks"}
    merged["layer_blocks"] = {}
    for name in ("key_cache", "value_cache"):
        per_layer = zip(*(p["layer_blocks"][name] for p in payloads), strict=True)
        merged["layer_blocks"][name] = [
            None
            if all(t is None for t in ts)
            else torch.cat([t for t in ts if t is not None], dim=1)
            for ts in per_layer
        ]
    return merged


def slice_received_rank_shard(payload: dict[str, Any], topo: KVTPTopology) -> dict[str, Any]:
    """Cut this rank's heads out of a whole sender shard, unless already sliced."""
    if topo.target_tp_size <= topo.source_tp_size:
        return payload
    marker = payload.get("metadata", {}).get("tp_head_slice") or {}
    if marker.get("applied"):
        if marker.get("target_rank") not in (None, topo.local_rank):
            print(f"warning: payload for rank {marker['target_rank']} at rank {topo.local_rank}")
        return payload
    offset = topo.local_rank % topo.ratio
    metadata = dict(payload.get("metadata", {}))
    metadata["tp_head_slice"] = {
        "applied": True,
        "side": "receiver",
        "target_rank": topo.local_rank,
        "offset_in_shard": offset,
        "num_slices": topo.ratio,
    }
    return {
        **payload,
        "layer_blocks": slice_layer_blocks(payload["layer_blocks"], offset, topo.ratio),
        "metadata": metadata,
    }


def normalize_layer_kv(
    layer_kv: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) of one layer's paged cache, guessing the layout from the shape."""
    if isinstance(layer_kv, tuple):
        return layer_kv
    if layer_kv.shape[0] == 2:
        return layer_kv[0], layer_kv[1]
    if layer_kv.shape[1] == 2:
        return layer_kv[:, 0], layer_kv[:, 1]
    raise ValueError(f"unrecognised KV cache shape {tuple(layer_kv.shape)}")


def build_rank_aware_send_keys(
    request_id: str, from_stage: int, to_stage: int, topo: KVTPTopology
) -> list[str]:
    if topo.source_tp_size <= 1 and topo.target_tp_size <= 1:
        return [f"omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}"]
    return [
        get_kv_connector_key(request_id, from_stage, 0, topo.local_rank, r)
        for r in get_kv_target_ranks(topo)
    ]


def build_rank_aware_recv_keys(
    request_id: str, from_stage: int, to_stage: int, topo: KVTPTopology
) -> list[tuple[str, int | None]]:
    if topo.source_tp_size <= 1 and topo.target_tp_size <= 1:
        return [(f"omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}", None)]
    return [
        (get_kv_connector_key(request_id, from_stage, 0, r, topo.local_rank), r)
        for r in get_kv_source_ranks(topo)
    ]
