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

import torch

from kvspec.cache_layout import LayerCache, cache_shape, convert, detect_layout
from kvspec.kv import RequestKV
from kvspec.model import ModelShape, check_compatible
from kvspec.oracle import oracle_kv, oracle_scales, verify
from kvspec.ownership import layer_ranges, owned_heads
from kvspec.paged import PagedCache, empty_paged_cache, gather_request, scatter_request
from kvspec.plan import plan_transfer
from kvspec.slicing import HeadSlice
from kvspec.stage import StageLayout


def _stage(args: dict[str, Any]) -> StageLayout:
    return StageLayout.from_dict(args)


def _model(args: dict[str, Any]) -> ModelShape:
    return ModelShape.from_dict(args)


def _transfer(args: dict[str, Any]) -> object:
    """A whole transfer configuration, as an adapter's ``validate`` receives it.

    Optional ``target_model`` (the receiver's model facts [MODEL-3]) and ``rank``
    (``{"side": "source" | "target", "rank": int}`` [STAGE-1]) are checked too.
    """
    source, target, model = _stage(args["source"]), _stage(args["target"]), _model(args["model"])
    if "target_model" in args:
        check_compatible(model, _model(args["target_model"]))
    plan = plan_transfer(source, target, model, policy=args.get("policy", "lowest"))
    if "rank" in args:
        side = args["rank"]["side"]
        (source if side == "source" else target).coords(args["rank"]["rank"])
    return plan


def _cache(args: dict[str, Any]) -> LayerCache:
    """A zero cache of ``shape`` (one tensor) or ``shapes`` (a tuple), ``dtype`` float16."""
    dtype = getattr(torch, args.get("dtype", "float16"))
    if "shapes" in args:
        return tuple(torch.zeros(shape, dtype=dtype) for shape in args["shapes"])
    return torch.zeros(args["shape"], dtype=dtype)


def _known(args: dict[str, Any]) -> dict[str, int]:
    return {k: args[k] for k in ("heads", "head_dim", "block_size") if k in args}


def _ranges(args: dict[str, Any]) -> dict[str, Any]:
    """Oracle ranges from ``[start, stop]`` pairs (``tokens`` may be a seq_len)."""
    tokens = args.get("tokens", 1)
    out: dict[str, Any] = {"tokens": tokens if isinstance(tokens, int) else range(*tokens)}
    for name in ("layers", "heads"):
        if name in args:
            out[name] = range(*args[name])
    return out


def _paged_model(args: dict[str, Any]) -> ModelShape:
    return ModelShape(args["num_layers"], args["heads"], args["head_dim"], dtype=args["dtype"])


def _paged(args: dict[str, Any]) -> PagedCache:
    """A zero paged cache; fp8 gets the oracle's scales unless ``scales`` is false."""
    model = _paged_model(args)
    scales = oracle_scales(model) if args.get("scales", True) else None
    return empty_paged_cache(
        args["layout"],
        num_layers=model.num_layers,
        num_blocks=args["num_blocks"],
        block_size=args["block_size"],
        heads=model.num_kv_heads,
        head_dim=model.head_dim,
        dtype=model.dtype,
        scales=scales,
    )


def _scatter(args: dict[str, Any]) -> None:
    """Scatter oracle KV (``kv`` overrides its model facts, seed and scales) into a cache."""
    cache_args = args["cache"]
    kv_args = args.get("kv", {})
    model = _paged_model({**cache_args, **kv_args})
    kv = oracle_kv(model, "r", tokens=args["seq_len"], seed=kv_args.get("seed", 0))
    if kv_args.get("drop_scales"):
        kv = RequestKV(kv.data)
    scatter_request(kv, _paged(cache_args), args["block_ids"])


OPERATIONS: dict[str, Callable[[dict[str, Any]], object]] = {
    "stage": _stage,
    "model": _model,
    "rank_coords": lambda a: _stage(a["stage"]).coords(a["rank"]),
    "owned_heads": lambda a: owned_heads(a["num_kv_heads"], a["tp"], a["tp_rank"]),
    "layer_ranges": lambda a: layer_ranges(_stage(a["stage"]), a["num_layers"]),
    "transfer": lambda a: _transfer(a),
    "compatible": lambda a: check_compatible(_model(a["source"]), _model(a["target"])),
    "head_slice": lambda a: HeadSlice.from_dict(a),
    "cache_shape": lambda a: cache_shape(_cache(a), a["layout"], **_known(a)),
    "convert_layout": lambda a: convert(
        _cache(a), a["source"], a["target"], block_size=a.get("block_size")
    ),
    "detect_layout": lambda a: detect_layout(_cache(a), **_known(a)),
    "paged_cache": _paged,
    "gather_request": lambda a: gather_request(_paged(a["cache"]), a["block_ids"], a["seq_len"]),
    "scatter_request": _scatter,
    "oracle_kv": lambda a: oracle_kv(_model(a["model"]), a["request_id"], **_ranges(a)),
    "verify_oracle": lambda a: verify(
        oracle_kv(_model(a["model"]), "r", **_ranges(a["fill"])),
        _model(a["model"]),
        "r",
        **_ranges(a["check"]),
    ),
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
        "transfer",
        {"source": {"tp": 3}, "target": {"tp": 2}, "model": {**_M, "num_kv_heads": 6}},
        r"source TP 3 and target TP 2 do not divide one another",
    ),
    ErrorCase(
        "tp-pair-6-4",
        "PLAN-1",
        "transfer",
        {"source": {"tp": 6}, "target": {"tp": 4}, "model": {**_M, "num_kv_heads": 12}},
        r"source TP 6 and target TP 4 do not divide one another",
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
)
"""Every invalid input the reference must refuse, one per distinct rule violation."""
