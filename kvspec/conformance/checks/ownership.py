"""Checks of which rank owns which heads and layers [STAGE-1, HEAD-1..3, LAYER-1..2]."""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect
from kvspec.model import ModelShape
from kvspec.ownership import rank_ownership
from kvspec.stage import StageLayout
from kvspec.strategies import TP_SIZES, head_counts_for, stage_layouts


@st.composite
def _ownership_examples(draw: st.DrawFn, *, heads: str, pipeline: str) -> Example:
    """A layout and a model; ``heads`` picks split/replicated/mla, ``pipeline`` the PP kind."""
    if heads == "replicated":
        tp = draw(st.sampled_from([t for t in TP_SIZES if t > 1]))
        counts = [h for h in head_counts_for((tp,)) if h < tp]
    else:
        tp = draw(st.sampled_from(TP_SIZES))
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
        layout = draw(
            stage_layouts(tp=tp, num_layers=num_layers, max_pp=min(8, num_layers)).filter(
                lambda lay: lay.pp > 1 and (lay.layer_partition is None) == (pipeline == "default")
            )
        )
    return {"layout": layout.to_dict(), "model": model.to_dict()}


def _compare_all_ranks(ctx: Context, example: Example, clause: str) -> None:
    layout = StageLayout.from_dict(example["layout"])
    model = ModelShape.from_dict(example["model"])
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


def _ownership_check(clause: str, slug: str, title: str, heads: str, pipeline: str, pins=()):
    def strategy(adapter: Adapter) -> st.SearchStrategy[Example]:
        return _ownership_examples(heads=heads, pipeline=pipeline)

    @check(clause, slug, title, needs=("ownership",), strategy=strategy, examples=pins)
    def run(ctx: Context, example: Example) -> None:
        _compare_all_ranks(ctx, example, clause)


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
    pins=(_pin(2, 4, 8, 2),),
)
_ownership_check(
    "HEAD-1",
    "split-heads",
    "H >= tp: contiguous H/tp heads per rank",
    "split",
    "none",
    pins=(_pin(3, 12), _pin(2, 8)),
)
_ownership_check(
    "HEAD-2",
    "replicated-heads",
    "H < tp: rank r owns head r // (tp/H)",
    "replicated",
    "none",
    pins=(_pin(8, 4), _pin(6, 2)),
)
_ownership_check("HEAD-3", "mla-latent", "MLA: every rank holds the latent", "mla", "none")
_ownership_check(
    "LAYER-1",
    "default-partition",
    "n // pp each, remainder to partitions -2, -3, ...",
    "split",
    "default",
    pins=(_pin(1, 2, 61, 2), _pin(1, 2, 10, 4)),
)
_ownership_check(
    "LAYER-2",
    "explicit-partition",
    "explicit partitions are honoured",
    "split",
    "explicit",
    pins=(_pin(1, 2, 7, 2, (1, 6)),),
)
