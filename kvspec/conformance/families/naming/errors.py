"""The naming family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [KEY, PORT].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import KEY

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "key-request-id-with-legacy-head",
        "KEY-3",
        "rank_aware_key",
        {"request_id": "omni_0_to_1_kv_cache_5", **KEY},
        r"request_id 'omni_0_to_1_kv_cache_5' begins with a legacy key's head",
    ),
    ErrorCase(
        "key-request-id-empty",
        "KEY-3",
        "rank_aware_key",
        {"request_id": "", **KEY},
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
        {"request_id": "r", **KEY, "to_rank": -1},
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
)
