"""Checks of the byte-range descriptors a pull connector posts [DESC-1..3].

An example is one edge of a transfer plan drawn inside the adapter's domain, a token
range of a request, and both ranks' registered caches: layouts and block sizes drawn
independently (so they differ, either way, with partial last blocks), shuffled block
ids. Where a stage splits requests by tokens [CP-1], the request is the case's length
and each side holds its own tokens' blocks; the range is drawn to meet the edge's token
set. The adapter's list is judged by its effect against the spec's plan: any list that
writes the receiver's share once from the right bytes passes, and its count is
reported against the minimum.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, within_domain
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.checks.expectations import expect_refused, fail
from kvspec.memory.descriptors import (
    DescriptorPlan,
    RegisteredCache,
    judge_descriptors,
    plan_descriptors,
    share_positions,
)
from kvspec.memory.paged import blocks_needed
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout


@st.composite
def _side(draw: st.DrawFn, adapter: Adapter, attention: str, slots: int) -> dict[str, Any]:
    """A registered cache whose request holds ``slots`` token slots (its share's last)."""
    layout = draw(st.sampled_from(adapter.domain.cache_layouts(attention)))
    sizes = [b for b in adapter.domain.block_sizes if b <= 5] or [min(adapter.domain.block_sizes)]
    block_size = draw(st.sampled_from(sizes)) if adapter.domain.layout(layout).paged else 1
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
    plan = case.plan(adapter.policy_rules.get(case.policy))
    edge = draw(st.sampled_from(plan.edges))
    # A sharded case has its seq_len [PLAN-6].
    seq_len = cast(int, case.seq_len) if case.sharded else draw(st.integers(1, 9))
    last = seq_len - 1 if edge.tokens is None else edge.tokens.ranges[-1].stop - 1
    start = draw(st.integers(0, last))  # the range meets the edge's tokens [PLAN-6]
    share = share_positions(plan, edge, range(start, seq_len))
    sides = [
        draw(_side(adapter, case.model.attention, slots))
        for slots in (share.source_slots, share.target_slots)
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
)


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

    def reference(self, target: RegisteredCache | None = None) -> DescriptorPlan:
        return plan_descriptors(
            self.plan,
            self.edge,
            self.caches[0],
            self.ids[0],
            target or self.caches[1],
            self.ids[1],
            self.tokens,
        )

    def ask(self, ctx: Context, target: RegisteredCache | None = None) -> Any:
        return ctx.adapter.descriptors(
            self.case,
            self.src,
            self.dst,
            self.caches[0],
            list(self.ids[0]),
            target or self.caches[1],
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
    "block ids whose bytes lie past a registered region's end are refused, not clipped",
    needs=("descriptors",),
    strategy=desc_examples,
    examples=DESC_PINS,
    weight=0.4,
    covers=("DESC-2.2",),
)
def refuses_short_region(ctx: Context, example: Example) -> None:
    setup = _Setup(ctx, example)
    reference = setup.reference()
    last = max(reference.descriptors, key=lambda d: d.dst_offset + d.length)
    size = last.dst_offset + last.length - 1  # one byte short of the request's last byte
    short = RegisteredCache.from_dict(
        {**setup.caches[1].to_dict(), "region_bytes": {last.dst_region: size}}
    )
    expect_refused(
        "DESC-2.2",
        f"{setup.what}, the receiver's region {last.dst_region!r} registered with {size} bytes "
        f"(the request's bytes run to {size + 1})",
        lambda: setup.ask(ctx, short),
        naming=(last.dst_region, size),
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
