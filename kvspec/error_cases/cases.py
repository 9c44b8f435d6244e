"""Invalid inputs as data: what must be refused, by which clause, with which message.

Each :class:`ErrorCase` names an operation of
:data:`~kvspec.error_cases.operations.OPERATIONS` and its arguments as plain data (so it
can be exported as a golden vector and replayed through any adapter), the clause that
refuses it, and a regular expression the reference's message must match — the
offending values are part of every pattern.

:data:`ERROR_CASES` keeps the order the cases were written in, not grouped by clause
family: the golden ``errors`` vectors are exported in this order, so reordering the
table changes the shipped vectors. The comments in it say where the concern changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kvspec.error_cases.operations import OPERATIONS


@dataclass(frozen=True)
class ErrorCase:
    """One invalid input: ``OPERATIONS[op](args)`` must raise ``ValueError`` matching ``match``."""

    id: str
    clause: str
    op: str
    args: dict[str, Any] = field(hash=False)
    match: str

    def run_reference(self) -> object:
        """Run the reference operation (it is expected to raise)."""
        return OPERATIONS[self.op](self.args)


_M = {"num_layers": 4, "num_kv_heads": 4, "head_dim": 8}
_PAGED = {
    "layout": "flash_attn",
    "num_layers": 2,
    "num_blocks": 8,
    "block_size": 16,
    "heads": 2,
    "head_dim": 8,
    "dtype": "bfloat16",
}
_PAGED_FP8 = {**_PAGED, "dtype": "float8_e5m2"}
_KEY = {"from_stage": 0, "chunk_id": 0, "from_rank": 0, "to_rank": 0}
_KV = {"zeros": [3, 2, 4], "dtype": "bfloat16"}
_FP8 = {"zeros": [3, 2, 4], "dtype": "float8_e4m3fn"}
_PAYLOAD: dict[str, Any] = {
    "request_id": "req_1",
    "layer_blocks": {"key_cache": [None, _KV], "value_cache": [None, _KV]},
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
_WIRE_HEADER: dict[str, Any] = {
    "format": "kvspec.payload",
    "version": 1,
    "request_id": "r",
    "block_ids": [],
    "metadata": {**_PAYLOAD["metadata"], "num_layers": 1, "dtype": "float32", "seq_len": 1},
    "tensors": [
        {"field": "key_cache", "layer": 0, "dtype": "float32", "shape": [1, 1, 1]},
        {"field": "value_cache", "layer": 0, "dtype": "float32", "shape": [1, 1, 1]},
    ],
}
_MERGE = {"source": {"tp": 4}, "target": {"tp": 2}, "model": _M, "dst": 0}


def _wire(**changes: Any) -> dict[str, Any]:
    """A valid one-layer float32 message, with ``a__b=value`` edits to its header."""
    header = copy.deepcopy(_WIRE_HEADER)
    for path, value in changes.items():
        node: Any = header  # nested JSON: dicts and lists
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return {"header": header, "frame_bytes": [4, 4]}


ERROR_CASES: tuple[ErrorCase, ...] = (
    # stages, ranks, heads and transfer plans [STAGE, HEAD, PLAN, MODEL-3]
    ErrorCase("tp-zero", "STAGE-1", "stage", {"tp": 0}, r"tp must be >= 1, got 0"),
    ErrorCase("pp-negative", "STAGE-1", "stage", {"tp": 2, "pp": -1}, r"pp must be >= 1, got -1"),
    ErrorCase("tp-not-int", "STAGE-1", "stage", {"tp": 2.5}, r"tp must be an integer, got 2\.5"),
    ErrorCase(
        "rank-out-of-range",
        "STAGE-1",
        "rank_coords",
        {"stage": {"tp": 4, "pp": 2}, "rank": 8},
        r"rank 8 is out of range: valid ranks are 0\.\.7",
    ),
    ErrorCase(
        "tp-rank-out-of-range",
        "HEAD-1",
        "owned_heads",
        {"num_kv_heads": 8, "tp": 4, "tp_rank": 4},
        r"tp_rank 4 is out of range: valid ranks are 0\.\.3",
    ),
    ErrorCase(
        "heads-not-divisible-by-tp",
        "HEAD-1",
        "owned_heads",
        {"num_kv_heads": 6, "tp": 4, "tp_rank": 0},
        r"6 KV heads cannot be split over TP 4.*6 % 4 = 2",
    ),
    ErrorCase(
        "tp-not-divisible-by-heads",
        "HEAD-2",
        "owned_heads",
        {"num_kv_heads": 3, "tp": 8, "tp_rank": 0},
        r"3 KV heads cannot be replicated over TP 8.*8 % 3 = 2",
    ),
    ErrorCase(
        "tp-4-6-target-cannot-hold-heads",
        "PLAN-1",
        "transfer",
        {"source": {"tp": 4}, "target": {"tp": 6}, "model": {**_M, "num_kv_heads": 8}},
        r"target TP6: 8 KV heads cannot be split over TP 6",
    ),
    ErrorCase(
        "tp-6-4-source-cannot-hold-heads",
        "PLAN-1",
        "transfer",
        {"source": {"tp": 6}, "target": {"tp": 4}, "model": {**_M, "num_kv_heads": 4}},
        r"source TP6: 4 KV heads cannot be replicated over TP 6",
    ),
    ErrorCase(
        "target-heads-invalid",
        "HEAD-1",
        "transfer",
        {"source": {"tp": 2}, "target": {"tp": 8}, "model": {**_M, "num_kv_heads": 12}},
        r"12 KV heads cannot be split over TP 8",
    ),
    ErrorCase(
        "unknown-policy",
        "PLAN-4",
        "transfer",
        {"source": {"tp": 2}, "target": {"tp": 2}, "model": _M, "policy": "random"},
        r"policy must be one of 'lowest', 'balanced'; got 'random'",
    ),
    ErrorCase(
        "transfer-rank-out-of-range",
        "STAGE-1",
        "transfer",
        {
            "source": {"tp": 2, "pp": 2},
            "target": {"tp": 2},
            "model": _M,
            "rank": {"side": "source", "rank": 4},
        },
        r"rank 4 is out of range: valid ranks are 0\.\.3",
    ),
    ErrorCase(
        "transfer-mismatched-models",
        "MODEL-3",
        "transfer",
        {
            "source": {"tp": 2},
            "target": {"tp": 2},
            "model": _M,
            "target_model": {**_M, "num_kv_heads": 8},
        },
        r"num_kv_heads: source 4 != target 8",
    ),
    # layers, models and dtypes [LAYER, MODEL, DTYPE-1]
    ErrorCase(
        "fewer-layers-than-pp",
        "LAYER-1",
        "layer_ranges",
        {"stage": {"tp": 1, "pp": 4}, "num_layers": 3},
        r"3 layers cannot be partitioned over PP 4",
    ),
    ErrorCase(
        "partition-wrong-length",
        "LAYER-2",
        "stage",
        {"tp": 1, "pp": 2, "layer_partition": [4]},
        r"layer_partition \[4\] has 1 entries.*pp=2",
    ),
    ErrorCase(
        "partition-zero-entry",
        "LAYER-2",
        "stage",
        {"tp": 1, "pp": 2, "layer_partition": [4, 0]},
        r"layer_partition\[1\] must be >= 1, got 0",
    ),
    ErrorCase(
        "partition-wrong-sum",
        "LAYER-2",
        "layer_ranges",
        {"stage": {"tp": 1, "pp": 2, "layer_partition": [3, 3]}, "num_layers": 7},
        r"covers 6 layers but the model has num_layers=7",
    ),
    ErrorCase(
        "model-zero-layers",
        "MODEL-1",
        "model",
        {**_M, "num_layers": 0},
        r"num_layers must be >= 1, got 0",
    ),
    ErrorCase(
        "model-unknown-attention",
        "MODEL-1",
        "model",
        {**_M, "attention": "sparse"},
        r"attention must be one of 'mha', 'mla'; got 'sparse'",
    ),
    ErrorCase(
        "model-unknown-dtype",
        "DTYPE-1",
        "model",
        {**_M, "dtype": "int8"},
        r"dtype must be one of .*got 'int8'",
    ),
    ErrorCase(
        "scale-format-without-fp8",
        "MODEL-1",
        "model",
        {**_M, "scale_format": "per_layer"},
        r"scale_format is only for fp8 dtypes.*got 'per_layer'",
    ),
    ErrorCase(
        "mla-with-heads",
        "MODEL-2",
        "model",
        {**_M, "attention": "mla"},
        r"MLA cache has no head axis.*num_kv_heads=4",
    ),
    ErrorCase(
        "mismatched-model-facts",
        "MODEL-3",
        "compatible",
        {"source": _M, "target": {**_M, "num_layers": 5, "head_dim": 16, "dtype": "float16"}},
        r"disagree on 3 model fact\(s\)(?s:.*)num_layers: source 4 != target 5"
        r"(?s:.*)head_dim: source 8 != target 16"
        r"(?s:.*)dtype: source 'bfloat16' != target 'float16'",
    ),
    # head slices [SLICE-1]
    ErrorCase(
        "slice-offset-out-of-range",
        "SLICE-1",
        "head_slice",
        {"target_rank": 0, "from_tp": 2, "to_tp": 4, "offset_in_shard": 2, "num_slices": 2},
        r"offset_in_shard must be in 0\.\.1 \(num_slices=2\), got 2",
    ),
    ErrorCase(
        "slice-applied-without-side",
        "SLICE-3",
        "head_slice",
        {
            "target_rank": 0,
            "from_tp": 2,
            "to_tp": 4,
            "offset_in_shard": 0,
            "num_slices": 2,
            "applied": True,
        },
        r"side must be one of 'sender', 'receiver'; got None",
    ),
    # cache layouts [LAYOUT]
    ErrorCase(
        "layout-unknown-name",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [2, 3, 4, 2, 8], "layout": "vllm_paged"},
        r"unknown cache layout 'vllm_paged'; the layouts are flash_attn, flash_attn_hnd, ",
    ),
    ErrorCase(
        "layout-kv-axis-not-2",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [3, 4, 16, 2, 8], "layout": "flash_attn"},
        r"K/V axis of size 2 at dim 0; got tensor of shape \[3, 4, 16, 2, 8\]",
    ),
    ErrorCase(
        "layout-tuple-of-three",
        "LAYOUT-1",
        "cache_shape",
        {"shapes": [[3, 16, 2, 8]] * 3, "layout": "kv_tuple"},
        r"kv_tuple cache .* is a tuple of 2 tensors; got tuple of 3",
    ),
    ErrorCase(
        "layout-stated-heads-differ",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [3, 2, 16, 2, 8], "layout": "flashinfer", "heads": 4},
        r"read as flashinfer .* has heads 2 != stated 4",
    ),
    ErrorCase(
        "layout-kv-to-latent",
        "LAYOUT-3",
        "convert_layout",
        {"shape": [2, 3, 16, 1, 8], "source": "flash_attn", "target": "mla"},
        r"layout mla .* holds one latent per layer but the cache holds K and V",
    ),
    ErrorCase(
        "layout-block-size-not-dividing",
        "LAYOUT-3",
        "convert_layout",
        {"shape": [2, 3, 16, 2, 8], "source": "flash_attn", "target": "kv_tuple", "block_size": 32},
        r"cannot re-block 3 blocks of 16 slots \(48 slots\) into blocks of 32",
    ),
    ErrorCase(
        "detect-stacked-two-blocks",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 2, 16, 4, 8], "heads": 4, "head_dim": 8, "block_size": 16},
        r"ambiguous: it fits 2 layouts: flash_attn \(num_blocks=2, block_size=16, heads=4\); "
        r"flashinfer \(num_blocks=2, block_size=16, heads=4\).*name the layout",
    ),
    ErrorCase(
        "detect-heads-equal-block-size",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 5, 4, 4, 8], "heads": 4, "head_dim": 8},
        r"fits 2 layouts: flash_attn .*; flash_attn_hnd .*one of 'flash_attn', 'flash_attn_hnd'",
    ),
    ErrorCase(
        "detect-heads-unstated",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 5, 16, 2, 8]},
        r"flash_attn \(num_blocks=5, block_size=16, heads=2\); "
        r"flash_attn_hnd \(num_blocks=5, block_size=2, heads=16\)",
    ),
    ErrorCase(
        "detect-no-layout-fits",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [3, 3, 16, 4, 8], "heads": 4, "head_dim": 8},
        r"tensor of shape \[3, 3, 16, 4, 8\] with heads=4, head_dim=8 fits no cache layout",
    ),
    # paged caches [PAGED, DTYPE-3]
    ErrorCase(
        "paged-block-id-out-of-range",
        "PAGED-2",
        "gather_request",
        {"cache": _PAGED, "block_ids": [2, 8], "seq_len": 20},
        r"block ids \[8\] \(at positions \[1\]\) are out of range: the cache has 8 blocks, "
        r"so valid ids are 0\.\.7",
    ),
    ErrorCase(
        "paged-negative-block-id",
        "PAGED-2",
        "gather_request",
        {"cache": _PAGED, "block_ids": [-1, 3], "seq_len": 20},
        r"block ids \[-1\] \(at positions \[0\]\) are out of range",
    ),
    ErrorCase(
        "paged-duplicate-block-ids",
        "PAGED-2",
        "scatter_request",
        {"cache": _PAGED, "block_ids": [5, 1, 5], "seq_len": 40},
        r"block ids \[5\] appear more than once in \[5, 1, 5\]",
    ),
    ErrorCase(
        "paged-seq-len-beyond-blocks",
        "PAGED-3",
        "gather_request",
        {"cache": _PAGED, "block_ids": [4, 1], "seq_len": 40},
        r"seq_len 40 needs 3 blocks of 16 but 2 block ids were given \(\[4, 1\]\), which hold "
        r"32 tokens; refusing rather than dropping 8 tokens",
    ),
    ErrorCase(
        "paged-extra-block-ids",
        "PAGED-3",
        "scatter_request",
        {"cache": _PAGED, "block_ids": [4, 1, 0], "seq_len": 20},
        r"seq_len 20 needs 2 blocks of 16 but 3 block ids were given \(\[4, 1, 0\]\); pass "
        r"exactly the first 2",
    ),
    ErrorCase(
        "paged-kv-heads-differ",
        "PAGED-4",
        "scatter_request",
        {"cache": _PAGED, "kv": {"heads": 4}, "block_ids": [0], "seq_len": 3},
        r"KV of shape \[2, 2, 3, 4, 8\] does not fit .*expected .* \[2, 2, 'seq', 2, 8\]",
    ),
    ErrorCase(
        "paged-fp8-scales-differ",
        "PAGED-5",
        "scatter_request",
        {"cache": _PAGED_FP8, "kv": {"seed": 1}, "block_ids": [0], "seq_len": 3},
        r"layer 0 \(of this cache\) has scales \[.*\] but the KV carries \[.*\]",
    ),
    ErrorCase(
        "paged-fp8-scales-missing",
        "DTYPE-3",
        "scatter_request",
        {"cache": _PAGED_FP8, "kv": {"drop_scales": True}, "block_ids": [0], "seq_len": 3},
        r"KV scattered into a paged float8_e5m2 cache: .* must carry its per-layer K/V scales",
    ),
    ErrorCase(
        "paged-fp8-cache-without-scales",
        "DTYPE-3",
        "paged_cache",
        {**_PAGED_FP8, "scales": False},
        r"a paged float8_e5m2 cache: .* must carry its per-layer K/V scales; none given",
    ),
    # the oracle [ORACLE], then a marker without its offset [SLICE-3]
    ErrorCase(
        "oracle-heads-past-model",
        "ORACLE-4",
        "oracle_kv",
        {"model": _M, "request_id": "r", "heads": [2, 6]},
        r"heads 2\.\.5 reach past the model's 4 heads \(valid: 0\.\.3\)",
    ),
    ErrorCase(
        "oracle-layers-past-model",
        "ORACLE-4",
        "oracle_kv",
        {"model": _M, "request_id": "r", "layers": [0, 5]},
        r"layers 0\.\.4 reach past the model's 4 layers",
    ),
    ErrorCase(
        "oracle-negative-token",
        "ORACLE-4",
        "oracle_kv",
        {"model": _M, "request_id": "r", "tokens": [-1, 3]},
        r"tokens must be a range of step 1 from >= 0, got range\(-1, 3\)",
    ),
    ErrorCase(
        "oracle-request-id-not-str",
        "ORACLE-1",
        "oracle_kv",
        {"model": _M, "request_id": 7},
        r"request_id must be a str, got 7",
    ),
    ErrorCase(
        "oracle-verify-other-token-count",
        "ORACLE-5",
        "verify_oracle",
        {"model": _M, "fill": {"tokens": 3}, "check": {"tokens": [5, 9]}},
        r"has 3 tokens but the token range 5\.\.8 has 4",
    ),
    ErrorCase(
        "slice-marker-without-offset",
        "SLICE-3",
        "head_slice",
        {"target_rank": 0, "from_tp": 2, "to_tp": 4, "num_slices": 2},
        r"include target_rank, from_tp, to_tp, offset_in_shard, num_slices; got .*, "
        r"missing \['offset_in_shard'\]",
    ),
    # keys [KEY]
    ErrorCase(
        "key-request-id-with-legacy-head",
        "KEY-3",
        "rank_aware_key",
        {"request_id": "omni_0_to_1_kv_cache_5", **_KEY},
        r"request_id 'omni_0_to_1_kv_cache_5' begins with a legacy key's head",
    ),
    ErrorCase(
        "key-request-id-empty",
        "KEY-3",
        "rank_aware_key",
        {"request_id": "", **_KEY},
        r"request_id must be a non-empty string, got ''",
    ),
    ErrorCase(
        "key-request-id-control-character",
        "KEY-3",
        "legacy_key",
        {"request_id": "a\tb", "from_stage": 0, "to_stage": 1},
        r"request_id must be printable.*'a\\tb'",
    ),
    ErrorCase(
        "key-negative-rank",
        "KEY-3",
        "rank_aware_key",
        {"request_id": "r", **_KEY, "to_rank": -1},
        r"to_rank must be >= 0, got -1",
    ),
    ErrorCase(
        "key-leading-zero",
        "KEY-3",
        "parse_key",
        {"key": "req_1_01_0_0"},
        r"'req_1_01_0_0' is not a key",
    ),
    ErrorCase(
        "key-three-numbers",
        "KEY-3",
        "parse_key",
        {"key": "req_0_0_0"},
        r"'req_0_0_0' is not a key: expected",
    ),
    ErrorCase(
        "key-non-ascii-digit",
        "KEY-3",
        "parse_key",
        {"key": "req_\u0661_0_0_0"},
        r"is not a key",
    ),
    # ports and deployments [PORT]
    ErrorCase(
        "port-stage-past-rank-stride",
        "PORT-2",
        "port",
        {"purpose": "kv", "base": 50000, "stage": 16},
        r"stage 16 is out of range: with rank_stride 16 stages must be 0\.\.15",
    ),
    ErrorCase(
        "port-rank-into-next-replica",
        "PORT-2",
        "port",
        {"purpose": "kv", "base": 50000, "stage": 0, "rank": 64},
        r"rank 64 is out of range: rank\*16 \+ stage = 1024 must be < replica_stride 1024",
    ),
    ErrorCase(
        "port-above-65535",
        "PORT-2",
        "port",
        {"purpose": "kv", "base": 65000, "stage": 0, "replica": 1},
        r"would be 66124; ports must be in 1\.\.65535",
    ),
    ErrorCase(
        "port-zero",
        "PORT-2",
        "port",
        {"purpose": "forward", "base": 0, "stage": 0},
        r"would be 0; ports must be in 1\.\.65535",
    ),
    ErrorCase(
        "port-dp-without-stride",
        "PORT-2",
        "port",
        {"purpose": "kv", "base": 50000, "stage": 0, "dp_rank": 1},
        r"dp_rank 1 needs a scheme with a dp_stride",
    ),
    ErrorCase(
        "port-replica-into-next-dp-rank",
        "PORT-2",
        "port",
        {"purpose": "kv", "base": 1, "stage": 0, "replica": 4, "scheme": {"dp_stride": 4096}},
        r"replica 4 is out of range: .* = 4096 must be < dp_stride 4096",
    ),
    ErrorCase(
        "deployment-forward-meets-kv",
        "PORT-3",
        "deployment",
        {"stages": [{"tp": 8}] * 5},
        r"port 50100: kv \(stage 0, replica 0, rank 0\) and forward \(stage 4, replica 0, rank 6\)",
    ),
    ErrorCase(
        "deployment-stage-id-past-stride",
        "PORT-3",
        "deployment",
        {"stages": [{"tp": 2}, {"id": 16, "tp": 1}]},
        r"kv \(stage 16, replica 0, rank 0\): stage 16 is out of range"
        r"(?s:.*)port 50116: kv \(stage 0, replica 0, rank 1\) and kv \(stage 16",
    ),
    ErrorCase(
        "deployment-duplicate-stage-ids",
        "PORT-3",
        "deployment",
        {"stages": [{"id": 1, "tp": 1}, {"id": 1, "tp": 2}]},
        r"stage ids must be distinct; repeated: \[1\]",
    ),
    # payloads and their merge [PAYLOAD, DTYPE-3, SLICE-3]
    ErrorCase(
        "payload-unknown-key",
        "PAYLOAD-1",
        "payload",
        {**_PAYLOAD, "priority": 1},
        r"payload has missing keys \[\] and unknown keys \['priority'\]",
    ),
    ErrorCase(
        "payload-layer-count",
        "PAYLOAD-1",
        "payload",
        {**_PAYLOAD, "metadata": {**_PAYLOAD["metadata"], "num_layers": 3}},
        r"layer_blocks.key_cache must be a list of num_layers=3 entries, got 2",
    ),
    ErrorCase(
        "payload-seq-len",
        "PAYLOAD-1",
        "payload",
        {**_PAYLOAD, "metadata": {**_PAYLOAD["metadata"], "seq_len": 5}},
        r"key_cache\[1\] has shape \[3, 2, 4\]; expected \[seq_len=5",
    ),
    ErrorCase(
        "payload-dtype",
        "PAYLOAD-1",
        "payload",
        {**_PAYLOAD, "metadata": {**_PAYLOAD["metadata"], "dtype": "float16"}},
        r"key_cache\[1\] has dtype torch.bfloat16, metadata says float16",
    ),
    ErrorCase(
        "payload-fp8-without-scales",
        "DTYPE-3",
        "payload",
        {
            **_PAYLOAD,
            "layer_blocks": {
                "key_cache": [None, _FP8],
                "value_cache": [None, _FP8],
                "key_scale": [None, None],
                "value_scale": [None, None],
            },
            "metadata": {**_PAYLOAD["metadata"], "dtype": "float8_e4m3fn"},
        },
        r"key_scale\[1\] must be present exactly where the cache is; the cache is present",
    ),
    ErrorCase(
        "payload-no-layer",
        "PAYLOAD-1",
        "payload",
        {**_PAYLOAD, "layer_blocks": {"key_cache": [None, None], "value_cache": [None, None]}},
        r"payload of request 'req_1' carries no layer",
    ),
    ErrorCase(
        "merge-request-ids-differ",
        "PAYLOAD-3",
        "merge",
        {**_MERGE, "change": {"1": {"request_id": "req_2"}}},
        r"disagree on request_id \(source rank 0: 'req_1', source rank 1: 'req_2'\)",
    ),
    ErrorCase(
        "merge-seq-lens-differ",
        "PAYLOAD-3",
        "merge",
        {**_MERGE, "change": {"0": {"seq_len": 1}}},
        r"disagree on seq_len \(source rank 0: 1, source rank 1: 2\)",
    ),
    ErrorCase(
        "merge-chunks-differ",
        "PAYLOAD-3",
        "merge",
        {**_MERGE, "change": {"1": {"chunk": {"chunk_id": 1, "token_start": 2, "final": True}}}},
        r"disagree on chunk",
    ),
    ErrorCase(
        "merge-layer-missing-on-one-shard",
        "PAYLOAD-3",
        "merge",
        {**_MERGE, "change": {"1": {"drop_layer": 0}}},
        r"layer 0 is present on the shard of source rank 0 and missing on the shard of "
        r"source rank 1",
    ),
    ErrorCase(
        "merge-payload-for-another-rank",
        "SLICE-3",
        "merge",
        {**_MERGE, "change": {"1": {"target_rank": 1}}},
        r"payload is marked for target rank 1 but arrived at rank 0",
    ),
    # chunks [CHUNK]
    ErrorCase(
        "chunk-missing",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False], [2, 8, 10, True]]},
        r"missing tokens 4\.\.7; missing chunk ids \[1\]",
    ),
    ErrorCase(
        "chunk-final-missing",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False]]},
        r"missing the final chunk \(tokens from 4 on\)",
    ),
    ErrorCase(
        "chunk-overlap",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False], [1, 2, 6, True]]},
        r"chunk 0 \(tokens 0\.\.3\) and chunk 1 \(tokens 2\.\.5\) overlap on tokens 2\.\.3",
    ),
    ErrorCase(
        "chunk-repeated",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, True], [0, 0, 4, True]]},
        r"chunk 0 arrived 2 times",
    ),
    # the wire [WIRE]
    ErrorCase(
        "wire-not-json",
        "WIRE-1",
        "decode",
        {"frames_hex": ["7b2261"]},
        r"the header is not JSON",
    ),
    ErrorCase(
        "wire-future-version",
        "WIRE-1",
        "decode",
        _wire(version=2),
        r"unsupported version 2; this decoder reads version 1",
    ),
    ErrorCase(
        "wire-dtype-outside-allow-list",
        "WIRE-3",
        "decode",
        _wire(tensors__0__dtype="float64"),
        r"tensors\[0\]\.dtype must be one of float32, .* got 'float64'",
    ),
    ErrorCase(
        "wire-negative-dimension",
        "WIRE-3",
        "decode",
        _wire(tensors__1__shape=[1, -1, 1]),
        r"tensors\[1\]\.shape\[1\] must be an integer >= 0, got -1",
    ),
    ErrorCase(
        "wire-frame-length-disagrees",
        "WIRE-3",
        "decode",
        _wire(tensors__1__shape=[1, 1, 2]),
        r"frame 2 has 4 bytes but tensors\[1\] declares float32 \[1, 1, 2\] = 8 bytes",
    ),
    ErrorCase(
        "wire-huge-declared-shape",
        "WIRE-2",
        "decode",
        _wire(tensors__0__shape=[2**40, 2**40, 2**40]),
        r"tensors\[0\]\.shape \[1099511627776, .*\] of float32 exceeds max_total_bytes",
    ),
    ErrorCase(
        "wire-frame-missing",
        "WIRE-3",
        "decode",
        {**_wire(), "frame_bytes": [4]},
        r"the header lists 2 tensors but 1 tensor frames follow it",
    ),
    ErrorCase(
        "wire-header-over-limit",
        "WIRE-2",
        "decode",
        {**_wire(), "limits": {"max_header_bytes": 64}},
        r"decode: over the limits: a \d+-byte header > max_header_bytes 64",
    ),
    ErrorCase(
        "wire-too-many-layers",
        "WIRE-2",
        "decode",
        _wire(metadata__num_layers=10**9),
        r"metadata\.num_layers must be an integer 1\.\.1024, got 1000000000",
    ),
    # the second release's axes: token shards, attention groups, DP ranks and the
    # plans and slices they need [CP, STAGE-2, DP, PLAN-6, SLICE]
    ErrorCase(
        "cp-unknown-rule",
        "CP-1",
        "stage",
        {"tp": 2, "cp": 2, "cp_rule": "ring"},
        r"unknown context-parallel rule 'ring'",
    ),
    ErrorCase(
        "cp-interleave-without-size",
        "CP-1",
        "stage",
        {"tp": 2, "cp": 2, "cp_rule": "interleave"},
        r"interleave needs its size: interleave:I",
    ),
    ErrorCase(
        "cp-interleave-zero",
        "CP-1",
        "stage",
        {"tp": 2, "cp": 2, "cp_rule": "interleave:0"},
        r"size of interleave must be >= 1, got 0",
    ),
    ErrorCase(
        "zigzag-request-too-short",
        "CP-2",
        "transfer",
        {
            "source": {"tp": 4, "cp": 2, "cp_rule": "zigzag"},
            "target": {"tp": 2},
            "model": _M,
            "seq_len": 3,
        },
        r"zigzag over 2 token shards .* at least 4 tokens; this request has 3",
    ),
    ErrorCase(
        "interleave-not-dividing-block-size",
        "CP-2",
        "transfer",
        {
            "source": {"tp": 2},
            "target": {"tp": 4, "cp": 2, "cp_rule": "interleave:16"},
            "model": _M,
            "seq_len": 64,
            "target_block_size": 24,
        },
        r"interleave:16 needs a cache block size that is a multiple of 16; the block size is 24",
    ),
    ErrorCase(
        "round-robin-blocks-other-block-size",
        "CP-2",
        "transfer",
        {
            "source": {"tp": 4, "cp": 2, "cp_rule": "round_robin_blocks:8"},
            "target": {"tp": 2},
            "model": _M,
            "seq_len": 64,
            "source_block_size": 16,
        },
        r"round_robin_blocks:8 distributes cache blocks of 8 tokens, but the cache block size "
        r"is 16",
    ),
    ErrorCase(
        "dp-cp-not-dividing-tp",
        "STAGE-2",
        "stage",
        {"tp": 6, "dp": 2, "cp": 2},
        r"dp 2 x cp 2 = 4 does not divide tp 6",
    ),
    ErrorCase(
        "dcp-not-dividing-attention-tp",
        "CP-3",
        "stage",
        {"tp": 6, "dcp": 4},
        r"dcp 4 does not divide the attention-TP size 6",
    ),
    ErrorCase(
        "dcp-without-replicated-heads",
        "CP-3",
        "transfer",
        {"source": {"tp": 4, "dcp": 2}, "target": {"tp": 4}, "model": _M, "seq_len": 8},
        r"dcp 2 needs every KV head held by at least 2 attention-TP ranks, but 4 heads over "
        r"attention-TP 4 are held by 1",
    ),
    ErrorCase(
        "dp-rank-out-of-range",
        "DP-1",
        "transfer",
        {"source": {"tp": 4, "dp": 2}, "target": {"tp": 2}, "model": _M, "source_dp": 2},
        r"source DP rank 2 is out of range: valid ranks are 0\.\.1",
    ),
    ErrorCase(
        "cp-plan-without-length",
        "PLAN-6",
        "transfer",
        {"source": {"tp": 4, "cp": 2}, "target": {"tp": 2}, "model": _M},
        r"splits requests by tokens, so a plan is made for one request length; give seq_len",
    ),
    ErrorCase(
        "slice-heads-and-offset",
        "SLICE-1",
        "head_slice",
        {
            "target_rank": 0,
            "from_tp": 4,
            "to_tp": 6,
            "offset_in_shard": 0,
            "num_slices": 1,
            "heads": [1, 3],
        },
        r"either offset_in_shard and num_slices or heads",
    ),
    ErrorCase(
        "slice-tokens-unsorted",
        "SLICE-4",
        "head_slice",
        {
            "target_rank": 0,
            "from_tp": 4,
            "to_tp": 4,
            "offset_in_shard": 0,
            "num_slices": 1,
            "tokens": [[8, 12], [0, 4]],
        },
        r"token ranges must be sorted, disjoint and apart",
    ),
)
"""Every invalid input the reference must refuse, one per distinct rule violation."""
