"""The ownership family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [STAGE, CP, HEAD, LAYER].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import M

ERROR_CASES: tuple[ErrorCase, ...] = (
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
        "target-heads-invalid",
        "HEAD-1",
        "transfer",
        {"source": {"tp": 2}, "target": {"tp": 8}, "model": {**M, "num_kv_heads": 12}},
        r"12 KV heads cannot be split over TP 8",
    ),
    ErrorCase(
        "transfer-rank-out-of-range",
        "STAGE-1",
        "transfer",
        {
            "source": {"tp": 2, "pp": 2},
            "target": {"tp": 2},
            "model": M,
            "rank": {"side": "source", "rank": 4},
        },
        r"rank 4 is out of range: valid ranks are 0\.\.3",
    ),
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
            "model": M,
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
            "model": M,
            "seq_len": 64,
            "target_block_size": 24,
        },
        r"interleave:16 needs a cache block size that is a multiple of 16; the block size is 24 "
        r"\(24 % 16 = 8\): use a block size of 32, or interleave:12",
    ),
    ErrorCase(
        "round-robin-blocks-other-block-size",
        "CP-2",
        "transfer",
        {
            "source": {"tp": 4, "cp": 2, "cp_rule": "round_robin_blocks:8"},
            "target": {"tp": 2},
            "model": M,
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
        {"source": {"tp": 4, "dcp": 2}, "target": {"tp": 4}, "model": M, "seq_len": 8},
        r"dcp 2 needs every KV head held by at least 2 attention-TP ranks, but 4 heads over "
        r"attention-TP 4 are held by 1",
    ),
)
