"""Checks of the byte-range descriptors a pull connector posts [DESC-1..3].

An example is one edge of a transfer plan drawn inside the adapter's domain, a token
range of a request, and both ranks' registered caches: layouts and block sizes drawn
independently (so they differ, either way, with partial last blocks), shuffled block
ids. The two layouts are plain K/V ones, or record layouts (inline scales [LAYOUT-6]) or
block-scaled ones (per-block planes and side tensors, split slot axes among them
[LAYOUT-8]) that hold the same information, with a model each holds. Where a stage
splits requests by tokens [CP-1], the request is the case's length and each side holds
its own tokens' blocks; the range is drawn to meet the edge's token set. DESC-2 makes
one region one byte too short, the receiver's or the sender's. The adapter's list is
judged by its effect against the spec's plan: any list that writes the receiver's share
once from the right bytes passes, and its count is reported against the minimum.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, within_domain
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect_refused, fail
from kvspec.conformance.domain import Domain
from kvspec.conformance.draws.records import holdable_records, scaled_dtype, scaled_geometry
from kvspec.memory.descriptors import (
    DescriptorPlan,
    RegisteredCache,
    judge_descriptors,
    plan_descriptors,
    share_positions,
)
from kvspec.memory.layout_model import CacheLayout
from kvspec.memory.paged import blocks_needed
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout

LAYOUT_KINDS: tuple[str, ...] = ("plain", "record", "block-scaled")
"""The kinds of cache layout a descriptor example's two sides are drawn from: K/V cells,
records with inline scales [LAYOUT-6], per-block planes and side tensors [LAYOUT-8]."""


SPLIT_SLOTS = "block-scaled, split slot axis"
"""A block-scaled layout with a plane or side tensor that splits its slot axis [LAYOUT-8]."""


def layout_kinds(layout: CacheLayout) -> tuple[str, ...]:
    """The kinds ``layout`` is: one of :data:`LAYOUT_KINDS`, and :data:`SPLIT_SLOTS` too
    where a plane or side tensor of it splits its slot axis."""
    kind = "plain" if layout.plain else "block-scaled" if layout.scaled else "record"
    split = any(p.split for p in (*layout.planes, *(s.plane for s in layout.side)))
    return (kind, SPLIT_SLOTS) if split else (kind,)


def _kinds(adapter: Adapter) -> dict[str, tuple[str, ...]]:
    """The layouts of each kind the domain holds a model in, for the DESC draws."""
    domain = adapter.domain
    found = {
        "plain": tuple(n for a in domain.attention for n in domain.cache_layouts(a)),
        "record": holdable_records(adapter),
        "block-scaled": domain.scaled_layouts(),
    }
    return {kind: names for kind, names in found.items() if names}


def _same_information(
    domain: Domain, layout: str, others: tuple[str, ...], model: ModelShape
) -> list[str]:
    """The layouts of ``others`` whose cells hold what ``layout``'s hold for ``model``: a
    descriptor list can carry one into the other [LAYOUT-6, DESC-1]."""
    want = domain.layout(layout).information(model.dtype, model.head_dim, model.kv_tensors)
    return [
        n
        for n in others
        if domain.layout(n).kv_tensors in (model.kv_tensors, None)
        and domain.layout(n).information(model.dtype, model.head_dim, model.kv_tensors) == want
    ]


def _tensors(adapter: Adapter, layout: str) -> int | None:
    """How many tensors a cell of the domain's ``layout`` holds (None: any) [LAYOUT-1]."""
    return adapter.domain.layout(layout).kv_tensors


@st.composite
def _layouts(
    draw: st.DrawFn, adapter: Adapter, case: TransferCase
) -> tuple[TransferCase, str, str]:
    """The case (its model made one the layouts hold) and the two sides' layouts: plain,
    record or block-scaled, the receiver's holding what the sender's holds."""
    model = case.model
    wanted = 1 if model.attention == "mla" else 2
    kinds = {
        kind: fitting
        for kind, names in _kinds(adapter).items()
        if (
            fitting := tuple(
                n for n in names if adapter.domain.layout(n).kv_tensors in (wanted, None)
            )
        )
    }
    kind = draw(st.sampled_from([k for k in LAYOUT_KINDS if k in kinds]))
    if kind == "plain":
        names = adapter.domain.cache_layouts(model.attention)
        return case, draw(st.sampled_from(names)), draw(st.sampled_from(names))
    fitting = kinds[kind]
    source = draw(st.sampled_from(sorted(fitting)))
    spec = adapter.domain.layout(source)
    if kind == "record":
        dtype, head_dim = spec.dtypes[0] if spec.dtypes else model.dtype, 4 * model.head_dim
    else:
        dtype = scaled_dtype(adapter, source)
        head_dim = draw(st.sampled_from(scaled_geometry(spec)[0]))
    head_dim = spec.fixed_head_dim or head_dim
    shaped = dataclasses.replace(model, head_dim=head_dim, dtype=dtype, scale_format=None)
    target = draw(st.sampled_from(_same_information(adapter.domain, source, kinds[kind], shaped)))
    return dataclasses.replace(case, model=shaped), source, target


@st.composite
def _side(draw: st.DrawFn, adapter: Adapter, layout: str, slots: int) -> dict[str, Any]:
    """A registered cache of ``layout`` whose request holds ``slots`` token slots (its
    share's last)."""
    spec = adapter.domain.layout(layout)
    sizes = [b for b in adapter.domain.block_sizes if b <= 5] or [min(adapter.domain.block_sizes)]
    if spec.scaled:
        sizes = scaled_geometry(spec)[1]
    block_size = draw(st.sampled_from(sizes)) if spec.paged else 1
    needed = blocks_needed(slots, block_size)
    num_blocks = needed + draw(st.integers(0, 2))
    ids = draw(st.permutations(range(num_blocks)))[:needed]
    return {"layout": layout, "block_size": block_size, "num_blocks": num_blocks, "block_ids": ids}


@st.composite
def desc_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    """An edge, a token range and both ranks' registered caches [DESC-1]."""
    domain = adapter.domain
    attention = tuple(a for a in domain.attention if domain.cache_layouts(a)) or domain.attention
    case = draw(
        domain.cases(
            policies=adapter.policies,
            max_layers=3,
            max_head_dim=3,
            max_pp=2,
            attention=attention,
            partition=adapter.layer_partition,
        )
    )
    case, *layouts = draw(_layouts(adapter, case))
    plan = case.plan(adapter.policy_rules.get(case.policy))
    edge = draw(st.sampled_from(plan.edges))
    # A sharded case has its seq_len [PLAN-6].
    seq_len = cast(int, case.seq_len) if case.sharded else draw(st.integers(1, 9))
    last = seq_len - 1 if edge.tokens is None else edge.tokens.ranges[-1].stop - 1
    start = draw(st.integers(0, last))  # the range meets the edge's tokens [PLAN-6]
    share = share_positions(plan, edge, range(start, seq_len))
    sides = [
        draw(_side(adapter, layout, slots))
        for layout, slots in zip(layouts, (share.source_slots, share.target_slots), strict=True)
    ]
    return {
        "case": case.to_dict(),
        "edge": [edge.src, edge.dst],
        "tokens": [start, seq_len],
        "sides": sides,
    }


def _pin(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    edge: tuple[int, int],
    sides: tuple[tuple[str, int, int, list[int]], ...],
    tokens: tuple[int, int],
) -> Example:
    return {
        "case": TransferCase(source, target, model).to_dict(),
        "edge": list(edge),
        "tokens": list(tokens),
        "sides": [
            {"layout": lay, "block_size": bs, "num_blocks": nb, "block_ids": ids}
            for lay, bs, nb, ids in sides
        ],
    }


DESC_PINS = (
    # kvspec desc's example: TP8 -> TP2, 4 KV heads, vLLM packed HND -> SGLang pool, 16 -> 4
    _pin(
        StageLayout(8),
        StageLayout(2),
        ModelShape(2, 4, 2),
        (2, 0),
        (("vllm_packed_hnd", 4, 3, [2, 0]), ("sglang_mha", 2, 5, [4, 1, 3])),
        (0, 6),
    ),
    # vllm#45330: TP8 -> TP16 with 8 KV heads (the receiver's heads are replicated)
    _pin(
        StageLayout(8),
        StageLayout(16),
        ModelShape(2, 8, 2),
        (3, 7),
        (("flash_attn_hnd", 2, 3, [1, 2]), ("vllm_packed_nhd", 3, 2, [1, 0])),
        (1, 4),
    ),
    # sglang#31968: decode TP beyond the KV heads; a partial last block on both sides
    _pin(
        StageLayout(2),
        StageLayout(8),
        ModelShape(2, 4, 2),
        (1, 5),
        (("trtllm_pool", 3, 2, [1, 0]), ("vllm_packed_hnd_layers", 2, 4, [3, 1, 0])),
        (0, 5),
    ),
    # fp8 records with inline scales [LAYOUT-6]: vLLM's per-token-head HND -> NHD
    _pin(
        StageLayout(4),
        StageLayout(2),
        ModelShape(2, 4, 8, dtype="float8_e4m3fn"),
        (1, 0),
        (("vllm_pth_hnd", 3, 3, [2, 0]), ("vllm_pth_nhd", 2, 4, [3, 1, 0])),
        (1, 6),
    ),
    # NVFP4 pages [LAYOUT-8]: SM100's V scales in 4-token groups (a split slot axis) ->
    # FA2's in slot order, a partial last block on both sides
    _pin(
        StageLayout(2),
        StageLayout(1),
        ModelShape(1, 2, 64),
        (1, 0),
        (("vllm_nvfp4_hnd", 4, 3, [2, 0]), ("vllm_nvfp4_fa2_hnd", 2, 4, [3, 0, 1])),
        (1, 6),
    ),
)

SIDES: tuple[str, ...] = ("receiver", "sender")
"""Which rank's registered region DESC-2's probe makes one byte too short [DESC-2.2]."""


@st.composite
def short_region_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A descriptor example and the side whose region is made too short [DESC-2.2]."""
    return {**draw(desc_examples(adapter)), "short_side": draw(st.sampled_from(SIDES))}


SHORT_PINS = tuple({**pin, "short_side": side} for pin in DESC_PINS[:2] for side in SIDES)


class _Setup:
    """The example's case, edge, registered caches and the spec's plan."""

    def __init__(self, ctx: Context, example: Example) -> None:
        self.case = TransferCase.from_dict(example["case"])
        within_domain(ctx, self.case)
        for side in example["sides"]:
            if side["layout"] not in ctx.adapter.domain.layouts:
                raise OutsideDomain
        self.plan = self.case.plan(ctx.adapter.policy_rules.get(self.case.policy))
        self.src, self.dst = example["edge"]
        self.edge = self.plan.edge(self.src, self.dst)
        self.tokens = range(*example["tokens"])
        model = self.case.model
        owners = (
            rank_ownership(self.case.source, model, self.src),
            rank_ownership(self.case.target, model, self.dst),
        )
        self.caches = [
            RegisteredCache(
                example_layout(side),
                len(owner.layers),
                side["num_blocks"],
                side["block_size"],
                len(owner.heads),
                model.head_dim,
                model.dtype,
                tensors_per_layer=model.kv_tensors,
            )
            for side, owner in zip(example["sides"], owners, strict=True)
        ]
        self.ids = [list(side["block_ids"]) for side in example["sides"]]
        self.what = (
            f"{self.case.describe()}, edge {self.src}->{self.dst} (heads {self.edge.heads.start}"
            f"..{self.edge.heads.stop - 1}, layers {self.edge.layers.start}.."
            f"{self.edge.layers.stop - 1}), tokens {self.tokens.start}..{self.tokens.stop - 1}, "
            f"{self.caches[0].layout.name} blocks of {self.caches[0].block_size} ids "
            f"{self.ids[0]} -> {self.caches[1].layout.name} blocks of "
            f"{self.caches[1].block_size} ids {self.ids[1]}"
        )

    def reference(self) -> DescriptorPlan:
        return plan_descriptors(
            self.plan,
            self.edge,
            self.caches[0],
            self.ids[0],
            self.caches[1],
            self.ids[1],
            self.tokens,
        )

    def ask(self, ctx: Context, caches: list[RegisteredCache] | None = None) -> Any:
        source, target = caches or self.caches
        return ctx.adapter.descriptors(
            self.case,
            self.src,
            self.dst,
            source,
            list(self.ids[0]),
            target,
            list(self.ids[1]),
            self.tokens,
        )


@check(
    "DESC-1",
    "exact-effect",
    "the list writes every byte of the receiver's share once, from the right byte, and "
    "nothing else, inside the registered regions",
    needs=("descriptors",),
    strategy=desc_examples,
    examples=DESC_PINS,
    weight=0.6,
    covers=("DESC-1.1", "DESC-1.2", "DESC-1.3", "DESC-1.4", "DESC-2.1"),
)
def exact_effect(ctx: Context, example: Example) -> None:
    setup = _Setup(ctx, example)
    reference = setup.reference()
    verdict = judge_descriptors(setup.ask(ctx), reference)
    if not verdict.ok:
        fail(f"{setup.what}: " + "; ".join(verdict.problems))


@check(
    "DESC-2",
    "refuses-short-region",
    "block ids whose bytes lie past a registered region's end, the receiver's or the "
    "sender's, are refused, not clipped",
    needs=("descriptors",),
    strategy=short_region_examples,
    examples=SHORT_PINS,
    weight=0.4,
    covers=("DESC-2.2",),
)
def refuses_short_region(ctx: Context, example: Example) -> None:
    setup = _Setup(ctx, example)
    reference = setup.reference()
    side = example["short_side"]
    index = 1 if side == "receiver" else 0  # the caches are (sender, receiver)
    if side == "receiver":
        last = max(reference.descriptors, key=lambda d: d.dst_offset + d.length)
        region, size = last.dst_region, last.dst_offset + last.length - 1
    else:
        last = max(reference.descriptors, key=lambda d: d.src_offset + d.length)
        region, size = last.src_region, last.src_offset + last.length - 1
    # one byte short of the request's last byte in that region
    caches = list(setup.caches)
    caches[index] = RegisteredCache.from_dict(
        {**caches[index].to_dict(), "region_bytes": {region: size}}
    )
    expect_refused(
        "DESC-2.2",
        f"{setup.what}, the {side}'s region {region!r} registered with {size} bytes "
        f"(the request's bytes run to {size + 1})",
        lambda: setup.ask(ctx, caches),
        naming=(region, size),
    )


@check(
    "DESC-3",
    "minimal",
    "a list declared coalesced has the minimum count: no two ranges continue each other",
    needs=("descriptors",),
    strategy=desc_examples,
    examples=DESC_PINS,
    weight=0.4,
    missing=lambda adapter: (
        None if adapter.coalesces else "the adapter does not declare its lists coalesced"
    ),
    covers=("DESC-3.1",),
)
def minimal(ctx: Context, example: Example) -> None:
    setup = _Setup(ctx, example)
    verdict = judge_descriptors(setup.ask(ctx), setup.reference())
    if not verdict.ok:
        fail(f"{setup.what}: " + "; ".join(verdict.problems))
    if verdict.count != verdict.minimum:
        fail(
            f"{setup.what}: {verdict.count} descriptors for {verdict.share_bytes} bytes; the "
            f"minimum for this layout pair is {verdict.minimum}, and the adapter declares its "
            "lists coalesced [DESC-3.1]"
        )
