"""Transfer configurations and hybrid models the families share, drawn from fixed grids
with the family's own seeded generator: the same draws, in the same order, on every run.

:data:`PINNED` and :data:`PARALLEL` are named configurations; :func:`sample_cases` and
:func:`sample_parallel` draw valid transfer cases (the first release's dividing TP pairs,
and any TP pair with attention groups, token shards and DP ranks); :func:`small_hybrids`
and :func:`hybrid_cases` draw the hybrid models of the groups, states and state-layouts
families.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import torch

from kvspec.conformance.vectors.family import Tensors
from kvspec.memory.cache_layout import LAYOUTS
from kvspec.memory.state_cache import state_page
from kvspec.testing.strategies import TP_SIZES, divides
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS as MODEL_PRESETS
from kvspec.topology.model_presets import model_preset
from kvspec.topology.plan import check_plannable
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import RULE_KINDS, CPRule, rule_kind


def sample_cases(rng: random.Random, count: int, *, max_layers: int = 8) -> list[TransferCase]:
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
    kind = rng.choice(RULE_KINDS)
    rule = CPRule(kind, rng.choice(rule_kind(kind).sample_sizes))
    return {"dp": dp, "cp": cp, "dcp": dcp, "cp_rule": str(rule)}


def sample_parallel(rng: random.Random, count: int) -> list[TransferCase]:
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


def small_hybrids(rng: random.Random, count: int) -> list[ModelShape]:
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


def hybrid_cases(rng: random.Random) -> list[tuple[TransferCase, int, int]]:
    """(case, seq_len, block_size): every model preset TP1 -> TP4 and back, then small
    hybrids over TP 1, 2, 4 and PP 1, 2."""
    found = []
    for name in MODEL_PRESETS:
        model = model_preset(name)
        for source, target in ((1, 4), (4, 1)):
            found.append((TransferCase(StageLayout(source), StageLayout(target), model), 1000, 16))
    for model in small_hybrids(rng, 16):
        sender = StageLayout(rng.choice([1, 2, 4]), rng.choice([1, 2]))
        receiver = StageLayout(rng.choice([1, 2, 4]), rng.choice([1, 2]))
        policy = rng.choice(["lowest", "balanced"])
        case = TransferCase(sender, receiver, model, policy)
        found.append((case, rng.randint(0, 80), rng.choice([1, 4, 16])))
    return found


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


def layer_tensors(key: str, cache: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A layer cache's tensors by key, and its manifest entry ``{"tensors", "tuple"}``."""
    parts = cache if isinstance(cache, tuple) else (cache,)
    names = [f"{key}/cache/{i}" for i in range(len(parts))]
    return dict(zip(names, parts, strict=True)), {
        "tensors": names,
        "tuple": isinstance(cache, tuple),
    }


def load_layer(tensors: Tensors, entry: dict[str, Any]) -> Any:
    parts = tuple(tensors[n].clone() for n in entry["tensors"])
    return parts if entry["tuple"] else parts[0]


FIRST_VECTOR_LAYOUTS: tuple[str, ...] = (
    "flash_attn",
    "flash_attn_hnd",
    "flashinfer",
    "flashinfer_hnd",
    "kv_tuple",
    "mla",
    "token_major",
    "vllm_packed_hnd",
    "vllm_packed_nhd",
    "vllm_mla",
    "sglang_mha",
    "sglang_mha_hnd",
    "sglang_mla",
)
"""The per-layer presets the golden vectors were first drawn over, in their order. The
``layouts`` and ``paged`` families make these presets' cases first, as they always did,
and a preset added later gets cases after them, so adding a preset adds vectors and
leaves the older ones in place (only a detection answer it makes ambiguous changes)
[LAYOUT-1, LAYOUT-4]."""


def vector_layouts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The per-layer presets with vectors: the first ones, then those added since."""
    first = tuple(n for n in FIRST_VECTOR_LAYOUTS if n in LAYOUTS)
    return first, tuple(n for n in LAYOUTS if n not in FIRST_VECTOR_LAYOUTS)
