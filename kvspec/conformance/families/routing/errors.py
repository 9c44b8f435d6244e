"""The routing family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [PLAN, DP].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import M

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "tp-4-6-target-cannot-hold-heads",
        "PLAN-1",
        "transfer",
        {"source": {"tp": 4}, "target": {"tp": 6}, "model": {**M, "num_kv_heads": 8}},
        r"target TP6: 8 KV heads cannot be split over TP 6",
    ),
    ErrorCase(
        "tp-6-4-source-cannot-hold-heads",
        "PLAN-1",
        "transfer",
        {"source": {"tp": 6}, "target": {"tp": 4}, "model": {**M, "num_kv_heads": 4}},
        r"source TP6: 4 KV heads cannot be replicated over TP 6",
    ),
    ErrorCase(
        "unknown-policy",
        "PLAN-4",
        "transfer",
        {"source": {"tp": 2}, "target": {"tp": 2}, "model": M, "policy": "random"},
        r"policy must be one of 'lowest', 'balanced'; got 'random'",
    ),
    ErrorCase(
        "dp-rank-out-of-range",
        "DP-1",
        "transfer",
        {"source": {"tp": 4, "dp": 2}, "target": {"tp": 2}, "model": M, "source_dp": 2},
        r"source DP rank 2 is out of range: valid ranks are 0\.\.1",
    ),
    ErrorCase(
        "cp-plan-without-length",
        "PLAN-6",
        "transfer",
        {"source": {"tp": 4, "cp": 2}, "target": {"tp": 2}, "model": M},
        r"splits requests by tokens, so a plan is made for one request length; give seq_len",
    ),
)
