"""Hypothesis strategies for the spec's inputs, shared by kvspec's tests and its conformance suite.

Draws are dependent, as the rules are: a source TP, then a target TP that divides
or is divided by it [PLAN-1], then a head count valid for both [HEAD-1, HEAD-2],
then pipeline layouts whose partitions fit the layer count [LAYER-1, LAYER-2].
Validity is decided by the spec's own checks, never restated here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from kvspec.cache_layout import CacheShape, get_layout, layouts_for
from kvspec.dtypes import DTYPES
from kvspec.model import ModelShape
from kvspec.ownership import check_heads
from kvspec.paged import blocks_needed
from kvspec.plan import POLICIES, TransferPlan, check_tp_pair, plan_transfer
from kvspec.stage import StageLayout

TP_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24)
"""TP sizes drawn by default: powers of two and the non-powers 3, 6, 12, 24."""


def _valid(check, *args) -> bool:
    try:
        check(*args)
    except ValueError:
        return False
    return True


def head_counts_for(tps: tuple[int, ...], *, max_heads: int = 48) -> list[int]:
    """Head counts valid for every TP size in ``tps`` [HEAD-1, HEAD-2]."""
    return [h for h in range(1, max_heads + 1) if all(_valid(check_heads, h, tp) for tp in tps)]


@dataclass(frozen=True)
class TransferCase:
    """One generated transfer: two stage layouts, the model and a replica policy."""

    source: StageLayout
    target: StageLayout
    model: ModelShape
    policy: str = "lowest"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, for counterexamples and golden vectors."""
        return {
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransferCase:
        return cls(
            StageLayout.from_dict(data["source"]),
            StageLayout.from_dict(data["target"]),
            ModelShape.from_dict(data["model"]),
            data.get("policy", "lowest"),
        )

    def plan(self) -> TransferPlan:
        return plan_transfer(self.source, self.target, self.model, policy=self.policy)

    def describe(self) -> str:
        return (
            f"{self.source.describe()} -> {self.target.describe()}, {self.model.describe()}, "
            f"policy {self.policy}"
        )


@st.composite
def tp_pairs(draw: st.DrawFn, *, sizes: tuple[int, ...] = TP_SIZES) -> tuple[int, int]:
    """A (source TP, target TP) pair that divide one another [PLAN-1]."""
    source = draw(st.sampled_from(sizes))
    target = draw(st.sampled_from([t for t in sizes if _valid(check_tp_pair, source, t)]))
    return source, target


@st.composite
def stage_layouts(draw: st.DrawFn, *, tp: int, num_layers: int, max_pp: int = 3) -> StageLayout:
    """A stage at TP ``tp`` with 1..max_pp pipeline ranks, default or explicit partition."""
    pp = draw(st.integers(1, min(max_pp, num_layers)))
    if pp == 1 or draw(st.booleans()):
        return StageLayout(tp=tp, pp=pp)
    cuts = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=pp - 1, max_size=pp - 1)))
    bounds = [0, *cuts, num_layers]
    return StageLayout(
        tp=tp, pp=pp, layer_partition=tuple(b - a for a, b in itertools.pairwise(bounds))
    )


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
) -> ModelShape:
    """A model whose head count is valid for every TP in ``tps`` (MLA always is)."""
    kind = draw(st.sampled_from(attention))
    num_layers = draw(st.integers(1, max_layers))
    head_dim = draw(st.integers(1, max_head_dim))
    dtype = draw(st.sampled_from(dtypes))
    if kind == "mla":
        return ModelShape.mla(num_layers, head_dim, dtype=dtype)
    heads = draw(st.sampled_from(head_counts_for(tps, max_heads=max_heads)))
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
) -> TransferCase:
    """A valid transfer: TP pair, a model valid for both, PP layouts on both sides."""
    source_tp, target_tp = draw(tp_pairs(sizes=sizes))
    model = draw(
        models(
            tps=(source_tp, target_tp),
            max_layers=max_layers,
            max_head_dim=max_head_dim,
            dtypes=dtypes,
            attention=attention,
        )
    )
    source = draw(stage_layouts(tp=source_tp, num_layers=model.num_layers, max_pp=max_pp))
    target = draw(stage_layouts(tp=target_tp, num_layers=model.num_layers, max_pp=max_pp))
    return TransferCase(source, target, model, draw(st.sampled_from(policies)))


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
    layout = draw(st.sampled_from(layouts_for(attention)))
    if not get_layout(layout).paged:
        return layout, 1
    return layout, draw(st.integers(1, max_block_size))


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
