"""The operations an error case can name, as the reference runs them.

:data:`OPERATIONS` maps an operation's name to a function of plain-data arguments (the
``args`` of a :class:`~kvspec.error_cases.case.ErrorCase`); the builders beside it turn
those arguments into the spec's values (stages, models, caches, payloads, wire frames).
An adapter's ``validate`` receives the ``transfer`` operation's arguments unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from kvspec.memory.cache_layout import LayerCache, cache_shape, convert, detect_layout
from kvspec.memory.paged import PagedCache, empty_model_cache, gather_request, scatter_request
from kvspec.naming.keys import legacy_key, parse_key, rank_aware_key
from kvspec.naming.ports import DeployedStage, Deployment, PortScheme, check_deployment, port
from kvspec.tensors.dtypes import torch_dtype
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.oracle import oracle_kv, oracle_scales, verify
from kvspec.tensors.reshard import send, shard
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.model import ModelShape, check_compatible
from kvspec.topology.ownership import layer_ranges, owned_heads
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport.chunks import reassemble
from kvspec.transport.payload import Chunk, Payload, merge_payloads, payload_from_shipment
from kvspec.transport.wire import WireLimits, decode


def _stage(args: Mapping[str, Any]) -> StageLayout:
    return StageLayout.from_dict(args)


def _model(args: Mapping[str, Any]) -> ModelShape:
    return ModelShape.from_dict(args)


def _transfer(args: Mapping[str, Any]) -> object:
    """A whole transfer configuration, as an adapter's ``validate`` receives it.

    Optional ``target_model`` (the receiver's model facts [MODEL-3]) and ``rank``
    (``{"side": "source" | "target", "rank": int}`` [STAGE-1]) are checked too, and so
    are the request's ``seq_len`` and the DP ranks the router chose (``source_dp``,
    ``target_dp``) [PLAN-6, DP-1] and the sides' cache block sizes
    (``source_block_size``, ``target_block_size``) [CP-2].
    """
    source, target, model = _stage(args["source"]), _stage(args["target"]), _model(args["model"])
    if "target_model" in args:
        check_compatible(model, _model(args["target_model"]))
    for side, layout in (("source", source), ("target", target)):
        if f"{side}_block_size" in args:
            layout.check_block_size(args[f"{side}_block_size"])
    if model.hybrid:  # every layer group on both sides [GROUP-3, STATE-1]
        return plan_groups(
            source,
            target,
            model,
            seq_len=args.get("seq_len", 0),
            policy=args.get("policy", "lowest"),
            source_dp=args.get("source_dp", 0),
            target_dp=args.get("target_dp", 0),
        )
    plan = plan_transfer(
        source,
        target,
        model,
        policy=args.get("policy", "lowest"),
        seq_len=args.get("seq_len"),
        source_dp=args.get("source_dp", 0),
        target_dp=args.get("target_dp", 0),
    )
    if "rank" in args:
        side = args["rank"]["side"]
        (source if side == "source" else target).coords(args["rank"]["rank"])
    return plan


def _cache(args: Mapping[str, Any]) -> LayerCache:
    """A zero cache of ``shape`` (one tensor) or ``shapes`` (a tuple), ``dtype`` float16."""
    dtype = torch_dtype(args.get("dtype", "float16"))
    if "shapes" in args:
        return tuple(torch.zeros(shape, dtype=dtype) for shape in args["shapes"])
    return torch.zeros(args["shape"], dtype=dtype)


def _known(args: Mapping[str, Any]) -> dict[str, int]:
    return {k: args[k] for k in ("heads", "head_dim", "block_size") if k in args}


def _ranges(args: Mapping[str, Any]) -> dict[str, Any]:
    """Oracle ranges from ``[start, stop]`` pairs (``tokens`` may be a seq_len)."""
    tokens = args.get("tokens", 1)
    out: dict[str, Any] = {"tokens": tokens if isinstance(tokens, int) else range(*tokens)}
    for name in ("layers", "heads"):
        if name in args:
            out[name] = range(*args[name])
    return out


def _paged_model(args: Mapping[str, Any]) -> ModelShape:
    return ModelShape(args["num_layers"], args["heads"], args["head_dim"], dtype=args["dtype"])


def _paged(args: Mapping[str, Any]) -> PagedCache:
    """A zero paged cache; fp8 gets the oracle's scales unless ``scales`` is false."""
    model = _paged_model(args)
    scales = oracle_scales(model) if args.get("scales", True) else None
    return empty_model_cache(
        args["layout"],
        model,
        num_blocks=args["num_blocks"],
        block_size=args["block_size"],
        scales=scales,
    )


def _scatter(args: Mapping[str, Any]) -> None:
    """Scatter oracle KV (``kv`` overrides its model facts, seed and scales) into a cache."""
    cache_args = args["cache"]
    kv_args = args.get("kv", {})
    model = _paged_model({**cache_args, **kv_args})
    kv = oracle_kv(model, "r", tokens=args["seq_len"], seed=kv_args.get("seed", 0))
    if kv_args.get("drop_scales"):
        kv = RequestKV(kv.data)
    scatter_request(kv, _paged(cache_args), args["block_ids"])


def _port(args: Mapping[str, Any]) -> int:
    given = dict(args)
    scheme = PortScheme(**given.pop("scheme", {}))
    return port(**given, scheme=scheme)


def _deployment(args: Mapping[str, Any]) -> object:
    stages = tuple(
        DeployedStage(
            s.get("id", i),
            _stage({k: v for k, v in s.items() if k not in ("id", "replicas")}),
            replicas=s.get("replicas", 1),
            dp=s.get("dp", 1),
        )
        for i, s in enumerate(args["stages"])
    )
    scheme = PortScheme(**args.get("scheme", {}))
    return check_deployment(Deployment(args.get("base", 50000), stages), scheme=scheme)


def _tensors(value: Any) -> Any:
    """``{"zeros": shape, "dtype": name}`` anywhere in ``value`` becomes that tensor."""
    if isinstance(value, dict) and set(value) == {"zeros", "dtype"}:
        return torch.zeros(value["zeros"], dtype=torch_dtype(value["dtype"]))
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return value


def _drop(values: tuple, layer: int) -> tuple:
    return tuple(None if i == layer else t for i, t in enumerate(values))


def _changed(payload: Payload, change: dict[str, Any]) -> Payload:
    """One sender's payload with the changes an error case names."""
    for name, value in change.items():
        if name == "seq_len":
            cut = tuple(None if t is None else t[:value] for t in payload.key_cache)
            cutv = tuple(None if t is None else t[:value] for t in payload.value_cache)
            payload = replace(payload, key_cache=cut, value_cache=cutv, seq_len=value)
        elif name == "drop_layer":
            payload = replace(
                payload,
                key_cache=_drop(payload.key_cache, value),
                value_cache=_drop(payload.value_cache, value),
            )
        elif name == "target_rank":
            payload = replace(payload, head_slice=replace(payload.head_slice, target_rank=value))
        elif name == "chunk":
            payload = replace(payload, chunk=Chunk(**value))
        else:
            payload = replace(payload, **{name: value})
    return payload


def _merge(args: Mapping[str, Any]) -> object:
    """Merge one request's payloads into ``dst`` after changing some senders' payloads."""
    source, model = _stage(args["source"]), _model(args["model"])
    plan = plan_transfer(source, _stage(args["target"]), model)
    shards = shard(random_request_kv(model, args.get("seq_len", 2)), source, model)
    received = [
        (src, payload_from_shipment(plan, shipment, "req_1"))
        for src in plan.sources_of(args["dst"])
        for shipment in send(plan, src, shards[src])
        if shipment.edge.dst == args["dst"]
    ]
    changes = args.get("change", {})
    received = [(src, _changed(p, changes.get(str(src), {}))) for src, p in received]
    return merge_payloads(plan, args["dst"], received)


def _reassemble(args: Mapping[str, Any]) -> object:
    """Reassemble chunks ``[chunk_id, start, stop, final]`` of a 1-layer float32 request."""
    data = torch.zeros((2, 16, 1, 1), dtype=torch.float32)
    marker = HeadSlice(0, 1, 1, 0, 1, applied=True, side="sender")
    return reassemble(
        Payload(
            "r", (data[0, a:b],), (data[1, a:b],), (), 4, "float32", b - a, marker, Chunk(i, a, f)
        )
        for i, a, b, f in args["chunks"]
    )


def _decode(args: Mapping[str, Any]) -> object:
    """Decode ``frames_hex``, or a ``header`` object followed by zeroed ``frame_bytes``."""
    if "frames_hex" in args:
        frames = [bytes.fromhex(f) for f in args["frames_hex"]]
    else:
        header = json.dumps(args["header"]).encode()
        frames = [header, *(bytes(n) for n in args["frame_bytes"])]
    return decode(frames, limits=WireLimits(**args.get("limits", {})))


OPERATIONS: dict[str, Callable[[Mapping[str, Any]], object]] = {
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
    "rank_aware_key": lambda a: rank_aware_key(**a),
    "legacy_key": lambda a: legacy_key(**a),
    "parse_key": lambda a: parse_key(a["key"]),
    "port": _port,
    "deployment": _deployment,
    "payload": lambda a: Payload.from_dict(_tensors(a)),
    "merge": _merge,
    "reassemble": _reassemble,
    "decode": _decode,
}
"""Reference implementation of every operation an error case can name."""
