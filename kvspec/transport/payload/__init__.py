"""The payload: one edge's KV for one request (or one chunk of it), in the compatible dict form.

A :class:`Payload` is the form of a :class:`~kvspec.tensors.reshard.Shipment` that crosses
process boundaries [PAYLOAD-2]. Its dict form is the one connectors in the field
exchange [PAYLOAD-1]::

    {
      "request_id": "req-7",
      "layer_blocks": {
        "key_cache":   [None, None, <[seq, heads, head_dim]>, <...>],  # one per global layer
        "value_cache": [None, None, <[seq, heads, head_dim]>, <...>],  # MLA: all None
        "key_scale":   [None, None, <0-d float32>, <...>],             # fp8 only
        "value_scale": [None, None, <0-d float32>, <...>],             # fp8 only; MLA: None
      },
      "block_ids": [3, 9],            # the sender's blocks holding these tokens
      "metadata": {
        "block_size": 16, "num_layers": 4, "dtype": "bfloat16", "seq_len": 20,
        "tp_head_slice": {"target_rank": 1, "from_tp": 2, "to_tp": 4,
                          "offset_in_shard": 1, "num_slices": 2,
                          "applied": True, "side": "sender"},
        "chunk": {"chunk_id": 0, "token_start": 0, "final": True},   # optional
      },
    }

Caches are token-major ``[seq, heads, head_dim]`` (an MLA latent is one "head" of
width latent_dim [MODEL-2]) and ``None`` for every layer the edge does not carry.
fp8 scales [DTYPE-3] travel beside the caches as 0-d float32 tensors, one per
present cache, so they stay raw bits on every path (JSON would turn them into
decimal text); for other dtypes the two scale lists are absent. ``chunk`` says which
token range of the request the payload holds [CHUNK-1]; without it the payload is
the whole request.

Merging several senders' payloads into one receiver shard first checks that they
agree, then hands them to :func:`kvspec.tensors.reshard.receive` as shipments, so placement

This package is the PAYLOAD family's rules (:data:`CLAUSES`, below) and its public names,
one module a clause:

- :mod:`~kvspec.transport.payload.form`: the :class:`Payload`, its :class:`Chunk`, its
  dict form and every refusal of one that breaks it [PAYLOAD-1];
- :mod:`~kvspec.transport.payload.shipments`: a payload as one edge's shipment and back,
  and receiver-side slicing (:func:`payload_from_shipment`,
  :func:`shipment_from_payload`, :func:`slice_payload`) [PAYLOAD-2, SLICE-3];
- :mod:`~kvspec.transport.payload.merging`: several senders' payloads merged into a
  receiver's shard (:func:`merge_payloads`, :func:`merge_to_request_kv`) [PAYLOAD-3].
"""

from __future__ import annotations

from kvspec.core.clause import Clause, must, refuses
from kvspec.transport.payload.form import (
    CACHE_FIELDS,
    HEAD_AXIS,
    SCALE_FIELDS,
    TENSOR_FIELDS,
    Chunk,
    Layers,
    Payload,
    payload_equal,
)
from kvspec.transport.payload.merging import merge_payloads, merge_to_request_kv
from kvspec.transport.payload.shipments import (
    payload_from_shipment,
    shipment_from_payload,
    slice_payload,
)

__all__ = [
    "CACHE_FIELDS",
    "CLAUSES",
    "HEAD_AXIS",
    "SCALE_FIELDS",
    "TENSOR_FIELDS",
    "Chunk",
    "Layers",
    "Payload",
    "merge_payloads",
    "merge_to_request_kv",
    "payload_equal",
    "payload_from_shipment",
    "shipment_from_payload",
    "slice_payload",
]


CLAUSES = (
    Clause(
        "PAYLOAD-1",
        "The payload and its dict form",
        "A payload has request_id, layer_blocks (key_cache and value_cache: one "
        "[seq_len, heads, head_dim] tensor or None per global layer; fp8 only: key_scale and "
        "value_scale, a 0-d float32 tensor exactly where the matching cache is present), "
        "block_ids (integers >= 0, the sender's blocks) and metadata (block_size >= 1, "
        "num_layers = the length of each list, dtype, seq_len >= 0, tp_head_slice [SLICE-3], "
        "optional chunk [CHUNK-1]). At least one layer is present; every present tensor has "
        "the dtype, seq_len and one shape, on one device; a layer has K and V (MHA/GQA) or "
        "only K (the MLA latent), the same for every present layer. Unknown or missing keys "
        "and anything else are refused, naming the value.",
        obligations=(
            refuses("a missing or unknown key in the payload's metadata, marker or chunk"),
            refuses(
                "a present tensor whose dtype, seq_len or shape disagrees with the metadata or the "
                "other tensors"
            ),
            refuses("fp8 scales missing where the cache is present, or present where it is absent"),
            refuses("block_size < 1, a negative block id, or an empty request id"),
        ),
    ),
    Clause(
        "PAYLOAD-2",
        "A payload is one edge's shipment",
        "The payload on edge s->t carries exactly the edge's layers (None elsewhere), the "
        "model's num_layers and dtype, K and V for MHA/GQA or the latent alone for MLA, and "
        "the edge's tp_head_slice marker; converting a shipment to a payload and back gives "
        "the same shipment.",
        obligations=(
            refuses("a payload whose num_layers, dtype or K/V count differ from the model's"),
            refuses("a payload carrying a layer outside its edge's layers"),
        ),
    ),
    Clause(
        "PAYLOAD-3",
        "Merging payloads checks agreement, then places by the plan",
        "The payloads a receiver merges must agree on request_id, seq_len (when no stage has "
        "token shards; else each carries its edge's tokens [SLICE-4]), num_layers, "
        "dtype, block_size and chunk, and each must carry exactly its edge's layers: a layer "
        "present on one shard and missing on another that should carry it is refused. They "
        "are then placed by RESHARD-3 in source-rank order, so arrival order does not matter. "
        "The result is the receiver's shard as a payload: its layers (and tokens), marker "
        "num_slices 1 applied by the receiver, the lowest source rank's block_ids.",
        obligations=(
            must(
                "merging in any arrival order gives the receiver's shard, placed in source-rank "
                "order and marked num_slices 1, applied by the receiver"
            ),
            refuses("shards that disagree on request_id alone"),
            refuses("shards that disagree on seq_len alone"),
            refuses("shards that disagree on num_layers alone"),
            refuses("shards that disagree on dtype alone"),
            refuses("shards that disagree on block_size alone"),
            refuses("shards that disagree on chunk alone"),
            refuses("a layer present on one shard and missing on another that should carry it"),
            must("the merged payload carries the lowest source rank's block_ids"),
        ),
    ),
)
