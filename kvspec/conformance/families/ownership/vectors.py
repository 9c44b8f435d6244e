"""The ``ownership`` vectors: the heads and layers each rank of a stage owns
[STAGE-1, STAGE-2, HEAD-1, HEAD-2, HEAD-3, LAYER-1, LAYER-2, CP-3].

The pinned and sampled first-release layouts come first, then the layouts of
:data:`~kvspec.conformance.vectors.sampling.PARALLEL` with attention groups and token
shards, numbered after them.
"""

from __future__ import annotations

import random

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import PARALLEL, PINNED, sample_cases
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.stage import StageLayout


def _span(r: range) -> list[int]:
    return [r.start, r.stop]


_FIRST_RELEASE = ["STAGE-1", "HEAD-1", "HEAD-2", "HEAD-3", "LAYER-1", "LAYER-2"]
_PARALLEL = ["STAGE-1", "STAGE-2", "HEAD-1", "HEAD-2", "HEAD-3", "CP-3"]


def _case(key: str, clauses: list[str], layout: StageLayout, model: ModelShape) -> Case:
    """What each rank of ``layout`` owns of ``model``."""
    return {
        "id": key,
        "clauses": clauses,
        "layout": layout.to_dict(),
        "model": model.to_dict(),
        "ranks": [
            {
                "rank": r.rank,
                "pp_rank": r.pp_rank,
                "tp_rank": r.tp_rank,
                "heads": _span(r.heads),
                "layers": _span(r.layers),
            }
            for r in stage_ownership(layout, model)
        ],
    }


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = [
        _case(f"ownership-{i:03d}-{side}", _FIRST_RELEASE, layout, case.model)
        for i, case in enumerate([*PINNED, *sample_cases(rng, 30, max_layers=64)])
        for side, layout in (("source", case.source), ("target", case.target))
    ]
    return cases + _parallel_cases(len(PINNED) + 30), {}


def _parallel_cases(start: int) -> list[Case]:
    """Ownership of layouts with attention groups and token shards [STAGE-2, CP-3]."""
    return [
        _case(f"ownership-{i:03d}-{side}", _PARALLEL, layout, case.model)
        for i, case in enumerate(PARALLEL, start)
        for side, layout in (("source", case.source), ("target", case.target))
        if not layout.first_release
    ]


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    layout, model = StageLayout.from_dict(case["layout"]), ModelShape.from_dict(case["model"])
    if not adapter.domain.holds_stage(layout, model):
        raise NotApplicable("outside the adapter's declared domain")
    for expected in case["ranks"]:
        heads, layers = adapter.owned(layout, model, expected["rank"])
        got = [[min(heads, default=0), max(heads, default=-1) + 1], [layers[0], layers[-1] + 1]]
        if got != [expected["heads"], expected["layers"]] or len(heads) != len(range(*got[0])):
            return f"rank {expected['rank']}: heads/layers {got}, expected {expected}"
    return None


FAMILY = Family("ownership", ("ownership",), export, check)
