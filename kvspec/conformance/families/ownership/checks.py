"""Checks of which rank owns which heads, layers and tokens [STAGE-1, STAGE-2, HEAD-1..3,
LAYER-1..2, CP-1, CP-3].

Layouts and models are drawn inside the adapter's domain: its TP sizes, pipeline sizes,
attention kinds, and replicated heads or explicit partitions only when it declares them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect, fail
from kvspec.testing.strategies import TP_SIZES, cp_rules, head_counts_for
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens, as_tokens


def _tp_sizes(adapter: Adapter) -> list[int]:
    """The TP sizes of the adapter's domain (either side of any of its pairs)."""
    return sorted({t for pair in adapter.domain.pairs() for t in pair} & set(TP_SIZES)) or [1]


@st.composite
def _ownership_examples(
    draw: st.DrawFn, *, heads: str, pipeline: str, tp_sizes: list[int], pp_sizes: tuple[int, ...]
) -> Example:
    """A layout and a model; ``heads`` picks split/replicated/mla, ``pipeline`` the PP kind."""
    if heads == "replicated":
        tp = draw(st.sampled_from([t for t in tp_sizes if t > 1] or [2]))
        counts = [h for h in head_counts_for((tp,)) if h < tp]
    else:
        tp = draw(st.sampled_from(tp_sizes))
        counts = [h for h in head_counts_for((tp,)) if h >= tp]
    num_layers = draw(st.integers(1, 24))
    if heads == "mla":
        model = ModelShape.mla(num_layers, draw(st.integers(1, 8)))
    else:
        model = ModelShape(num_layers, draw(st.sampled_from(counts)), draw(st.integers(1, 8)))
    if pipeline == "none":
        layout = StageLayout(tp)
    else:
        num_layers = draw(st.integers(2, 64))
        model = ModelShape.from_dict({**model.to_dict(), "num_layers": num_layers})
        pp = draw(st.sampled_from([p for p in pp_sizes if 2 <= p <= num_layers] or [2]))
        if pipeline == "default":
            layout = StageLayout(tp, pp)
        else:
            cuts = draw(st.sets(st.integers(1, num_layers - 1), min_size=pp - 1, max_size=pp - 1))
            bounds = [0, *sorted(cuts), num_layers]
            layout = StageLayout(tp, pp, tuple(b - a for a, b in itertools.pairwise(bounds)))
    return {"layout": layout.to_dict(), "model": model.to_dict()}


def _compare_all_ranks(ctx: Context, example: Example, clause: str) -> None:
    layout = StageLayout.from_dict(example["layout"])
    model = ModelShape.from_dict(example["model"])
    domain = ctx.adapter.domain
    if (
        layout.tp not in _tp_sizes(ctx.adapter)
        or layout.pp not in domain.pp_sizes
        or model.attention not in domain.attention
    ):
        raise OutsideDomain  # a pinned example the adapter's domain does not hold
    for rank in layout.ranks():
        spec = rank_ownership(layout, model, rank)
        heads, layers = ctx.adapter.owned(layout, model, rank)
        expect(
            (list(heads), list(layers)) == (list(spec.heads), list(spec.layers)),
            f"{layout.describe()}, {model.describe()}: rank {rank} (pp_rank {spec.pp_rank}, "
            f"tp_rank {spec.tp_rank}) owns heads {_span(spec.heads)} and layers "
            f"{_span(spec.layers)} [{clause}]; the implementation says heads {_span(heads)}, "
            f"layers {_span(layers)}",
        )


def _span(values: range | list[int] | tuple[int, ...]) -> str:
    values = list(values)
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return str(values)


def _outside(heads: str, pipeline: str) -> Callable[[Adapter], str | None]:
    """Why the adapter's domain holds no example of this kind, or None."""

    def why(adapter: Adapter) -> str | None:
        domain = adapter.domain
        if heads == "replicated" and not (domain.replicated_heads and max(_tp_sizes(adapter)) > 1):
            return "the adapter's domain has no replicated heads (H < tp)"
        if heads == "mla" and "mla" not in domain.attention:
            return "the adapter's domain has no MLA"
        if pipeline != "none" and max(domain.pp_sizes) < 2:
            return "the adapter's domain has no pipeline parallelism"
        if pipeline == "explicit" and not domain.explicit_partitions:
            return "the adapter's domain has no explicit layer partitions"
        return None

    return why


def _ownership_check(
    clause: str,
    slug: str,
    title: str,
    heads: str,
    pipeline: str,
    covers: tuple[str, ...],
    pins: tuple[Example, ...] = (),
) -> None:
    def strategy(adapter: Adapter) -> st.SearchStrategy[Example]:
        return _ownership_examples(
            heads=heads,
            pipeline=pipeline,
            tp_sizes=_tp_sizes(adapter),
            pp_sizes=adapter.domain.pp_sizes,
        )

    @check(
        clause,
        slug,
        title,
        needs=("ownership",),
        strategy=strategy,
        examples=pins,
        missing=_outside(heads, pipeline),
        covers=covers,
    )
    def run(ctx: Context, example: Example) -> None:
        _compare_all_ranks(ctx, example, covers[0])


def _pin(
    tp: int, heads: int, layers: int = 4, pp: int = 1, partition: tuple[int, ...] | None = None
) -> Example:
    return {
        "layout": StageLayout(tp, pp, partition).to_dict(),
        "model": ModelShape(layers, heads, 8).to_dict(),
    }


_ownership_check(
    "STAGE-1",
    "stage-rank",
    "rank = pp_rank * tp + tp_rank",
    "split",
    "default",
    ("STAGE-1.1",),
    pins=(_pin(2, 4, 8, 2), _pin(3, 6, 6, 3)),
)
_ownership_check(
    "HEAD-1",
    "split-heads",
    "H >= tp: contiguous H/tp heads per rank",
    "split",
    "none",
    ("HEAD-1.1",),
    pins=(_pin(3, 12), _pin(2, 8)),
)
_ownership_check(
    "HEAD-2",
    "replicated-heads",
    "H < tp: rank r owns head r // (tp/H)",
    "replicated",
    "none",
    ("HEAD-2.1",),
    pins=(_pin(8, 4), _pin(6, 2)),
)
_ownership_check(
    "HEAD-3", "mla-latent", "MLA: every rank holds the latent", "mla", "none", ("HEAD-3.1",)
)
_ownership_check(
    "LAYER-1",
    "default-partition",
    "n // pp each, remainder to partitions -2, -3, ...",
    "split",
    "default",
    ("LAYER-1.1",),
    pins=(_pin(1, 2, 61, 2), _pin(1, 2, 10, 4)),
)
_ownership_check(
    "LAYER-2",
    "explicit-partition",
    "explicit partitions are honoured",
    "split",
    "explicit",
    ("LAYER-2.1",),
    pins=(_pin(1, 2, 7, 2, (1, 6)),),
)


# -- attention groups and token shards [STAGE-2, CP-1, CP-3] ------------------------------


def _attention_sizes(adapter: Adapter, tp: int) -> list[tuple[int, int]]:
    domain = adapter.domain
    return [
        (dp, cp)
        for dp in domain.dp_sizes
        for cp in domain.cp_sizes
        if tp % (dp * cp) == 0 and dp * cp > 1
    ]


@st.composite
def _group_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A layout with attention-DP or context-parallel groups of the domain, and a model its
    attention-TP size holds [STAGE-2]."""
    tps = [t for t in _tp_sizes(adapter) if _attention_sizes(adapter, t)] or [4]
    tp = draw(st.sampled_from(tps))
    dp, cp = draw(st.sampled_from(_attention_sizes(adapter, tp) or [(2, 1)]))
    attn = tp // (dp * cp)
    pp = draw(st.sampled_from([p for p in adapter.domain.pp_sizes if p <= 3] or [1]))
    model = ModelShape(
        draw(st.integers(pp, 8)),
        draw(st.sampled_from(head_counts_for((attn,), max_heads=16))),
        draw(st.integers(1, 4)),
    )
    layout = StageLayout(tp, pp, dp=dp, cp=cp)
    return {"layout": layout.to_dict(), "model": model.to_dict()}


def _no_groups(adapter: Adapter) -> str | None:
    if any(_attention_sizes(adapter, t) for t in _tp_sizes(adapter)):
        return None
    return "the adapter's domain has no attention-DP or context-parallel groups"


@check(
    "STAGE-2",
    "attention-groups",
    "tp_rank = (dp_rank * cp + cp_rank) * attn_tp + attn_tp_rank; heads over attn_tp",
    needs=("ownership",),
    strategy=_group_examples,
    examples=(
        {"layout": StageLayout(8, dp=2).to_dict(), "model": ModelShape(2, 2, 2).to_dict()},
        {"layout": StageLayout(8, 2, cp=2).to_dict(), "model": ModelShape(4, 8, 2).to_dict()},
        {"layout": StageLayout(12, dp=2, cp=2).to_dict(), "model": ModelShape(2, 6, 2).to_dict()},
    ),
    missing=_no_groups,
    covers=("STAGE-2.1", "STAGE-2.2"),
)
def attention_groups(ctx: Context, example: Example) -> None:
    layout = StageLayout.from_dict(example["layout"])
    model = ModelShape.from_dict(example["model"])
    if not ctx.adapter.domain.holds_stage(layout, model):
        raise OutsideDomain
    for rank in layout.ranks():
        spec = rank_ownership(layout, model, rank)
        where = layout.locate(rank)
        heads, layers = ctx.adapter.owned(layout, model, rank)
        expect(
            (list(heads), list(layers)) == (list(spec.heads), list(spec.layers)),
            f"{layout.describe()}, {model.describe()}: rank {rank} is pp_rank {where.pp_rank}, "
            f"dp_rank {where.dp_rank}, cp_rank {where.cp_rank}, attention-TP rank "
            f"{where.attn_tp_rank} of {layout.attn_tp}, so it owns heads {_span(spec.heads)} "
            f"and layers {_span(spec.layers)} [STAGE-2.1, STAGE-2.2]; the implementation says "
            f"heads {_span(heads)}, layers {_span(layers)}",
        )


_M = ModelShape(2, 4, 2).to_dict()


@st.composite
def _token_examples(draw: st.DrawFn, adapter: Adapter, *, decode: bool) -> Example:
    """A layout with token shards of the domain (``decode``: DCP; else the cp axis), a model
    it holds and a request length its rule fits [CP-1, CP-2, CP-3]."""
    domain = adapter.domain
    options = []
    for tp in _tp_sizes(adapter):
        for dp in domain.dp_sizes:
            for cp in domain.cp_sizes:
                if tp % (dp * cp) or (cp == 1) != decode:
                    continue
                attn = tp // (dp * cp)
                for dcp in domain.dcp_sizes if decode else (1,):
                    if attn % dcp == 0 and (dcp > 1) == decode:
                        options.append((tp, dp, cp, dcp))
    tp, dp, cp, dcp = draw(st.sampled_from(options or [(4, 1, 1, 2) if decode else (2, 1, 2, 1)]))
    attn = tp // (dp * cp)
    counts = [h for h in head_counts_for((attn,), max_heads=16) if h * dcp <= attn] or [1]
    model = ModelShape(2, draw(st.sampled_from(counts)), 2)
    rule = draw(cp_rules(kinds=domain.cp_rules))
    layout = StageLayout(tp, dp=dp, cp=cp, dcp=dcp, cp_rule=rule)
    seq_len = draw(st.integers(layout.min_tokens, layout.min_tokens + 40))
    return {"layout": layout.to_dict(), "model": model.to_dict(), "seq_len": seq_len}


def _tokens_of(ctx: Context, layout: StageLayout, model: ModelShape, rank: int, n: int) -> Tokens:
    answer = ctx.adapter.owned_tokens(layout, model, rank, n)
    try:
        return as_tokens(answer)
    except ValueError as error:
        fail(f"{layout.describe()}: owned_tokens of rank {rank} gave {answer!r}: {error} [CP-1]")


def _compare_tokens(ctx: Context, example: Example, obligation: str) -> None:
    layout = StageLayout.from_dict(example["layout"])
    model = ModelShape.from_dict(example["model"])
    seq_len = example["seq_len"]
    if not ctx.adapter.domain.holds_stage(layout, model):
        raise OutsideDomain
    for rank in layout.ranks():
        spec = rank_ownership(layout, model, rank, seq_len=seq_len).tokens
        got = _tokens_of(ctx, layout, model, rank, seq_len)
        where = layout.locate(rank)
        expect(
            got == spec,
            f"{layout.describe()}, a request of {seq_len} tokens: rank {rank} (cp_rank "
            f"{where.cp_rank}, dcp_rank {where.dcp_rank}: token shard "
            f"{layout.token_shard(rank)} of {layout.token_shards}) holds tokens "
            f"{spec.describe() if spec else 'none'} by {layout.cp_rule} [{obligation}]; the "
            f"implementation says {got.describe()}",
        )


def _no_token_shards(decode: bool) -> Callable[[Adapter], str | None]:
    def why(adapter: Adapter) -> str | None:
        sizes = adapter.domain.dcp_sizes if decode else adapter.domain.cp_sizes
        if max(sizes) > 1:
            return None
        return f"the adapter's domain has no {'decode ' if decode else ''}context parallelism"

    return why


@check(
    "CP-1",
    "token-rules",
    "each token shard holds the tokens its rule gives it",
    needs=("tokens",),
    strategy=lambda adapter: _token_examples(adapter, decode=False),
    examples=tuple(
        {"layout": StageLayout(4, cp=cp, cp_rule=rule).to_dict(), "model": _M, "seq_len": n}
        for cp, rule, n in (
            (2, "contiguous:4", 22),
            (4, "contiguous", 10),
            (2, "interleave:3", 20),
            (2, "round_robin_blocks:2", 9),
            (2, "zigzag", 11),
            (4, "zigzag", 8),
        )
    ),
    missing=_no_token_shards(False),
    covers=("CP-1.1", "CP-1.2", "CP-1.3", "CP-1.4"),
)
def token_rules(ctx: Context, example: Example) -> None:
    rule = StageLayout.from_dict(example["layout"]).rule
    _compare_tokens(ctx, example, rule.rule_kind.obligation)


@check(
    "CP-3",
    "dcp-tokens",
    "the ranks replicating a head under DCP hold disjoint tokens, shard cp_rank * dcp + dcp_rank",
    needs=("tokens",),
    strategy=lambda adapter: _token_examples(adapter, decode=True),
    examples=(
        {
            "layout": StageLayout(8, dcp=2, cp_rule="interleave:1").to_dict(),
            "model": ModelShape(2, 4, 2).to_dict(),
            "seq_len": 9,
        },
        {
            "layout": StageLayout(8, cp=2, dcp=2, cp_rule="interleave:2").to_dict(),
            "model": ModelShape(2, 1, 2).to_dict(),
            "seq_len": 17,
        },
    ),
    missing=_no_token_shards(True),
    covers=("CP-3.1", "CP-3.2"),
)
def dcp_tokens(ctx: Context, example: Example) -> None:
    layout = StageLayout.from_dict(example["layout"])
    model = ModelShape.from_dict(example["model"])
    seq_len = example["seq_len"]
    if not ctx.adapter.domain.holds_stage(layout, model):
        raise OutsideDomain
    groups: dict[tuple[int, int, int, int], list[tuple[int, Tokens]]] = {}
    for rank in layout.ranks():
        where = layout.locate(rank)
        head = rank_ownership(layout, model, rank).heads.start
        key = (where.pp_rank, where.dp_rank, where.cp_rank, head)
        groups.setdefault(key, []).append((rank, _tokens_of(ctx, layout, model, rank, seq_len)))
    for (_, _, cp_rank, head), holders in groups.items():
        seen: dict[tuple[int, int], int] = {}  # (DCP group, token) -> rank
        held: set[int] = set()
        for rank, tokens in holders:
            group = layout.locate(rank).attn_tp_rank // layout.dcp
            for token in tokens.tokens():
                expect(
                    (group, token) not in seen,
                    f"{layout.describe()}, {model.describe()}, {seq_len} tokens: ranks "
                    f"{seen.get((group, token))} and {rank} of one DCP group both hold token "
                    f"{token} of head {head}; the ranks of a DCP group that hold a head hold "
                    "disjoint tokens [CP-3.2]",
                )
                seen[(group, token)] = rank
                held.add(token)
        mine = Tokens.of(
            r
            for s in range(layout.dcp)
            for r in layout.rule.tokens(
                cp_rank * layout.dcp + s, layout.token_shards, seq_len
            ).ranges
        )
        expect(
            held == set(mine.tokens()),
            f"{layout.describe()}, {model.describe()}, {seq_len} tokens: the ranks holding head "
            f"{head} in context-parallel group {cp_rank} hold {len(held)} tokens together; they "
            f"hold {mine.describe()} [CP-3.2]",
        )
    _compare_tokens(ctx, example, "CP-3.1")
