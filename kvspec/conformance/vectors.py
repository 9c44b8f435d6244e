"""Golden vectors: the spec's cases and expected outputs as language-neutral files.

``kvspec vectors export DIR`` writes ``DIR/manifest.json`` (cases and expected
results, plain JSON) and ``DIR/tensors.safetensors`` (every tensor a case names,
by key), the same bytes on every run. ``docs/vectors.md`` documents the schema so a
C++ or Rust implementation can conform without Python; ``kvspec vectors check DIR
--impl IMPL`` replays the vectors through an adapter.

Each family of vectors is a :class:`Family`: a deterministic ``export`` (cases,
tensors) and a ``check`` that replays one case through an adapter.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file

from kvspec import __version__
from kvspec.conformance.adapter import (
    VALIDATORS,
    Adapter,
    NotProvided,
    provided_capabilities,
    validator_for,
)
from kvspec.conformance.checks.transfer import difference
from kvspec.error_cases import ERROR_CASES
from kvspec.errors import InputError
from kvspec.memory.cache_layout import (
    LAYOUTS,
    RECORDS,
    CacheShape,
    detect_layout,
    empty_cache,
    field_views,
    get_layout,
    kv_views,
    layouts_for,
)
from kvspec.memory.descriptors import RegisteredCache, judge_descriptors, plan_descriptors
from kvspec.memory.paged import PagedCache, empty_model_cache, gather_request, scatter_request
from kvspec.memory.presets import STATE_PRESETS
from kvspec.memory.state_cache import element_offset, state_page, state_runs
from kvspec.naming.keys import legacy_key, rank_aware_key
from kvspec.naming.ports import PortScheme, port, rank_port
from kvspec.strategies import RULE_SIZES, TP_SIZES, TransferCase, divides
from kvspec.tensors.dtypes import FP8_DTYPES, bits_view, torch_dtype
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.tensors.reshard import Shipment, edge_marker, send, shard
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import ChunkedLocal, SlidingWindow, StateGroup, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS as MODEL_PRESETS
from kvspec.topology.model_presets import model_preset
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.plan import check_plannable
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import part_units, plan_state_reads
from kvspec.topology.tokens import Tokens, as_tokens
from kvspec.topology.windows import chunk_tokens, window_tokens
from kvspec.transport.payload import payload_from_shipment
from kvspec.transport.wire import encode

FORMAT = "kvspec-golden-vectors"
VERSION = 1
TENSORS_FILE = "tensors.safetensors"
MANIFEST_FILE = "manifest.json"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
"""The golden vectors shipped inside the package: ``kvspec vectors check``'s default."""

Case = dict[str, Any]
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One kind of vector: how to make its cases and how to replay one through an adapter.

    ``check`` returns None when the adapter agrees, else what differs; it raises
    :class:`NotApplicable` when the adapter lacks what the case needs.
    """

    name: str
    needs: tuple[str, ...]
    export: Callable[[random.Random], tuple[list[Case], Tensors]]
    check: Callable[[Adapter, Case, Tensors], str | None]


class NotApplicable(Exception):
    pass


def _span(r: range) -> list[int]:
    return [r.start, r.stop]


def _sample_cases(rng: random.Random, count: int, *, max_layers: int = 8) -> list[TransferCase]:
    """Valid transfer cases drawn from a fixed grid with a seeded generator."""
    cases: list[TransferCase] = []
    while len(cases) < count:
        source_tp, target_tp = rng.choice(TP_SIZES), rng.choice(TP_SIZES)
        heads = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48])
        attention = rng.choice(["mha", "mha", "mha", "mla"])
        if attention == "mla":
            heads = 1
        if not divides(source_tp, target_tp):
            continue  # the first release's pairs: these vectors stay as they were
        try:
            check_plannable(source_tp, target_tp, heads)
        except ValueError:
            continue
        num_layers = rng.randint(1, max_layers)
        layouts = []
        for tp in (source_tp, target_tp):
            pp = rng.randint(1, min(3, num_layers))
            partition = None
            if pp > 1 and rng.random() < 0.3:
                cuts = sorted(rng.sample(range(1, num_layers), pp - 1))
                bounds = [0, *cuts, num_layers]
                partition = tuple(b - a for a, b in itertools.pairwise(bounds))
            layouts.append(StageLayout(tp, pp, partition))
        dtype = rng.choice(["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"])
        if attention == "mla":
            model = ModelShape.mla(num_layers, rng.randint(1, 4), dtype=dtype)
        else:
            model = ModelShape(num_layers, heads, rng.randint(1, 4), dtype=dtype)
        cases.append(
            TransferCase(layouts[0], layouts[1], model, rng.choice(["lowest", "balanced"]))
        )
    return cases


PINNED: tuple[TransferCase, ...] = (
    TransferCase(StageLayout(8), StageLayout(2), ModelShape(4, 4, 2)),
    TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 2, 2)),
    TransferCase(StageLayout(2), StageLayout(8), ModelShape(2, 4, 2), "balanced"),
    TransferCase(StageLayout(2, 2), StageLayout(4), ModelShape(61, 8, 2)),
    TransferCase(StageLayout(6), StageLayout(3), ModelShape(3, 12, 2)),
    TransferCase(StageLayout(4), StageLayout(8), ModelShape.mla(3, 4), "balanced"),
)
"""Named configurations from the design and the historical bug classes."""

PARALLEL: tuple[TransferCase, ...] = (
    TransferCase(StageLayout(4), StageLayout(6), ModelShape(2, 12, 2)),
    TransferCase(StageLayout(6), StageLayout(4), ModelShape(3, 12, 2), "balanced"),
    TransferCase(
        StageLayout(8), StageLayout(8, cp=2, cp_rule="interleave:1"), ModelShape(2, 4, 2), seq_len=9
    ),
    TransferCase(
        StageLayout(4, cp=2, cp_rule="interleave:2"),
        StageLayout(6),
        ModelShape(2, 12, 2),
        seq_len=11,
    ),
    TransferCase(
        StageLayout(4, cp=2, cp_rule="zigzag"),
        StageLayout(8, dcp=2, cp_rule="interleave:2"),
        ModelShape(2, 2, 2),
        seq_len=13,
    ),
    TransferCase(
        StageLayout(8, dcp=2, cp_rule="interleave:1"),
        StageLayout(2),
        ModelShape.mla(2, 3),
        seq_len=7,
    ),
    TransferCase(
        StageLayout(8, dp=2), StageLayout(4, dp=2), ModelShape(2, 2, 2), source_dp=1, target_dp=0
    ),
    TransferCase(
        StageLayout(2, 2, (1, 3)),
        StageLayout(4, 3, (2, 1, 1), cp=2, cp_rule="contiguous:2"),
        ModelShape(4, 4, 2),
        seq_len=9,
    ),
    TransferCase(
        StageLayout(4, cp=4, cp_rule="round_robin_blocks:2"),
        StageLayout(4, cp=2, cp_rule="contiguous:4"),
        ModelShape(2, 2, 2, dtype="float8_e4m3fn"),
        seq_len=14,
    ),
)
"""Configurations of the second release's axes: TP4 <-> TP6, token shards on either side
and both (PCP -> DCP), attention-DP groups, PP on both sides with uneven partitions."""


def _sample_layout(rng: random.Random, tp: int) -> dict[str, Any]:
    """Attention groups and token shards for a stage of ``tp`` ranks per pipeline stage."""
    groups = [(dp, cp) for dp in (1, 2) for cp in (1, 2, 3) if tp % (dp * cp) == 0]
    dp, cp = rng.choice(groups)
    dcp = rng.choice([d for d in (1, 2) if (tp // (dp * cp)) % d == 0])
    kind = rng.choice(["contiguous", "interleave", "round_robin_blocks", "zigzag"])
    size = rng.choice(RULE_SIZES[kind])
    rule = kind if kind == "zigzag" or (kind == "contiguous" and size == 1) else f"{kind}:{size}"
    return {"dp": dp, "cp": cp, "dcp": dcp, "cp_rule": rule}


def _sample_parallel(rng: random.Random, count: int) -> list[TransferCase]:
    """Valid cases over every axis (any TP pair, groups, token shards, DP ranks), seeded."""
    cases: list[TransferCase] = []
    while len(cases) < count:
        tps = [rng.choice((1, 2, 3, 4, 6, 8)) for _ in range(2)]
        sides = [_sample_layout(rng, tp) for tp in tps]
        heads = rng.choice([1, 2, 3, 4, 6, 12])
        num_layers = rng.randint(1, 4)
        model = ModelShape(num_layers, heads, rng.randint(1, 3))
        layouts = []
        for tp, side in zip(tps, sides, strict=True):
            pp = rng.randint(1, min(2, num_layers))
            layouts.append(StageLayout(tp, pp, **side))
        seq_len = rng.randint(4, 12) if any(x.token_shards > 1 for x in layouts) else None
        dp_ranks = [rng.randrange(x.dp) for x in layouts]
        case = TransferCase(layouts[0], layouts[1], model, "lowest", seq_len, *dp_ranks)
        try:
            case.plan()
        except ValueError:
            continue
        cases.append(case)
    return cases


# ownership ----------------------------------------------------------------------------
def _export_ownership(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, case in enumerate([*PINNED, *_sample_cases(rng, 30, max_layers=64)]):
        for side, layout in (("source", case.source), ("target", case.target)):
            cases.append(
                {
                    "id": f"ownership-{i:03d}-{side}",
                    "clauses": ["STAGE-1", "HEAD-1", "HEAD-2", "HEAD-3", "LAYER-1", "LAYER-2"],
                    "layout": layout.to_dict(),
                    "model": case.model.to_dict(),
                    "ranks": [
                        {
                            "rank": r.rank,
                            "pp_rank": r.pp_rank,
                            "tp_rank": r.tp_rank,
                            "heads": _span(r.heads),
                            "layers": _span(r.layers),
                        }
                        for r in stage_ownership(layout, case.model)
                    ],
                }
            )
    return cases + _export_groups(len(PINNED) + 30), {}


def _export_groups(start: int) -> list[Case]:
    """Ownership of layouts with attention groups and token shards [STAGE-2, CP-3]."""
    cases = []
    for i, case in enumerate(PARALLEL, start):
        for side, layout in (("source", case.source), ("target", case.target)):
            if layout.first_release:
                continue
            cases.append(
                {
                    "id": f"ownership-{i:03d}-{side}",
                    "clauses": ["STAGE-1", "STAGE-2", "HEAD-1", "HEAD-2", "HEAD-3", "CP-3"],
                    "layout": layout.to_dict(),
                    "model": case.model.to_dict(),
                    "ranks": [
                        {
                            "rank": r.rank,
                            "pp_rank": r.pp_rank,
                            "tp_rank": r.tp_rank,
                            "heads": _span(r.heads),
                            "layers": _span(r.layers),
                        }
                        for r in stage_ownership(layout, case.model)
                    ],
                }
            )
    return cases


def _check_ownership(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    layout, model = StageLayout.from_dict(case["layout"]), ModelShape.from_dict(case["model"])
    if not adapter.domain.holds_stage(layout, model):
        raise NotApplicable("outside the adapter's declared domain")
    for expected in case["ranks"]:
        heads, layers = adapter.owned(layout, model, expected["rank"])
        got = [[min(heads, default=0), max(heads, default=-1) + 1], [layers[0], layers[-1] + 1]]
        if got != [expected["heads"], expected["layers"]] or len(heads) != len(range(*got[0])):
            return f"rank {expected['rank']}: heads/layers {got}, expected {expected}"
    return None


# tokens -------------------------------------------------------------------------------
TOKEN_LAYOUTS: tuple[tuple[StageLayout, ModelShape], ...] = tuple(
    (StageLayout(tp, dp=dp, cp=cp, dcp=dcp, cp_rule=rule), ModelShape(1, heads, 1))
    for tp, dp, cp, dcp, heads, rule in (
        (4, 1, 2, 1, 4, "contiguous"),
        (4, 1, 4, 1, 2, "contiguous:4"),
        (6, 1, 3, 1, 2, "interleave:1"),
        (4, 1, 2, 1, 2, "interleave:16"),
        (8, 1, 2, 1, 4, "round_robin_blocks:8"),
        (4, 1, 2, 1, 2, "zigzag"),
        (8, 1, 4, 1, 2, "zigzag"),
        (8, 1, 1, 2, 4, "interleave:1"),
        (8, 1, 1, 4, 1, "interleave:16"),
        (8, 1, 2, 2, 1, "contiguous:16"),
        (12, 1, 1, 4, 2, "interleave:2"),
        (8, 2, 2, 1, 2, "round_robin_blocks:4"),
    )
)
"""Token rules over the cp axis, DCP, both, and beside attention DP [CP-1, CP-3]."""


def _export_tokens(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, (layout, model) in enumerate(TOKEN_LAYOUTS):
        for seq_len in sorted({2 * layout.token_shards, rng.randint(1, 40), rng.randint(41, 99)}):
            if seq_len < layout.min_tokens:
                continue
            owners = stage_ownership(layout, model, seq_len=seq_len)
            cases.append(
                {
                    "id": f"tokens-{i:03d}-{seq_len}",
                    "clauses": ["CP-1", "CP-3", "STAGE-2"],
                    "layout": layout.to_dict(),
                    "model": model.to_dict(),
                    "seq_len": seq_len,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "token_shard": layout.token_shard(r.rank),
                            "tokens": (
                                Tokens.span(0, seq_len) if r.tokens is None else r.tokens
                            ).to_list(),
                        }
                        for r in owners
                    ],
                }
            )
    return cases, {}


def _check_tokens(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    layout, model = StageLayout.from_dict(case["layout"]), ModelShape.from_dict(case["model"])
    if not adapter.domain.holds_stage(layout, model):
        raise NotApplicable("outside the adapter's declared domain")
    for expected in case["ranks"]:
        got = as_tokens(adapter.owned_tokens(layout, model, expected["rank"], case["seq_len"]))
        if got.to_list() != expected["tokens"]:
            return f"rank {expected['rank']}: tokens {got.to_list()}, expected {expected['tokens']}"
    return None


# plan ---------------------------------------------------------------------------------
def _export_plan(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, case in enumerate([*PINNED, *_sample_cases(rng, 40)]):
        plan = case.plan()
        cases.append(
            {
                "id": f"plan-{i:03d}",
                "clauses": ["PLAN-2", "PLAN-3", "PLAN-4", "PLAN-5", "SLICE-1"],
                **case.to_dict(),
                "edges": [e.to_dict() for e in plan.edges],
            }
        )
    more = random.Random(f"{rng.random()}:parallel")
    for i, case in enumerate([*PARALLEL, *_sample_parallel(more, 20)], len(cases)):
        cases.append(
            {
                "id": f"plan-{i:03d}",
                "clauses": ["PLAN-1", "PLAN-2", "PLAN-3", "PLAN-4", "PLAN-5", "PLAN-6", "DP-1"],
                **case.to_dict(),
                "edges": [e.to_dict() for e in case.plan().edges],
            }
        )
    return cases, {}


def _check_plan(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    if not adapter.domain.holds(transfer) or not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    for dst in transfer.target.ranks():
        expected = sorted(e["src"] for e in case["edges"] if e["dst"] == dst)
        got = list(adapter.sources(transfer, dst))
        if got != expected:
            return f"target rank {dst} takes KV from {got}, expected {expected}"
    return None


# errors -------------------------------------------------------------------------------
def _export_errors(rng: random.Random) -> tuple[list[Case], Tensors]:
    return [
        {"id": f"error-{c.id}", "clause": c.clause, "op": c.op, "args": c.args, "match": c.match}
        for c in ERROR_CASES
    ], {}


_SECOND_RELEASE_AXES = {"cp": "cp_sizes", "dcp": "dcp_sizes", "dp": "dp_sizes"}


def _outside(adapter: Adapter, args: dict[str, Any]) -> str | None:
    """Why a transfer configuration uses an axis the adapter's domain leaves out, or None."""
    domain = adapter.domain
    for side in ("source", "target"):
        layout = args.get(side, {})
        for key, sizes in _SECOND_RELEASE_AXES.items():
            if layout.get(key, 1) != 1 and max(getattr(domain, sizes)) == 1:
                return f"{side} {key} is outside the adapter's domain"
    tps = (args["source"].get("tp"), args["target"].get("tp"))
    positive = all(isinstance(t, int) and t > 0 for t in tps)
    if positive and not divides(*tps) and not domain.non_dividing_tp:
        return "TP pairs that do not divide are outside the adapter's domain"
    return None


def _check_errors(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    if case["op"] != "transfer":
        raise NotApplicable(f"operation {case['op']!r} has no adapter capability")
    why = _outside(adapter, case["args"])
    if why:
        raise NotApplicable(why)
    method = validator_for(case["clause"])
    capability = VALIDATORS[method]
    if capability not in provided_capabilities(adapter):
        raise NotApplicable(f"needs {capability}")
    try:
        getattr(adapter, method)(case["args"])
    except Exception:
        return None
    return f"accepted {case['args']}, which breaks {case['clause']}"


# reshard ------------------------------------------------------------------------------
def _export_reshard(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    chosen = [*PINNED[:3], PINNED[4], PINNED[5], *_sample_cases(rng, 10, max_layers=4)]
    more = random.Random(f"{rng.random()}:parallel")
    chosen += [*PARALLEL, *_sample_parallel(more, 6)]
    for i, case in enumerate(chosen):
        key = f"reshard-{i:03d}"
        # A sharded case has its seq_len [PLAN-6].
        seq_len = cast(int, case.seq_len) if case.sharded else 1 + i % 3
        full = random_request_kv(case.model, seq_len, seed=i)
        plan = case.plan()
        tensors[f"{key}/full"] = full.data
        if full.scales is not None:
            tensors[f"{key}/full_scales"] = full.scales
        targets = shard(full, case.target, case.model, dp_rank=case.target_dp)
        held = [plan.sources_of(dst) != () for dst in case.target.ranks()]
        for dst, kv in enumerate(targets):
            if held[dst]:
                tensors[f"{key}/target/{dst}"] = kv.data.contiguous()
        edges = []
        sources = shard(full, case.source, case.model, dp_rank=case.source_dp)
        for src, local in enumerate(sources):
            for slicing in ("sender", "receiver"):
                for s in send(plan, src, local, slicing=slicing):
                    tensors[f"{key}/edge/{src}-{s.edge.dst}/{slicing}"] = s.kv.data.contiguous()
            edges += [e.to_dict() for e in plan.edges_from(src)]
        cases.append(
            {
                "id": key,
                "clauses": ["RESHARD-1", "RESHARD-2", "SLICE-1", "SLICE-2", "DTYPE-2", "DTYPE-3"],
                **case.to_dict(),
                "seq_len": seq_len,
                "tensors": {
                    "full": f"{key}/full",
                    "full_scales": f"{key}/full_scales" if full.scales is not None else None,
                    "targets": [
                        f"{key}/target/{d}" if held[d] else None for d in range(len(targets))
                    ],
                    "edges": {
                        f"{e['src']}-{e['dst']}": {
                            s: f"{key}/edge/{e['src']}-{e['dst']}/{s}"
                            for s in ("sender", "receiver")
                        }
                        for e in edges
                    },
                },
                "edges": edges,
            }
        )
    return cases, tensors


def _check_reshard(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if not adapter.domain.holds(transfer) or not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    names = case["tensors"]
    scales = tensors[names["full_scales"]] if names["full_scales"] else None
    full = RequestKV(tensors[names["full"]], scales)
    sources = shard(full, transfer.source, transfer.model, dp_rank=transfer.source_dp)
    targets = shard(full, transfer.target, transfer.model, dp_rank=transfer.target_dp)
    plan = transfer.plan()
    for slicing in adapter.slicing_modes:
        inbox: dict[int, list[Shipment]] = {t: [] for t in transfer.target.ranks()}
        for src in transfer.source.ranks():
            for dst, kv in adapter.sender_transform(transfer, src, sources[src], slicing).items():
                edge = plan.edge(src, dst)
                want = tensors[names["edges"][f"{src}-{dst}"][slicing]]
                if not torch.equal(kv.data.contiguous().view(torch.uint8), want.view(torch.uint8)):
                    return f"edge {src}->{dst} ({slicing}-side) differs from the vector"
                marker = edge_marker(plan, edge, applied=slicing == "sender")
                inbox[dst].append(Shipment(edge, marker, kv))
        if "receiver" in provided_capabilities(adapter):
            marks = "marker" in provided_capabilities(adapter)
            for dst in transfer.target.ranks():
                if names["targets"][dst] is None:
                    continue  # holds none of the request
                received = [
                    adapter.apply_marker(transfer, dst, s) if marks else s for s in inbox[dst]
                ]
                got = adapter.receiver_combine(transfer, dst, received)
                problem = difference(got, targets[dst])
                if problem:
                    return f"target rank {dst} ({slicing}-side): {problem}"
    return None


# cache layouts ------------------------------------------------------------------------
def _layer_tensors(key: str, cache: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A layer cache's tensors by key, and its manifest entry ``{"tensors", "tuple"}``."""
    parts = cache if isinstance(cache, tuple) else (cache,)
    names = [f"{key}/cache/{i}" for i in range(len(parts))]
    return dict(zip(names, parts, strict=True)), {
        "tensors": names,
        "tuple": isinstance(cache, tuple),
    }


def _load_layer(tensors: Tensors, entry: dict[str, Any]) -> Any:
    parts = tuple(tensors[n].clone() for n in entry["tensors"])
    return parts if entry["tuple"] else parts[0]


def _export_layouts(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = [(2, 2, 4, 2, 3), (2, 3, 2, 2, 3), (2, 5, 3, 1, 2), (1, 3, 2, 1, 4), (2, 4, 1, 3, 2)]
    i = 0
    for kv, blocks, block_size, heads, dim in shapes:
        for name, spec in LAYOUTS.items():
            if spec.kv_tensors not in (None, kv):
                continue
            shape = CacheShape(kv, blocks, block_size if spec.paged else 1, heads, dim)
            cache = empty_cache(name, shape, "bfloat16")
            page = shape.block_size if spec.merged_tokens else None  # not in a pool's shape
            for view in kv_views(cache, name, block_size=page):
                bits = bits_view(view)
                bits.copy_(
                    torch.randint(
                        -(2**15), 2**15 - 1, bits.shape, generator=generator, dtype=torch.int16
                    )
                )
            key = f"layouts-{i:03d}"
            i += 1
            layer, names = _layer_tensors(key, cache)
            tensors.update(layer)
            views = kv_views(cache, name, block_size=page)
            read = [f"{key}/read/{k}" for k in range(len(views))]
            tensors.update(dict(zip(read, (v.contiguous() for v in views), strict=True)))
            known = {"heads": heads, "head_dim": dim}
            try:
                detected: str | None = detect_layout(cache, **known)
            except ValueError:
                detected = None
            cases.append(
                {
                    "id": key,
                    "clauses": ["LAYOUT-1", "LAYOUT-2", "LAYOUT-4"],
                    "layout": name,
                    "shape": {
                        "kv": kv,
                        "num_blocks": blocks,
                        "block_size": shape.block_size,
                        "heads": heads,
                        "head_dim": dim,
                    },
                    "cache": names,
                    "page_size": page,
                    "read": read,
                    "detect": {"known": known, "answer": detected},
                }
            )
    return cases, tensors


def _check_layouts(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    cache = _load_layer(tensors, case["cache"])
    provided = provided_capabilities(adapter)
    if "layouts" in provided:
        page = case.get("page_size")
        got = adapter.read_layer(cache, case["layout"], **({"page_size": page} if page else {}))
        for k, name in enumerate(case["read"]):
            if k >= len(got) or not torch.equal(
                bits_view(got[k].contiguous()), bits_view(tensors[name])
            ):
                return f"reading it as {case['layout']} gives a different tensor {k}"
    if "detection" in provided:
        try:
            answer: str | None = adapter.detect_layout(cache, **case["detect"]["known"])
        except Exception:
            answer = None
        if answer != case["detect"]["answer"]:
            return (
                f"detection said {answer!r}, expected {case['detect']['answer']!r} (null = refuse)"
            )
    return None


# paged requests -----------------------------------------------------------------------
def _export_paged(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    for i in range(12):
        attention = "mla" if i % 4 == 3 else "mha"
        layout = rng.choice(layouts_for(attention))
        block_size = rng.randint(1, 5) if get_layout(layout).paged else 1
        seq_len = rng.randint(1, 12)
        needed = -(-seq_len // block_size)
        num_blocks = needed + rng.randint(0, 3)
        ids = rng.sample(range(num_blocks), needed)
        dtype = rng.choice(["bfloat16", "float16", "float8_e4m3fn"])
        model = (
            ModelShape.mla(2, 3, dtype=dtype)
            if attention == "mla"
            else ModelShape(2, rng.randint(1, 3), rng.randint(1, 3), dtype=dtype)
        )
        scales = oracle_scales(model) if model.dtype in FP8_DTYPES else None
        cache = empty_model_cache(
            layout, model, num_blocks=num_blocks, block_size=block_size, scales=scales
        )
        filler = oracle_kv(model, f"fill-{i}", tokens=num_blocks * block_size)
        scatter_request(filler, cache, list(range(num_blocks)))
        key = f"paged-{i:03d}"
        layers = []
        for j, layer in enumerate(cache.layers):
            part, names = _layer_tensors(f"{key}/layer/{j}", layer)
            tensors.update(part)
            layers.append(names)
        tensors[f"{key}/gathered"] = gather_request(cache, ids, seq_len).data
        if scales is not None:
            tensors[f"{key}/scales"] = scales
        cases.append(
            {
                "id": key,
                "clauses": ["PAGED-1", "PAGED-2", "PAGED-3", "PAGED-4"],
                "layout": layout,
                "model": model.to_dict(),
                "block_size": block_size,
                "num_blocks": num_blocks,
                "block_ids": ids,
                "seq_len": seq_len,
                "layers": layers,
                "scales": f"{key}/scales" if scales is not None else None,
                "gathered": f"{key}/gathered",
                "refuse": [[*ids[:-1], num_blocks], [ids[0], *ids]],
            }
        )
    return cases, tensors


def _check_paged(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    scales = tensors[case["scales"]] if case["scales"] else None
    cache = PagedCache(
        case["layout"],
        tuple(_load_layer(tensors, names) for names in case["layers"]),
        scales,
        block_size=case["block_size"],
    )
    got = adapter.gather(cache, list(case["block_ids"]), case["seq_len"])
    if not torch.equal(bits_view(got.data.contiguous()), bits_view(tensors[case["gathered"]])):
        return "the gathered request differs from the vector"
    for bad in case["refuse"]:
        try:
            adapter.gather(cache, list(bad), case["seq_len"])
        except Exception:
            continue
        return f"gather with block ids {bad} was accepted"
    return None


# records with inline scales -----------------------------------------------------------
def _export_records(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = [(2, 3, 2, 4), (3, 2, 3, 8), (1, 4, 1, 4)]
    for i, (layout, (blocks, block_size, heads, dim)) in enumerate(
        (name, shape) for name in RECORDS for shape in shapes
    ):
        spec = get_layout(layout)
        kv = spec.kv_tensors or 2
        shape = CacheShape(
            kv, blocks, block_size, 1 if kv == 1 else heads, spec.fixed_head_dim or dim
        )
        assert spec.dtypes is not None
        cache = empty_cache(layout, shape, spec.dtypes[0])
        assert isinstance(cache, torch.Tensor)
        raw = cache.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
        key = f"records-{i:03d}"
        tensors[f"{key}/cache"] = raw.clone()
        fields = {}
        for name, view in field_views(cache, layout).items():
            fields[name] = f"{key}/field/{name}"
            tensors[fields[name]] = bits_view(view.contiguous()).clone()
        cases.append(
            {
                "id": key,
                "clauses": ["LAYOUT-5", "LAYOUT-6"],
                "layout": layout,
                "dtype": spec.dtypes[0],
                "shape": {
                    "kv": kv,
                    "num_blocks": blocks,
                    "block_size": block_size,
                    "heads": shape.heads,
                    "head_dim": shape.head_dim,
                },
                "cache": f"{key}/cache",
                "fields": fields,
            }
        )
    return cases, tensors


def _check_records(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    spec = get_layout(case["layout"])
    element = torch_dtype(case["dtype"]) if spec.element is None else torch.uint8
    cache = tensors[case["cache"]].clone().view(element)
    got = adapter.read_fields(cache, case["layout"])
    if sorted(got) != sorted(case["fields"]):
        return f"read fields {sorted(got)}, expected {sorted(case['fields'])}"
    for name, key in case["fields"].items():
        if not torch.equal(bits_view(got[name].contiguous()), tensors[key]):
            return f"field {name} differs from the vector"
    return None


# descriptors --------------------------------------------------------------------------
DESC_LAYOUT_PAIRS = (
    ("vllm_pth_hnd", "vllm_pth_nhd"),
    ("vllm_packed_hnd", "sglang_mha"),
    ("flash_attn", "vllm_packed_nhd"),
    ("vllm_packed_hnd_layers", "trtllm_pool"),
    ("flashinfer_hnd", "kv_tuple"),
    ("mla", "sglang_mla"),
)


def _export_descriptors(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    chosen = [
        PINNED[0],
        PINNED[2],
        PINNED[3],
        PINNED[4],
        PINNED[5],
        *_sample_cases(rng, 4, max_layers=3),
    ]
    for i, case in enumerate(chosen):
        attention = case.model.attention
        pairs = [
            p for p in DESC_LAYOUT_PAIRS if get_layout(p[0]).kv_tensors == case.model.kv_tensors
        ]
        src_layout, dst_layout = pairs[i % len(pairs)]
        model = case.model
        if get_layout(src_layout).dtypes:  # an inline-scale record holds fp8
            model = ModelShape(model.num_layers, model.num_kv_heads, 4, dtype="float8_e4m3fn")
            case = TransferCase(case.source, case.target, model, case.policy)
        plan = case.plan()
        edge = plan.edges[rng.randrange(len(plan.edges))]
        seq_len = rng.randint(1, 12)
        start = rng.randrange(seq_len)
        sides = []
        for layout, stage, rank in (
            (src_layout, case.source, edge.src),
            (dst_layout, case.target, edge.dst),
        ):
            owner = stage_ownership(stage, model)[rank]
            spec = get_layout(layout)
            block_size = rng.randint(1, 5) if spec.paged else 1
            needed = -(-seq_len // block_size)
            num_blocks = needed + rng.randint(0, 2)
            registered = RegisteredCache(
                layout,
                len(owner.layers),
                num_blocks,
                block_size,
                len(owner.heads),
                model.head_dim,
                spec.dtypes[0] if spec.dtypes else model.dtype,
                tensors_per_layer=model.kv_tensors,
            )
            sides.append((registered, rng.sample(range(num_blocks), needed)))
        made = plan_descriptors(
            plan, edge, sides[0][0], sides[0][1], sides[1][0], sides[1][1], range(start, seq_len)
        )
        cases.append(
            {
                "id": f"descriptors-{i:03d}",
                "clauses": ["DESC-1", "DESC-2", "DESC-3"],
                **case.to_dict(),
                "attention": attention,
                "edge": [edge.src, edge.dst],
                "tokens": [start, seq_len],
                "src_cache": {**sides[0][0].to_dict(), "block_ids": sides[0][1]},
                "dst_cache": {**sides[1][0].to_dict(), "block_ids": sides[1][1]},
                "regions": {
                    "source": sides[0][0].regions(),
                    "target": sides[1][0].regions(),
                },
                "descriptors": [d.to_list() for d in made.descriptors],
                "share_bytes": made.share_bytes,
            }
        )
    return cases, {}


def _registered(entry: dict[str, Any]) -> tuple[RegisteredCache, list[int]]:
    data = {k: v for k, v in entry.items() if k != "block_ids"}
    return RegisteredCache.from_dict(data), list(entry["block_ids"])


def _check_descriptors(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    (source, source_ids), (target, target_ids) = (
        _registered(case["src_cache"]),
        _registered(case["dst_cache"]),
    )
    reference = plan_descriptors(
        transfer.plan(),
        transfer.plan().edge(*case["edge"]),
        source,
        source_ids,
        target,
        target_ids,
        range(*case["tokens"]),
    )
    if [d.to_list() for d in reference.descriptors] != case["descriptors"]:
        return "the vector's list is not the spec's (regenerate the vectors)"
    src, dst = case["edge"]  # a pair: plan().edge(*case["edge"]) took it above
    got = adapter.descriptors(
        transfer, src, dst, source, source_ids, target, target_ids, range(*case["tokens"])
    )
    verdict = judge_descriptors(list(got), reference)
    if not verdict.ok:
        return verdict.problems[0]
    if adapter.coalesces and verdict.count != verdict.minimum:
        return f"{verdict.count} descriptors; the minimum is {verdict.minimum} [DESC-3.1]"
    return None


# oracle -------------------------------------------------------------------------------
def _export_oracle(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    for i, dtype in enumerate(
        ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"] * 2
    ):
        model = (
            ModelShape.mla(3, 4, dtype=dtype)
            if i >= 5 and i % 2
            else ModelShape(3, 4, 3, dtype=dtype)
        )
        request_id = f"req_{i}-x"
        seed = rng.randrange(2**31)
        region = {"tokens": [2, 9], "layers": [1, 3], "heads": [0, model.num_kv_heads]}
        ranges: dict[str, Any] = {k: range(*v) for k, v in region.items()}
        kv = oracle_kv(model, request_id, seed=seed, **ranges)
        key = f"oracle-{i:03d}"
        tensors[f"{key}/data"] = kv.data
        if kv.scales is not None:
            tensors[f"{key}/scales"] = kv.scales
        cases.append(
            {
                "id": key,
                "clauses": ["ORACLE-1", "ORACLE-2", "ORACLE-3", "ORACLE-4"],
                "model": model.to_dict(),
                "request_id": request_id,
                "seed": seed,
                "region": region,
                "data": f"{key}/data",
                "scales": f"{key}/scales" if kv.scales is not None else None,
            }
        )
    for i, (layout, _) in enumerate(TOKEN_LAYOUTS[:6], len(cases)):
        # a context-parallel rank's token set: its k-th entry is its k-th token [ORACLE-4]
        model = ModelShape(2, 2, 2, dtype=rng.choice(["bfloat16", "float8_e5m2"]))
        tokens = layout.rule.tokens(1, layout.token_shards, 37)
        request_id, seed = f"req_{i}-cp", rng.randrange(2**31)
        kv = oracle_kv(model, request_id, seed=seed, tokens=tokens, layers=range(2))
        key = f"oracle-{i:03d}"
        tensors[f"{key}/data"] = kv.data
        if kv.scales is not None:
            tensors[f"{key}/scales"] = kv.scales
        cases.append(
            {
                "id": key,
                "clauses": ["ORACLE-1", "ORACLE-4", "CP-1"],
                "model": model.to_dict(),
                "request_id": request_id,
                "seed": seed,
                "region": {"tokens": tokens.to_list(), "layers": [0, 2], "heads": [0, 2]},
                "data": f"{key}/data",
                "scales": f"{key}/scales" if kv.scales is not None else None,
            }
        )
    return cases, tensors


def _check_oracle(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    model = ModelShape.from_dict(case["model"])
    region: dict[str, Any] = {
        k: Tokens.from_list(v) if v and isinstance(v[0], list) else range(*v)
        for k, v in case["region"].items()
    }
    got = adapter.oracle_fill(model, case["request_id"], seed=case["seed"], **region)
    if not torch.equal(bits_view(got.data.contiguous()), bits_view(tensors[case["data"]])):
        return "the fill differs from the vector"
    return None


# keys and ports -------------------------------------------------------------------------
def _export_keys(rng: random.Random) -> tuple[list[Case], Tensors]:
    ids = ["req_7", "5_0_0_0_0", "chatcmpl-7f3a", "a_b_c", "omni", "0", "ü_名_0", "x-1"]
    cases: list[Case] = []
    for i, request_id in enumerate(ids):
        fields = {
            "from_stage": rng.randint(0, 3),
            "chunk_id": rng.randint(0, 2),
            "from_rank": rng.randint(0, 15),
            "to_rank": rng.randint(0, 15),
        }
        cases.append(
            {
                "id": f"key-{i:03d}",
                "clauses": ["KEY-1", "KEY-3"],
                "kind": "rank_aware",
                "args": {"request_id": request_id, **fields},
                "key": rank_aware_key(request_id, **fields),
            }
        )
        stages = {"from_stage": rng.randint(0, 3), "to_stage": rng.randint(0, 3)}
        cases.append(
            {
                "id": f"key-legacy-{i:03d}",
                "clauses": ["KEY-2", "KEY-3"],
                "kind": "legacy",
                "args": {"request_id": request_id, **stages},
                "key": legacy_key(request_id, **stages),
            }
        )
    refused = [
        {
            "request_id": "omni_0_to_1_kv_cache_5",
            "from_stage": 0,
            "chunk_id": 0,
            "from_rank": 0,
            "to_rank": 0,
        },
        {"request_id": "", "from_stage": 0, "chunk_id": 0, "from_rank": 0, "to_rank": 0},
        {"request_id": "r", "from_stage": -1, "chunk_id": 0, "from_rank": 0, "to_rank": 0},
        {"request_id": "r", "from_stage": "0_1", "chunk_id": 0, "from_rank": 0, "to_rank": 0},
    ]
    cases += [
        {
            "id": f"key-refused-{i:03d}",
            "clauses": ["KEY-3"],
            "kind": "rank_aware",
            "args": args,
            "key": None,
        }
        for i, args in enumerate(refused)
    ]
    return cases, {}


def _check_keys(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    make = adapter.rank_aware_key if case["kind"] == "rank_aware" else adapter.legacy_key
    try:
        got = make(**case["args"])
    except Exception as error:
        return None if case["key"] is None else f"refused {case['args']}: {error!r}"
    if got != case["key"]:
        return f"{case['kind']} key of {case['args']} is {got!r}, expected {case['key']!r}"
    return None


def _export_ports(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i in range(24):
        args: dict[str, Any] = {
            "base": rng.choice([20000, 50000, 65000]),
            "stage": rng.randint(0, 18),
            "rank": rng.randint(0, 70),
            "replica": rng.randint(0, 3),
        }
        try:
            number: int | None = port("kv", **args)
        except ValueError:
            number = None
        cases.append(
            {"id": f"port-{i:03d}", "clauses": ["PORT-1", "PORT-2"], "args": args, "port": number}
        )
    for i in range(12):  # ranks of stages with attention-DP groups [PORT-1, STAGE-2]
        layout = StageLayout(rng.choice([4, 8]), rng.randint(1, 2), dp=rng.choice([2, 4]))
        scheme = PortScheme(dp_stride=rng.choice([None, 4096]))
        args = {
            "base": rng.choice([20000, 50000]),
            "stage": rng.randint(0, 15),
            "rank": rng.randrange(layout.world_size),
            "replica": rng.randint(0, 1),
        }
        try:
            number = rank_port("kv", layout=layout, scheme=scheme, **args)
        except ValueError:
            number = None
        cases.append(
            {
                "id": f"port-dp-{i:03d}",
                "clauses": ["PORT-1", "PORT-2", "STAGE-2"],
                "args": args,
                "layout": layout.to_dict(),
                "dp_stride": scheme.dp_stride,
                "port": number,
            }
        )
    return cases, {}


def _check_ports(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    try:
        if "layout" in case:
            if "dp-ports" not in provided_capabilities(adapter):
                raise NotApplicable("needs dp-ports")
            got = adapter.stage_port(
                layout=StageLayout.from_dict(case["layout"]),
                scheme=PortScheme(dp_stride=case["dp_stride"]),
                **case["args"],
            )
        else:
            got = adapter.kv_port(**case["args"])
    except NotApplicable:
        raise
    except Exception as error:
        return None if case["port"] is None else f"refused {case['args']}: {error!r}"
    if got != case["port"]:
        return f"KV port of {case['args']} is {got}, expected {case['port']} (null = refuse)"
    return None


# wire ---------------------------------------------------------------------------------
def _export_wire(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    for i, case in enumerate(
        [PINNED[0], PINNED[2], PINNED[5], *_sample_cases(rng, 3, max_layers=3)]
    ):
        plan = case.plan()
        full = random_request_kv(case.model, 2 + i % 2, seed=i)
        src = plan.edges[0].src
        shipment = send(plan, src, shard(full, case.source, case.model)[src])[0]
        payload = payload_from_shipment(plan, shipment, f"req_{i}", block_size=16, block_ids=[i])
        key = f"wire-{i:03d}"
        frames = [bytes(f) for f in encode(payload)]
        names = []
        for j, frame in enumerate(frames):
            names.append(f"{key}/frame/{j}")
            tensors[names[-1]] = (
                torch.frombuffer(bytearray(frame), dtype=torch.uint8)
                if frame
                else torch.zeros(0, dtype=torch.uint8)
            )
        tensors.update(
            {f"{key}/{name}/{layer}": t.contiguous() for name, layer, t in payload.tensors()}
        )
        cases.append(
            {
                "id": key,
                "clauses": ["WIRE-1", "WIRE-3", "PAYLOAD-1"],
                "frames": names,
                "request_id": payload.request_id,
                "metadata": payload.metadata(),
                "tensors": {
                    f"{name}/{layer}": f"{key}/{name}/{layer}"
                    for name, layer, _ in payload.tensors()
                },
            }
        )
    return cases, tensors


def _check_wire(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    frames = [tensors[n].numpy().tobytes() for n in case["frames"]]
    got = adapter.decode(frames)
    if got.request_id != case["request_id"] or got.metadata() != case["metadata"]:
        return "the decoded header differs from the vector"
    for name, layer, t in got.tensors():
        want = tensors[case["tensors"][f"{name}/{layer}"]]
        if not torch.equal(bits_view(t.contiguous()), bits_view(want)):
            return f"decoded {name}[{layer}] differs from the vector"
    if len(got.tensors()) != len(case["tensors"]):
        return f"decoded {len(got.tensors())} tensors, expected {len(case['tensors'])}"
    return None


# hybrid models: group plans, windows, state reads, state layouts --------------------------
def _small_state(rng: random.Random, kind: str) -> dict[str, Any]:
    """A small state group's plain data; units are powers of two, so TP 1, 2 and 4 hold it."""
    pow2 = [1, 2, 4, 8]
    if kind == "mamba1":
        return {
            "kind": kind,
            "intermediate_size": rng.choice([4, 8]),
            "d_state": rng.randint(1, 3),
            "conv_kernel": rng.randint(2, 4),
        }
    if kind == "mamba2":
        groups = rng.choice(pow2[:3])
        return {
            "kind": kind,
            "num_heads": groups * rng.choice([1, 2, 4]),
            "head_dim": rng.randint(1, 3),
            "n_groups": groups,
            "d_state": rng.randint(1, 3),
            "conv_kernel": rng.randint(2, 4),
            "num_spec": rng.randint(0, 1),
            "ssm_dtype": rng.choice([None, "float32"]),
        }
    k_heads = rng.choice(pow2[:3])
    return {
        "kind": "gdn",
        "num_k_heads": k_heads,
        "num_v_heads": k_heads * rng.choice([1, 2]),
        "head_k_dim": rng.randint(1, 3),
        "head_v_dim": rng.randint(1, 3),
        "conv_kernel": rng.randint(2, 4),
    }


def _small_hybrids(rng: random.Random, count: int) -> list[ModelShape]:
    """Small hybrids: own attention, a sliding window and one state group, the state's dtypes
    kept aligned in a page (an even conv state before an fp32 temporal state)."""
    models: list[ModelShape] = []
    while len(models) < count:
        kind = rng.choice(["mamba1", "mamba2", "gdn"])
        state = _small_state(rng, kind)
        window = {"kind": "sliding", "num_kv_heads": rng.choice([1, 2, 4]), "head_dim": 2}
        window["window"] = rng.randint(1, 24)
        num_layers = rng.randint(3, 6)
        layers = [0, 1, 2] + [rng.randint(0, 2) for _ in range(num_layers - 3)]
        rng.shuffle(layers)
        model = ModelShape(
            num_layers,
            rng.choice([1, 2, 4]),
            2,
            groups=(group_from_dict(window), group_from_dict(state)),
            layers=tuple(layers),
        )
        try:
            for tp, rank in ((1, 0), (2, 1), (4, 3)):
                state_page("vllm_conv_ds", model, 2, attn_tp=tp, attn_tp_rank=rank)
        except ValueError:
            continue
        models.append(model)
    return models


def _hybrid_cases(rng: random.Random) -> list[tuple[TransferCase, int, int]]:
    """(case, seq_len, block_size): every model preset TP1 -> TP4 and back, then small
    hybrids over TP 1, 2, 4 and PP 1, 2."""
    found = []
    for name in MODEL_PRESETS:
        model = model_preset(name)
        for source, target in ((1, 4), (4, 1)):
            found.append((TransferCase(StageLayout(source), StageLayout(target), model), 1000, 16))
    for model in _small_hybrids(rng, 16):
        sender = StageLayout(rng.choice([1, 2, 4]), rng.choice([1, 2]))
        receiver = StageLayout(rng.choice([1, 2, 4]), rng.choice([1, 2]))
        policy = rng.choice(["lowest", "balanced"])
        case = TransferCase(sender, receiver, model, policy)
        found.append((case, rng.randint(0, 80), rng.choice([1, 4, 16])))
    return found


def _chunked_cases(rng: random.Random) -> list[tuple[TransferCase, int, int]]:
    """(case, seq_len, block_size) of small models with a chunked local-attention group
    [LOCAL-1]: lengths inside a chunk, on a chunk boundary that is not a block boundary,
    and on one that is."""
    found = []
    for _ in range(8):
        chunk, block = rng.randint(2, 24), rng.choice([1, 4, 16])
        chunked = {"kind": "chunked", "num_kv_heads": rng.choice([1, 2, 4]), "head_dim": 2}
        model = ModelShape(
            4,
            rng.choice([1, 2, 4]),
            2,
            groups=(group_from_dict({**chunked, "chunk": chunk}),),
            layers=(1, 0, 1, 0),
        )
        source, target = rng.choice([(1, 4), (4, 1), (2, 4), (4, 2)])
        for seq_len in (rng.randint(1, 80), chunk * rng.randint(1, 3)):
            found.append(
                (TransferCase(StageLayout(source), StageLayout(target), model), seq_len, block)
            )
    return found


WINDOW_STATE = ModelShape(
    4,
    2,
    256,
    groups=(
        group_from_dict({"kind": "sliding", "num_kv_heads": 2, "head_dim": 256, "window": 128}),
        group_from_dict(
            {
                "kind": "mamba2",
                "num_heads": 32,
                "head_dim": 64,
                "n_groups": 2,
                "d_state": 64,
                "conv_kernel": 4,
            }
        ),
    ),
    layers=(0, 1, 2, 2),
)
"""A window beside a Mamba-2 state whose vLLM block size is 144 tokens at TP1 and 80 at
TP4 [BLOCK-1], so its P/D plans have two block sizes by construction [WINDOW-2]."""


def _block_size_cases(rng: random.Random) -> list[tuple[TransferCase, int, int, int, bool]]:
    """(case, seq_len, sender block size, receiver block size, derived) [WINDOW-2]: the
    window-and-state hybrid TP1 <-> TP4 at the block sizes vLLM derives per TP (planned one
    way, refused the other at some lengths), then small window and chunk models at drawn
    pairs of block sizes, some of which need evicted tokens."""
    found = []
    blocks = {tp: hybrid_block_size(WINDOW_STATE, tp) for tp in (1, 4)}
    for source, target in ((1, 4), (4, 1)):
        case = TransferCase(StageLayout(source), StageLayout(target), WINDOW_STATE)
        for seq_len in (100, 1000, rng.randint(129, 2000)):
            found.append((case, seq_len, blocks[source], blocks[target], True))
    for _ in range(6):
        kind = rng.choice(["sliding", "chunked"])
        group = {"kind": kind, "num_kv_heads": rng.choice([1, 2, 4]), "head_dim": 2}
        group["window" if kind == "sliding" else "chunk"] = rng.randint(2, 24)
        model = ModelShape(4, 2, 2, groups=(group_from_dict(group),), layers=(1, 0, 1, 0))
        source, target = rng.choice([(1, 4), (4, 1), (2, 4), (4, 2)])
        sender, receiver = rng.choice([(4, 8), (8, 4), (12, 8), (8, 12), (3, 16)])
        case = TransferCase(StageLayout(source), StageLayout(target), model)
        found.append((case, rng.randint(1, 80), sender, receiver, False))
    return found


def _needed_tokens(model: ModelShape, seq_len: int, block: int) -> tuple[list[dict], list[dict]]:
    """The tokens a receiver with ``block``-token blocks needs of each sliding-window and
    each chunked group, as the vectors record them [WINDOW-1, LOCAL-1]."""
    groups = list(enumerate(model.layer_groups))
    windows = [
        {
            "group": g,
            "window": group.window,
            "tokens": window_tokens(group.window, seq_len, block).to_list(),
        }
        for g, group in groups
        if isinstance(group, SlidingWindow)
    ]
    chunks = [
        {
            "group": g,
            "chunk": group.chunk,
            "tokens": chunk_tokens(group.chunk, seq_len, block).to_list(),
        }
        for g, group in groups
        if isinstance(group, ChunkedLocal)
    ]
    return windows, chunks


def _block_size_vectors(start: int, rng: random.Random) -> list[Case]:
    cases: list[Case] = []
    for i, (case, seq_len, sender, receiver, derived) in enumerate(_block_size_cases(rng)):
        entry: Case = {
            "id": f"groups-{start + i:03d}",
            "clauses": ["GROUP-3", "WINDOW-1", "LOCAL-1", "WINDOW-2"]
            + (["BLOCK-1"] if derived else []),
            **case.to_dict(),
            "seq_len": seq_len,
            "block_size": receiver,
            "source_block_size": sender,
        }
        entry["windows"], chunks = _needed_tokens(case.model, seq_len, receiver)
        if chunks:
            entry["chunks"] = chunks
        if derived:
            entry["derived_block_sizes"] = {
                str(layout.attn_tp): hybrid_block_size(case.model, layout.attn_tp)
                for layout in (case.source, case.target)
            }
        try:
            plan = plan_groups(
                case.source,
                case.target,
                case.model,
                seq_len=seq_len,
                source_block_size=sender,
                target_block_size=receiver,
            )
        except ValueError as error:
            entry["refused"] = str(error)
        else:
            entry["edges"] = [e.to_dict() for e in plan.edges]
        cases.append(entry)
    return cases


def _export_group_plans(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    # Chunked cases come last, from their own stream: the older cases stay as they were.
    older = _hybrid_cases(rng)
    more = _chunked_cases(random.Random(f"{rng.random()}:chunked"))
    for i, (case, seq_len, block) in enumerate(older + more):
        plan = plan_groups(
            case.source,
            case.target,
            case.model,
            seq_len=seq_len,
            block_size=block,
            policy=case.policy,
        )
        windows, chunks = _needed_tokens(case.model, seq_len, block)
        cases.append(
            {
                "id": f"groups-{i:03d}",
                "clauses": ["GROUP-1", "GROUP-2", "GROUP-3", "WINDOW-1", "STATE-1"]
                + (["LOCAL-1"] if chunks else []),
                **case.to_dict(),
                "seq_len": seq_len,
                "block_size": block,
                "windows": windows,
                **({"chunks": chunks} if chunks else {}),
                "edges": [e.to_dict() for e in plan.edges],
            }
        )
    # Two block sizes per plan come after those, from their own stream [WINDOW-2, BLOCK-1].
    cases += _block_size_vectors(len(cases), random.Random(f"{rng.random()}:block sizes"))
    return cases, {}


def _check_block_sizes(adapter: Adapter, case: Case, transfer: TransferCase) -> str | None:
    """A plan with the sender's and the receiver's own block sizes [WINDOW-2, BLOCK-1]."""
    for tp, want in case.get("derived_block_sizes", {}).items():
        try:
            derived = adapter.hybrid_block_size(transfer.model, int(tp), None)
        except NotProvided:
            break
        if derived != want:
            return f"block size at attention TP {tp}: {derived}, expected {want} [BLOCK-1]"
    sender, receiver = case["source_block_size"], case["block_size"]
    try:
        tokens = adapter.window_tokens(transfer, case["seq_len"], sender, receiver)
    except NotProvided:
        raise NotApplicable("the adapter gives no window tokens per block size") from None
    except ValueError as error:
        if "refused" in case:
            return None
        return f"blocks {sender} -> {receiver}: refused ({error}), expected a plan [WINDOW-2]"
    if "refused" in case:
        return (
            f"blocks {sender} -> {receiver}: planned, expected refused: {case['refused']} "
            "[WINDOW-2]"
        )
    kinds = transfer.model.layer_groups
    want = {
        (e["group"], e["src"], e["dst"]): [tuple(r) for r in e["tokens"]]
        for e in case["edges"]
        if isinstance(kinds[e["group"]], SlidingWindow | ChunkedLocal)
    }
    got = {k: [tuple(r) for r in v] for k, v in dict(tokens).items() if v}
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            return (
                f"blocks {sender} -> {receiver}: group {key[0]}, edge {key[1]} -> {key[2]} "
                f"carries {got.get(key)}, expected {want.get(key)} [WINDOW-2]"
            )
    return None


def _check_groups(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    if "source_block_size" in case:
        return _check_block_sizes(adapter, case, transfer)
    want = {(e["group"], e["src"], e["dst"]): e["nbytes"] for e in case["edges"]}
    got = dict(adapter.group_bytes(transfer, case["seq_len"], case["block_size"]))
    for key in sorted(set(want) | set(got)):
        if want.get(key, 0) != got.get(key, 0):
            group, src, dst = key
            return (
                f"group {group}, edge {src} -> {dst}: {got.get(key, 0)} bytes, expected "
                f"{want.get(key, 0)}"
            )
    return None


def _export_states(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, (case, _, _) in enumerate(_hybrid_cases(rng)):
        if case.model.num_layers > 8:
            continue  # the presets' states: their group plans are in the groups family
        group = 2
        state = cast(StateGroup, case.model.layer_groups[group])  # these hybrids' state
        reads = plan_state_reads(case.source, case.target, case.model, group, policy=case.policy)
        units = {
            side: [
                {
                    "rank": rank,
                    "units": {
                        k: [v.start, v.stop]
                        for k, v in part_units(
                            state, layout.attn_tp, layout.locate(rank).attn_tp_rank
                        ).items()
                    },
                }
                for rank in layout.ranks()
            ]
            for side, layout in (("source", case.source), ("target", case.target))
        }
        cases.append(
            {
                "id": f"states-{i:03d}",
                "clauses": ["STATE-1", "STATE-2"],
                **case.to_dict(),
                "group": group,
                "units": units,
                "reads": [
                    [r.src, r.dst, r.layer, r.part, r.src_offset, r.dst_offset, r.length]
                    for r in reads
                ],
            }
        )
    return cases, {}


def _check_states(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    group = case["group"]
    for side, layout in (("source", transfer.source), ("target", transfer.target)):
        for entry in case["units"][side]:
            held = adapter.state_units(layout, transfer.model, group, entry["rank"])
            have = {k: [v.start, v.stop] for k, v in held.items()}
            if have != entry["units"]:
                return f"{side} rank {entry['rank']} holds {have}, expected {entry['units']}"
    for dst in sorted({r[1] for r in case["reads"]}):
        want = sorted((r[0], r[2], r[4], r[5], r[6]) for r in case["reads"] if r[1] == dst)
        got = sorted(tuple(r) for r in adapter.state_reads(transfer, group, dst))
        if got != want:
            return f"receiver {dst} reads {got[:4]}..., expected {want[:4]}..."
    return None


def _export_state_layouts(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, model in enumerate(_small_hybrids(rng, 12)):
        tp = rng.choice([1, 2, 4])
        rank = rng.randrange(tp)
        layout = sorted(STATE_PRESETS)[i % len(STATE_PRESETS)]
        own = state_page(layout, model, 2, attn_tp=tp, attn_tp_rank=rank)
        page_size = rng.choice([None, -(-own.page_size // 16) * 16 + 16 * rng.randint(0, 2)])
        page = state_page(layout, model, 2, attn_tp=tp, attn_tp_rank=rank, page_size=page_size)
        state = cast(StateGroup, model.layer_groups[2])  # these hybrids' state
        offsets = [
            [
                block,
                part.name,
                unit,
                e,
                element_offset(page, block=block, part=part.name, unit=unit, element=e),
            ]
            for block in (0, 1)
            for part in state.parts()
            for unit in page.units[part.name]
            for e in range(part.unit_elements)
        ]
        where: dict[str, Any] = {"attn_tp": tp, "attn_tp_rank": rank, "page_size": page_size}
        runs = [
            {
                "part": part.name,
                "units": [page.units[part.name].start, page.units[part.name].stop],
                "runs": [
                    list(r)
                    for r in state_runs(
                        layout,
                        model,
                        2,
                        **where,
                        block=1,
                        part=part.name,
                        units=page.units[part.name],
                    )
                ],
            }
            for part in state.parts()
        ]
        cases.append(
            {
                "id": f"state-layouts-{i:03d}",
                "clauses": ["SLAYOUT-1", "SLAYOUT-2"],
                "layout": layout,
                "model": model.to_dict(),
                "group": 2,
                **where,
                "page_bytes": page.page_size,
                "offsets": offsets,
                "runs": runs,
            }
        )
    return cases, {}


def _check_state_layouts(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    model = ModelShape.from_dict(case["model"])
    where = {k: case[k] for k in ("attn_tp", "attn_tp_rank", "page_size")}
    for block, part, unit, element, offset in case["offsets"]:
        got = adapter.state_offset(
            case["layout"],
            model,
            case["group"],
            **where,
            block=block,
            part=part,
            unit=unit,
            element=element,
        )
        if got != offset:
            where_text = f"block {block}, part {part}, unit {unit}, element {element}"
            return f"{where_text}: byte {got}, expected {offset}"
    if "state-runs" not in provided_capabilities(adapter):
        return None
    for entry in case["runs"]:
        got_runs = [
            list(r)
            for r in adapter.state_runs(
                case["layout"],
                model,
                case["group"],
                **where,
                block=1,
                part=entry["part"],
                units=range(*entry["units"]),
            )
        ]
        if got_runs != entry["runs"]:
            return f"part {entry['part']}: runs {got_runs[:4]}, expected {entry['runs'][:4]}"
    return None


FAMILIES: tuple[Family, ...] = (
    Family("ownership", ("ownership",), _export_ownership, _check_ownership),
    Family("tokens", ("tokens",), _export_tokens, _check_tokens),
    Family("plan", ("routing",), _export_plan, _check_plan),
    Family("errors", (), _export_errors, _check_errors),
    Family("reshard", ("sender",), _export_reshard, _check_reshard),
    Family("layouts", ("layouts",), _export_layouts, _check_layouts),
    Family("paged", ("paged",), _export_paged, _check_paged),
    Family("records", ("fields",), _export_records, _check_records),
    Family("descriptors", ("descriptors",), _export_descriptors, _check_descriptors),
    Family("oracle", ("oracle",), _export_oracle, _check_oracle),
    Family("keys", ("keys",), _export_keys, _check_keys),
    Family("ports", ("ports",), _export_ports, _check_ports),
    Family("wire", ("wire",), _export_wire, _check_wire),
    Family("groups", ("group-bytes",), _export_group_plans, _check_groups),
    Family("states", ("state-ownership", "state-reads"), _export_states, _check_states),
    Family("state-layouts", ("state-layout",), _export_state_layouts, _check_state_layouts),
)


def export_vectors(directory: str | Path, *, seed: int = 0) -> Path:
    """Write the manifest and the tensors into ``directory``; the same bytes every run."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    families: dict[str, list[Case]] = {}
    tensors: Tensors = {}
    for family in FAMILIES:
        cases, family_tensors = family.export(random.Random(f"{seed}:{family.name}"))
        families[family.name] = cases
        tensors.update(family_tensors)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "kvspec_version": __version__,
        "seed": seed,
        "tensors_file": TENSORS_FILE,
        "families": families,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    save_file(
        {k: v.detach().cpu().clone() for k, v in tensors.items()},
        out / TENSORS_FILE,
        metadata={"format": f"{FORMAT}/{VERSION}"},
    )
    return out


@dataclass
class VectorResult:
    family: str
    case_id: str
    verdict: str  # "passed", "FAILED", "not applicable"
    detail: str = ""


class VectorsError(InputError):
    """A directory that is not a readable vector set; the message names the file and why."""


def load_vectors(directory: str | Path) -> tuple[dict[str, Any], Tensors]:
    """The manifest and tensors of a vector set, refusing anything malformed with
    :class:`VectorsError` (never a ``KeyError`` or a library's own exception)."""
    root = Path(directory)
    path = root / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise VectorsError(f"{path}: cannot read a JSON manifest: {_short(error)}") from None
    if not isinstance(manifest, dict):
        raise VectorsError(f"{path}: the manifest must be a JSON object")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise VectorsError(
            f"{path} is not {FORMAT} version {VERSION}: "
            f"format={_short(manifest.get('format'))}, version={_short(manifest.get('version'))}"
        )
    families, tensors_file = manifest.get("families"), manifest.get("tensors_file")
    if not isinstance(families, dict) or not all(
        isinstance(cases, list)
        and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cases)
        for cases in families.values()
    ):
        raise VectorsError(f"{path}: 'families' must map a family name to a list of cases with ids")
    if not isinstance(tensors_file, str) or Path(tensors_file).name != tensors_file:
        raise VectorsError(f"{path}: 'tensors_file' must name a file beside the manifest")
    try:
        tensors = load_file(root / tensors_file)
    except Exception as error:  # safetensors raises its own types for damaged files
        raise VectorsError(f"{root / tensors_file}: cannot read tensors: {_short(error)}") from None
    return manifest, tensors


def _short(value: object, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters, so a huge bad value stays readable."""
    text = repr(value) if not isinstance(value, BaseException) else f"{value}"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
"""The vector families, in the order they are replayed."""


def check_vectors(
    directory: str | Path, adapter: Adapter, families: Collection[str] | None = None
) -> list[VectorResult]:
    """Replay every vector (or those of ``families``) through ``adapter``; families it
    lacks are not applicable. An unknown family name is a ValueError naming the known
    ones, raised before anything is read."""
    unknown = sorted(set(families or ()) - set(FAMILY_NAMES))
    if unknown:
        raise ValueError(
            f"no vector family {', '.join(map(repr, unknown))}; the families are "
            f"{', '.join(FAMILY_NAMES)}"
        )
    manifest, tensors = load_vectors(directory)
    provided = provided_capabilities(adapter)
    results = []
    for family in FAMILIES:
        if families is not None and family.name not in families:
            continue
        for case in manifest["families"].get(family.name, []):
            if not set(family.needs) <= provided:
                results.append(
                    VectorResult(
                        family.name,
                        case["id"],
                        "not applicable",
                        f"needs {', '.join(family.needs)}",
                    )
                )
                continue
            try:
                problem = family.check(adapter, case, tensors)
            except NotApplicable as why:
                results.append(VectorResult(family.name, case["id"], "not applicable", str(why)))
                continue
            except Exception as error:
                problem = f"raised {error!r}"
            verdict = "passed" if problem is None else "FAILED"
            results.append(VectorResult(family.name, case["id"], verdict, problem or ""))
    return results
