"""The oracle family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [ORACLE].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import M

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "oracle-heads-past-model",
        "ORACLE-4",
        "oracle_kv",
        {"model": M, "request_id": "r", "heads": [2, 6]},
        r"heads 2\.\.5 reach past the model's 4 heads \(valid: 0\.\.3\)",
    ),
    ErrorCase(
        "oracle-layers-past-model",
        "ORACLE-4",
        "oracle_kv",
        {"model": M, "request_id": "r", "layers": [0, 5]},
        r"layers 0\.\.4 reach past the model's 4 layers",
    ),
    ErrorCase(
        "oracle-negative-token",
        "ORACLE-4",
        "oracle_kv",
        {"model": M, "request_id": "r", "tokens": [-1, 3]},
        r"tokens must be a range of step 1 from >= 0, got range\(-1, 3\)",
    ),
    ErrorCase(
        "oracle-request-id-not-str",
        "ORACLE-1",
        "oracle_kv",
        {"model": M, "request_id": 7},
        r"request_id must be a str, got 7",
    ),
    ErrorCase(
        "oracle-verify-other-token-count",
        "ORACLE-5",
        "verify_oracle",
        {"model": M, "fill": {"tokens": 3}, "check": {"tokens": [5, 9]}},
        r"has 3 tokens but the token range 5\.\.8 has 4",
    ),
)
