"""The transfer family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [DTYPE, SLICE].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import FP8, MERGE, PAGED_FP8, PAYLOAD, M

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "model-unknown-dtype",
        "DTYPE-1",
        "model",
        {**M, "dtype": "int8"},
        r"dtype must be one of .*got 'int8'",
    ),
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
    ErrorCase(
        "paged-fp8-scales-missing",
        "DTYPE-3",
        "scatter_request",
        {"cache": PAGED_FP8, "kv": {"drop_scales": True}, "block_ids": [0], "seq_len": 3},
        r"KV scattered into a paged float8_e5m2 cache: .* must carry its per-layer K/V scales",
    ),
    ErrorCase(
        "paged-fp8-cache-without-scales",
        "DTYPE-3",
        "paged_cache",
        {**PAGED_FP8, "scales": False},
        r"a paged float8_e5m2 cache: .* must carry its per-layer K/V scales; none given",
    ),
    ErrorCase(
        "slice-marker-without-offset",
        "SLICE-3",
        "head_slice",
        {"target_rank": 0, "from_tp": 2, "to_tp": 4, "num_slices": 2},
        r"include target_rank, from_tp, to_tp, offset_in_shard, num_slices; got .*, "
        r"missing \['offset_in_shard'\]",
    ),
    ErrorCase(
        "payload-fp8-without-scales",
        "DTYPE-3",
        "payload",
        {
            **PAYLOAD,
            "layer_blocks": {
                "key_cache": [None, FP8],
                "value_cache": [None, FP8],
                "key_scale": [None, None],
                "value_scale": [None, None],
            },
            "metadata": {**PAYLOAD["metadata"], "dtype": "float8_e4m3fn"},
        },
        r"key_scale\[1\] must be present exactly where the cache is; the cache is present",
    ),
    ErrorCase(
        "merge-payload-for-another-rank",
        "SLICE-3",
        "merge",
        {**MERGE, "change": {"1": {"target_rank": 1}}},
        r"payload is marked for target rank 1 but arrived at rank 0",
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
