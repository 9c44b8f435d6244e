"""The paged family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [PAGED].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import PAGED, PAGED_FP8

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "paged-block-id-out-of-range",
        "PAGED-2",
        "gather_request",
        {"cache": PAGED, "block_ids": [2, 8], "seq_len": 20},
        r"block ids \[8\] \(at positions \[1\]\) are out of range: the cache has 8 blocks, "
        r"so valid ids are 0\.\.7",
    ),
    ErrorCase(
        "paged-negative-block-id",
        "PAGED-2",
        "gather_request",
        {"cache": PAGED, "block_ids": [-1, 3], "seq_len": 20},
        r"block ids \[-1\] \(at positions \[0\]\) are out of range",
    ),
    ErrorCase(
        "paged-duplicate-block-ids",
        "PAGED-2",
        "scatter_request",
        {"cache": PAGED, "block_ids": [5, 1, 5], "seq_len": 40},
        r"block ids \[5\] appear more than once in \[5, 1, 5\]",
    ),
    ErrorCase(
        "paged-seq-len-beyond-blocks",
        "PAGED-3",
        "gather_request",
        {"cache": PAGED, "block_ids": [4, 1], "seq_len": 40},
        r"seq_len 40 needs 3 blocks of 16 but 2 block ids were given \(\[4, 1\]\), which hold "
        r"32 tokens; refusing rather than dropping 8 tokens",
    ),
    ErrorCase(
        "paged-extra-block-ids",
        "PAGED-3",
        "scatter_request",
        {"cache": PAGED, "block_ids": [4, 1, 0], "seq_len": 20},
        r"seq_len 20 needs 2 blocks of 16 but 3 block ids were given \(\[4, 1, 0\]\); pass "
        r"exactly the first 2",
    ),
    ErrorCase(
        "paged-kv-heads-differ",
        "PAGED-4",
        "scatter_request",
        {"cache": PAGED, "kv": {"heads": 4}, "block_ids": [0], "seq_len": 3},
        r"KV of shape \[2, 2, 3, 4, 8\] does not fit .*expected .* \[2, 2, 'seq', 2, 8\]",
    ),
    ErrorCase(
        "paged-fp8-scales-differ",
        "PAGED-5",
        "scatter_request",
        {"cache": PAGED_FP8, "kv": {"seed": 1}, "block_ids": [0], "seq_len": 3},
        r"layer 0 \(of this cache\) has scales \[.*\] but the KV carries \[.*\]",
    ),
)
