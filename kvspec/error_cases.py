"""Invalid inputs as data: what must be refused, by which clause, with which message.

Each :class:`ErrorCase` names an operation and its arguments as plain data (so it can
be exported as a golden vector and replayed through any adapter), the clause that
refuses it, and a regular expression the reference's message must match — the
offending values are part of every pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvspec.keys import legacy_key, parse_key, rank_aware_key
from kvspec.model import ModelShape, check_compatible
from kvspec.ownership import layer_ranges, owned_heads
from kvspec.plan import plan_transfer
from kvspec.ports import DeployedStage, Deployment, PortScheme, check_deployment, port
from kvspec.slicing import HeadSlice
from kvspec.stage import StageLayout


def _stage(args: dict[str, Any]) -> StageLayout:
    partition = args.get("layer_partition")
    return StageLayout(
        args["tp"], args.get("pp", 1), None if partition is None else tuple(partition)
    )


def _model(args: dict[str, Any]) -> ModelShape:
    return ModelShape(**args)


def _port(args: dict[str, Any]) -> int:
    args = dict(args)
    scheme = PortScheme(**args.pop("scheme", {}))
    return port(**args, scheme=scheme)


def _deployment(args: dict[str, Any]) -> object:
    stages = tuple(
        DeployedStage(
            s.get("id", i),
            _stage(s),
            replicas=s.get("replicas", 1),
            dp=s.get("dp", 1),
        )
        for i, s in enumerate(args["stages"])
    )
    scheme = PortScheme(**args.get("scheme", {}))
    return check_deployment(Deployment(args.get("base", 50000), stages), scheme=scheme)


OPERATIONS: dict[str, Callable[[dict[str, Any]], object]] = {
    "stage": _stage,
    "model": _model,
    "rank_coords": lambda a: _stage(a["stage"]).coords(a["rank"]),
    "owned_heads": lambda a: owned_heads(a["num_kv_heads"], a["tp"], a["tp_rank"]),
    "layer_ranges": lambda a: layer_ranges(_stage(a["stage"]), a["num_layers"]),
    "plan": lambda a: plan_transfer(
        _stage(a["source"]),
        _stage(a["target"]),
        _model(a["model"]),
        policy=a.get("policy", "lowest"),
    ),
    "compatible": lambda a: check_compatible(_model(a["source"]), _model(a["target"])),
    "head_slice": lambda a: HeadSlice.from_dict(a),
    "rank_aware_key": lambda a: rank_aware_key(**a),
    "legacy_key": lambda a: legacy_key(**a),
    "parse_key": lambda a: parse_key(a["key"]),
    "port": _port,
    "deployment": _deployment,
}
"""Reference implementation of every operation an error case can name."""


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
_KEY = {"from_stage": 0, "chunk_id": 0, "from_rank": 0, "to_rank": 0}

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
        "tp-pair-3-2",
        "PLAN-1",
        "plan",
        {"source": {"tp": 3}, "target": {"tp": 2}, "model": {**_M, "num_kv_heads": 6}},
        r"source TP 3 and target TP 2 do not divide one another",
    ),
    ErrorCase(
        "tp-pair-6-4",
        "PLAN-1",
        "plan",
        {"source": {"tp": 6}, "target": {"tp": 4}, "model": {**_M, "num_kv_heads": 12}},
        r"source TP 6 and target TP 4 do not divide one another",
    ),
    ErrorCase(
        "target-heads-invalid",
        "HEAD-1",
        "plan",
        {"source": {"tp": 2}, "target": {"tp": 8}, "model": {**_M, "num_kv_heads": 12}},
        r"12 KV heads cannot be split over TP 8",
    ),
    ErrorCase(
        "unknown-policy",
        "PLAN-4",
        "plan",
        {"source": {"tp": 2}, "target": {"tp": 2}, "model": _M, "policy": "random"},
        r"policy must be one of 'lowest', 'balanced'; got 'random'",
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
"""Every invalid input the reference must refuse, one per distinct rule violation."""
