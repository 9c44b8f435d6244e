"""Valid inputs the error cases of several families edit one fact of: a model, a paged
cache, a key, a payload and its wire header.
"""

from __future__ import annotations

import copy
from typing import Any

M = {"num_layers": 4, "num_kv_heads": 4, "head_dim": 8}


PAGED = {
    "layout": "flash_attn",
    "num_layers": 2,
    "num_blocks": 8,
    "block_size": 16,
    "heads": 2,
    "head_dim": 8,
    "dtype": "bfloat16",
}


PAGED_FP8 = {**PAGED, "dtype": "float8_e5m2"}


KEY = {"from_stage": 0, "chunk_id": 0, "from_rank": 0, "to_rank": 0}


KV = {"zeros": [3, 2, 4], "dtype": "bfloat16"}


FP8 = {"zeros": [3, 2, 4], "dtype": "float8_e4m3fn"}


PAYLOAD: dict[str, Any] = {
    "request_id": "req_1",
    "layer_blocks": {"key_cache": [None, KV], "value_cache": [None, KV]},
    "block_ids": [7],
    "metadata": {
        "block_size": 16,
        "num_layers": 2,
        "dtype": "bfloat16",
        "seq_len": 3,
        "tp_head_slice": {
            "target_rank": 0,
            "from_tp": 1,
            "to_tp": 1,
            "offset_in_shard": 0,
            "num_slices": 1,
            "applied": True,
            "side": "sender",
        },
    },
}


WIRE_HEADER: dict[str, Any] = {
    "format": "kvspec.payload",
    "version": 1,
    "request_id": "r",
    "block_ids": [],
    "metadata": {**PAYLOAD["metadata"], "num_layers": 1, "dtype": "float32", "seq_len": 1},
    "tensors": [
        {"field": "key_cache", "layer": 0, "dtype": "float32", "shape": [1, 1, 1]},
        {"field": "value_cache", "layer": 0, "dtype": "float32", "shape": [1, 1, 1]},
    ],
}


MERGE = {"source": {"tp": 4}, "target": {"tp": 2}, "model": M, "dst": 0}


def wire_message(**changes: Any) -> dict[str, Any]:
    """A valid one-layer float32 message, with ``a__b=value`` edits to its header."""
    header = copy.deepcopy(WIRE_HEADER)
    for path, value in changes.items():
        node: Any = header  # nested JSON: dicts and lists
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return {"header": header, "frame_bytes": [4, 4]}
