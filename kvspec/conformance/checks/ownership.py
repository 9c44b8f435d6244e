"""Checks of which rank owns which heads and layers [STAGE-1, HEAD-1..3, LAYER-1..2].

Layouts and models are drawn inside the adapter's domain: its TP sizes, pipeline sizes,
attention kinds, and replicated heads or explicit partitions only when it declares them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, expect
from kvspec.strategies import TP_SIZES, head_counts_for
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout


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
    clause: str, slug: str, title: str, heads: str, pipeline: str, covers: tuple, pins=()
):
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


def _pin(tp: int, heads: int, layers: int = 4, pp: int = 1, partition=None) -> Example:
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
