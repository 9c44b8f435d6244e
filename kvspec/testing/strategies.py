"""Hypothesis strategies for the spec's inputs, shared by kvspec's tests and its conformance suite.

Draws are dependent, as the rules are: a source TP, then a target TP (one that divides
or is divided by it, unless non-dividing pairs are asked for [PLAN-1]), then each
side's attention-DP and context-parallel groups [STAGE-2], then a head count valid for
both sides' attention-TP sizes [HEAD-1, HEAD-2], then decode context parallelism the
heads can feed [CP-3], token rules [CP-1], a request length that fits them [CP-2], the
router's DP ranks [DP-1], then pipeline layouts whose partitions fit the layer count
[LAYER-1, LAYER-2]. Validity is decided by the spec's own checks, never restated here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from kvspec.memory.cache_layout import LAYOUTS, CacheShape, holds_attention
from kvspec.memory.paged import blocks_needed
from kvspec.naming.keys import LegacyKey, RankAwareKey
from kvspec.naming.ports import COMPATIBLE, DeployedStage, Deployment, PortScheme
from kvspec.tensors.dtypes import DTYPES
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import (
    check_heads,
    default_layer_partition,
)
from kvspec.topology.plan import POLICIES
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import RULE_KINDS, CPRule, rule_kind

TP_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24)
"""TP sizes drawn by default: powers of two and the non-powers 3, 6, 12, 24."""

Partitioner = Callable[[int, int], "Sequence[int] | None"]
"""An engine's default layer split: (num_layers, pp) -> layers per stage, or None for
kvspec's [LAYER-1] (``Adapter.layer_partition``)."""


def _valid(check: Callable[..., object], *args: Any) -> bool:
    try:
        check(*args)
    except ValueError:
        return False
    return True


def head_counts_for(tps: tuple[int, ...], *, max_heads: int = 48) -> list[int]:
    """Head counts valid for every TP size in ``tps`` [HEAD-1, HEAD-2]."""
    return [h for h in range(1, max_heads + 1) if all(_valid(check_heads, h, tp) for tp in tps)]


def divides(source_tp: int, target_tp: int) -> bool:
    """Whether two TP sizes divide one another (the first release's TP pairs)."""
    return source_tp % target_tp == 0 or target_tp % source_tp == 0


def dividing_pairs(sizes: tuple[int, ...] = TP_SIZES) -> list[tuple[int, int]]:
    """Every (source TP, target TP) pair of ``sizes`` that divide one another."""
    return [(s, t) for s in sizes for t in sizes if divides(s, t)]


@st.composite
def tp_pairs(
    draw: st.DrawFn,
    *,
    sizes: tuple[int, ...] = TP_SIZES,
    pairs: tuple[tuple[int, int], ...] | None = None,
    non_dividing: bool = False,
) -> tuple[int, int]:
    """A (source TP, target TP) pair from ``pairs`` if given, else of ``sizes``: any pair
    with ``non_dividing``, else one that divide one another [PLAN-1]."""
    if pairs is not None:
        return draw(st.sampled_from(sorted(pairs)))
    source = draw(st.sampled_from(sizes))
    target = draw(st.sampled_from([t for t in sizes if non_dividing or divides(source, t)]))
    return source, target


@st.composite
def stage_layouts(
    draw: st.DrawFn,
    *,
    tp: int,
    num_layers: int,
    max_pp: int = 3,
    pp_sizes: tuple[int, ...] | None = None,
    explicit: bool = True,
    groups: dict[str, Any] | None = None,
    partition: Partitioner | None = None,
) -> StageLayout:
    """A stage at TP ``tp`` with 1..max_pp pipeline ranks (or one of ``pp_sizes`` that fit
    ``num_layers``), default or (when ``explicit``) explicit partition; ``groups`` gives
    its ``dp``, ``cp``, ``dcp`` and ``cp_rule`` [STAGE-2, CP-1]. A stage drawn with the
    default partition gets ``partition(num_layers, pp)`` as its explicit one when that
    is given and differs from kvspec's [LAYER-1]: the split the engine really runs."""
    groups = groups or {}
    if pp_sizes is None:
        pp = draw(st.integers(1, min(max_pp, num_layers)))
    else:
        pp = draw(st.sampled_from([p for p in pp_sizes if p <= num_layers] or [1]))
    if pp == 1 or not explicit or draw(st.booleans()):
        return StageLayout(
            tp=tp, pp=pp, layer_partition=engine_default(partition, num_layers, pp), **groups
        )
    cuts = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=pp - 1, max_size=pp - 1)))
    bounds = [0, *cuts, num_layers]
    return StageLayout(
        tp=tp,
        pp=pp,
        layer_partition=tuple(b - a for a, b in itertools.pairwise(bounds)),
        **groups,
    )


def engine_default(
    partition: Partitioner | None, num_layers: int, pp: int
) -> tuple[int, ...] | None:
    """An engine's default split as an explicit partition, or None where it has none or
    it is kvspec's own [LAYER-1, LAYER-2]."""
    split = None if partition is None or pp == 1 else partition(num_layers, pp)
    if split is None:
        return None
    split = tuple(int(n) for n in split)
    return None if split == default_layer_partition(num_layers, pp) else split


@st.composite
def cp_rules(draw: st.DrawFn, *, kinds: tuple[str, ...] = RULE_KINDS) -> str:
    """A token rule of one of ``kinds``, with one of its kind's small sample sizes [CP-1]."""
    kind = draw(st.sampled_from(kinds))
    return str(CPRule(kind, draw(st.sampled_from(rule_kind(kind).sample_sizes))))


def _groups(tp: int, dp_sizes: tuple[int, ...], cp_sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(dp, cp) for dp in dp_sizes for cp in cp_sizes if tp % (dp * cp) == 0] or [(1, 1)]


@st.composite
def models(
    draw: st.DrawFn,
    *,
    tps: tuple[int, ...] = (1,),
    max_layers: int = 8,
    max_head_dim: int = 4,
    dtypes: tuple[str, ...] = tuple(DTYPES),
    attention: tuple[str, ...] = ("mha", "mla"),
    max_heads: int = 48,
    min_layers: int = 1,
    replicated_heads: bool = True,
) -> ModelShape:
    """A model whose head count is valid for every TP in ``tps`` (MLA always is);
    without ``replicated_heads`` the head count is at least every TP [HEAD-1]."""
    kind = draw(st.sampled_from(attention))
    num_layers = draw(st.integers(min_layers, max(min_layers, max_layers)))
    head_dim = draw(st.integers(1, max_head_dim))
    dtype = draw(st.sampled_from(dtypes))
    if kind == "mla":
        return ModelShape.mla(num_layers, head_dim, dtype=dtype)
    counts = head_counts_for(tps, max_heads=max_heads)
    if not replicated_heads:
        counts = [h for h in counts if h >= max(tps)] or [max(tps)]
    heads = draw(st.sampled_from(counts))
    return ModelShape(num_layers, heads, head_dim, dtype=dtype)


@st.composite
def transfer_cases(
    draw: st.DrawFn,
    *,
    sizes: tuple[int, ...] = TP_SIZES,
    max_pp: int = 3,
    max_layers: int = 8,
    max_head_dim: int = 4,
    dtypes: tuple[str, ...] = tuple(DTYPES),
    attention: tuple[str, ...] = ("mha", "mla"),
    policies: tuple[str, ...] = POLICIES,
    pairs: tuple[tuple[int, int], ...] | None = None,
    pp_sizes: tuple[int, ...] | None = None,
    replicated_heads: bool = True,
    explicit_partitions: bool = True,
    non_dividing: bool = False,
    dp_sizes: tuple[int, ...] = (1,),
    cp_sizes: tuple[int, ...] = (1,),
    dcp_sizes: tuple[int, ...] = (1,),
    rules: tuple[str, ...] = RULE_KINDS,
    max_seq_len: int = 12,
    partition: Partitioner | None = None,
) -> TransferCase:
    """A valid transfer: TP pair, each side's attention groups, a model valid for both,
    DCP and token rules, a request length and DP ranks where they apply, PP layouts.

    ``pairs``, ``pp_sizes``, ``replicated_heads``, ``explicit_partitions``,
    ``non_dividing``, ``dp_sizes``, ``cp_sizes``, ``dcp_sizes`` and ``rules`` narrow the
    draw to an implementation's declared domain; the defaults draw the first release's
    layouts (TP and PP) and every TP pair that divides. ``partition`` is the engine's own
    default layer split, given to stages drawn without one (:func:`stage_layouts`).
    """
    source_tp, target_tp = draw(tp_pairs(sizes=sizes, pairs=pairs, non_dividing=non_dividing))
    source_dp, source_cp = draw(st.sampled_from(_groups(source_tp, dp_sizes, cp_sizes)))
    target_dp, target_cp = draw(st.sampled_from(_groups(target_tp, dp_sizes, cp_sizes)))
    attn = (source_tp // (source_dp * source_cp), target_tp // (target_dp * target_cp))
    model = draw(
        models(
            tps=attn,
            max_layers=max_layers,
            max_head_dim=max_head_dim,
            dtypes=dtypes,
            attention=attention,
            replicated_heads=replicated_heads,
            min_layers=min(pp_sizes) if pp_sizes else 1,
        )
    )
    sides: list[dict[str, Any]] = []
    for dp, cp, width in ((source_dp, source_cp, attn[0]), (target_dp, target_cp, attn[1])):
        dcps = [d for d in dcp_sizes if width % d == 0 and model.num_kv_heads * d <= width]
        dcp = draw(st.sampled_from(dcps or [1]))
        rule = draw(cp_rules(kinds=rules)) if cp * dcp > 1 else "contiguous"
        sides.append({"dp": dp, "cp": cp, "dcp": dcp, "cp_rule": rule})
    seq_len = None
    if any(side["cp"] * side["dcp"] > 1 for side in sides):
        shortest = max(
            [1] + [CPRule.parse(s["cp_rule"]).min_tokens(s["cp"] * s["dcp"]) for s in sides]
        )
        seq_len = draw(st.integers(shortest, max(shortest, max_seq_len)))
    dp_ranks = [draw(st.integers(0, side["dp"] - 1)) for side in sides]
    layouts: dict[str, Any] = {
        "num_layers": model.num_layers,
        "max_pp": max_pp,
        "pp_sizes": pp_sizes,
        "explicit": explicit_partitions,
        "partition": partition,
    }
    source = draw(stage_layouts(tp=source_tp, groups=sides[0], **layouts))
    target = draw(stage_layouts(tp=target_tp, groups=sides[1], **layouts))
    policy = draw(st.sampled_from(policies))
    return TransferCase(source, target, model, policy, seq_len, dp_ranks[0], dp_ranks[1])


@st.composite
def cache_shapes(
    draw: st.DrawFn,
    *,
    kv: int | None = None,
    min_blocks: int = 0,
    max_blocks: int = 4,
    max_block_size: int = 4,
    max_heads: int = 3,
    max_head_dim: int = 3,
) -> CacheShape:
    """What one layer's cache holds: K and V (kv=2) or a latent (kv=1, one head) [LAYOUT-2]."""
    kv = draw(st.sampled_from((1, 2))) if kv is None else kv
    return CacheShape(
        kv=kv,
        num_blocks=draw(st.integers(min_blocks, max_blocks)),
        block_size=draw(st.integers(1, max_block_size)),
        heads=1 if kv == 1 else draw(st.integers(1, max_heads)),
        head_dim=draw(st.integers(1, max_head_dim)),
    )


@st.composite
def paged_layouts(
    draw: st.DrawFn, *, attention: str = "mha", max_block_size: int = 5
) -> tuple[str, int]:
    """A layout that can hold ``attention``'s cache and a block size for it [LAYOUT-1].

    token_major always has block size 1 [LAYOUT-2].
    """
    # layouts_for(attention)'s layouts, in its order, as values
    held = [spec for spec in LAYOUTS.values() if holds_attention(spec, attention)]
    layout = draw(st.sampled_from(held))
    if not layout.paged:
        return layout.name, 1
    return layout.name, draw(st.integers(1, max_block_size))


@st.composite
def block_tables(
    draw: st.DrawFn, *, seq_len: int, block_size: int, max_spare_blocks: int = 3
) -> tuple[int, list[int]]:
    """``(num_blocks, block_ids)``: a cache with room to spare and the request's blocks.

    The ids are exactly the blocks the request needs [PAGED-3], distinct and in any
    order [PAGED-2]; other blocks of the cache belong to other requests.
    """
    needed = blocks_needed(seq_len, block_size)
    num_blocks = needed + draw(st.integers(0 if needed else 1, max_spare_blocks))
    ids = draw(st.permutations(range(num_blocks)))
    return num_blocks, list(ids[:needed])


@dataclass(frozen=True)
class PagedSide:
    """One side's paged cache geometry for a request: layout, block size, blocks, block ids."""

    layout: str
    block_size: int
    num_blocks: int
    block_ids: tuple[int, ...]


@st.composite
def paged_sides(
    draw: st.DrawFn, *, attention: str, seq_len: int, max_block_size: int = 5
) -> PagedSide:
    """A layout and block size for ``attention`` and a block table for ``seq_len`` tokens."""
    layout, block_size = draw(paged_layouts(attention=attention, max_block_size=max_block_size))
    num_blocks, ids = draw(block_tables(seq_len=seq_len, block_size=block_size))
    return PagedSide(layout, block_size, num_blocks, tuple(ids))


# -- keys [KEY-1..3] ----------------------------------------------------------------------

TRICKY_REQUEST_IDS: tuple[str, ...] = (
    "5_0_0_0_0",  # its legacy key also reads as a rank-aware key [KEY-3]
    "omni_0_to_1_kv_cache",
    "omni_0_to_1_kv_cache_5",
    "omni_0_to_1_kv",
    "omni",
    "_",
    "__",
    "0",
    "req_1_2",
    "chatcmpl-7f3a",
    "ü_名_0",
)
"""Request ids that broke, or could break, keys joined with ``_``."""


@st.composite
def request_ids(draw: st.DrawFn) -> str:
    """Request ids built from the pieces keys are made of, plus :data:`TRICKY_REQUEST_IDS`.

    Every id is valid for payloads and legacy keys; some are refused in rank-aware keys.
    """
    pieces = st.sampled_from(["omni", "to", "kv", "cache", "0", "1", "12", "01", "x", "", "-"])
    return draw(
        st.one_of(
            st.sampled_from(TRICKY_REQUEST_IDS),
            st.lists(pieces, min_size=1, max_size=8).map("_".join).filter(bool),
            st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=1),
        )
    )


@st.composite
def keys(
    draw: st.DrawFn, *, kinds: tuple[str, ...] = ("rank_aware", "legacy")
) -> RankAwareKey | LegacyKey:
    """A key of the injective domain [KEY-3], of either kind."""
    kind = draw(st.sampled_from(kinds))
    number = st.integers(0, 10**6)
    if kind == "legacy":
        return LegacyKey(draw(request_ids()), draw(number), draw(number))
    request_id = draw(request_ids().filter(lambda r: _valid(RankAwareKey, r, 0, 0, 0, 0)))
    return RankAwareKey(request_id, draw(number), draw(number), draw(number), draw(number))


# -- ports [PORT-1..3] --------------------------------------------------------------------


@st.composite
def port_schemes(draw: st.DrawFn) -> PortScheme:
    """The compatible scheme, or one with other offsets, strides and maybe a dp stride."""
    if draw(st.booleans()):
        return COMPATIBLE
    rank_stride = draw(st.sampled_from([4, 8, 16, 32]))
    replica_stride = rank_stride * draw(st.sampled_from([4, 16, 64]))
    dp = draw(st.sampled_from([None, 2, 4]))
    return PortScheme(
        kv_offset=draw(st.integers(0, 300)),
        forward_offset=draw(st.integers(0, 300)),
        orchestrator_offset=draw(st.integers(0, 300)),
        rank_stride=rank_stride,
        replica_stride=replica_stride,
        dp_stride=None if dp is None else replica_stride * dp,
    )


@st.composite
def deployments(draw: st.DrawFn, *, max_stages: int = 6, max_tp: int = 16) -> Deployment:
    """A deployment of 1..max_stages stages, some of them replicated (maybe past any limit)."""
    ids = draw(st.lists(st.integers(0, 20), min_size=1, max_size=max_stages, unique=True))
    stages = tuple(
        DeployedStage(
            stage_id,
            StageLayout(
                draw(st.sampled_from([t for t in TP_SIZES if t <= max_tp])), draw(st.integers(1, 2))
            ),
            replicas=draw(st.integers(1, 3)),
            dp=draw(st.sampled_from([1, 1, 2])),
        )
        for stage_id in ids
    )
    return Deployment(draw(st.sampled_from([1, 5000, 50000, 64000])), stages)


# -- chunks [CHUNK-1] ---------------------------------------------------------------------


@st.composite
def chunk_sizes(draw: st.DrawFn, *, seq_len: int) -> list[int]:
    """Positive chunk sizes that sum to ``seq_len`` (one chunk when it is 0 or 1)."""
    if seq_len <= 1:
        return [seq_len] if seq_len else []
    cuts = sorted(draw(st.sets(st.integers(1, seq_len - 1), max_size=seq_len - 1)))
    bounds = [0, *cuts, seq_len]
    return [b - a for a, b in itertools.pairwise(bounds)]


# -- wire fuzzing [WIRE-4] ----------------------------------------------------------------

HOSTILE_STRINGS: tuple[str, ...] = (
    "float64",
    "int8",
    "object",
    "torch.float32",
    "__import__('os').system('true')",
    "float8_e4m3fnuz",
    "",
    "bfloat16\x00",
    "\ud800",
)
"""dtype names and strings a decoder must refuse without looking anything up."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([-1, 0, 1, 2**31, 2**63, 2**64 + 1, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(HOSTILE_STRINGS),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
"""Any JSON value (floats and NaN included), hostile strings and numbers preferred."""


def _json_paths(value: object, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths += _json_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths += _json_paths(child, (*prefix, index))
    return paths


@st.composite
def mutated_frames(draw: st.DrawFn, *, messages: list[list[bytes]]) -> list[bytes]:
    """A valid message with 1..3 mutations: header edits, byte flips, cut/grown/moved frames."""
    frames = [bytes(f) for f in draw(st.sampled_from(messages))]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                [
                    "header",
                    "header",
                    "header",
                    "flip",
                    "truncate",
                    "extend",
                    "drop",
                    "repeat",
                    "swap",
                ]
            )
        )
        index = draw(st.integers(0, len(frames) - 1)) if frames else 0
        if kind == "header" and frames:
            try:
                header = json.loads(frames[0])
            except ValueError:
                continue
            path = draw(st.sampled_from(_json_paths(header)))
            action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
            header = _edit(header, path, action, draw(json_values), draw(st.text(max_size=6)))
            frames[0] = json.dumps(header).encode()
        elif kind == "flip" and frames and frames[index]:
            frame = bytearray(frames[index])
            for _ in range(draw(st.integers(1, 4))):
                frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
            frames[index] = bytes(frame)
        elif kind == "truncate" and frames:
            frames[index] = frames[index][: draw(st.integers(0, max(len(frames[index]) - 1, 0)))]
        elif kind == "extend" and frames:
            frames[index] += draw(st.binary(min_size=1, max_size=16))
        elif kind == "drop" and frames:
            del frames[index]
        elif kind == "repeat" and frames:
            frames.insert(index, frames[index])
        elif kind == "swap" and len(frames) > 1:
            other = draw(st.integers(0, len(frames) - 1))
            frames[index], frames[other] = frames[other], frames[index]
    return frames


def _edit(value: object, path: tuple, action: str, new: object, key: str) -> object:
    """``value`` with the node at ``path`` replaced, deleted or given a new key."""
    if not path:
        if action == "add" and isinstance(value, dict):
            return {**value, key: new}
        return new if action != "delete" else None
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if not rest and action == "delete":
            copy.pop(head, None)
        else:
            copy[head] = _edit(copy[head], rest, action, new, key)
        return copy
    assert isinstance(value, list)
    items = list(value)
    if not rest and action == "delete":
        del items[head]
    else:
        items[head] = _edit(items[head], rest, action, new, key)
    return items


random_frames = st.lists(
    st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            [
                b"{}",
                b"[]",
                b"null",
                b'{"format":"kvspec.payload","version":1}',
                b"\xff\xfe",
            ]
        ),
    ),
    max_size=6,
)
"""Frames with no structure at all."""
