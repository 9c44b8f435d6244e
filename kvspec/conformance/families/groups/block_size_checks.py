"""Checks of block sizes per stage: a hybrid's attention block size per TP [BLOCK-1], and
the tokens a window or chunk moves when sender and receiver block sizes differ
[WINDOW-2].

Models are drawn as small hybrids with sliding-window and chunked groups (for WINDOW-2)
or with state groups (for BLOCK-1); the expected values are the spec's own functions.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws import spec_rule
from kvspec.conformance.draws.hybrids import STATES, hybrid_tp_sizes
from kvspec.conformance.families.groups.checks import LOCAL, _case, _cases
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import ChunkedLocal, SlidingWindow, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import model_preset
from kvspec.topology.stage import StageLayout
from kvspec.topology.windows import needed_tokens

BLOCKS = (1, 2, 3, 4, 8, 12, 16)
"""Block sizes drawn for either side: equal, dividing each other, and neither."""


@st.composite
def _two_blocks(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_cases(adapter, LOCAL))
    example["source_block_size"] = draw(st.sampled_from(BLOCKS))
    example["target_block_size"] = draw(st.sampled_from(BLOCKS))
    return example


def _expected(
    adapter: Adapter, case: TransferCase, seq_len: int, sender: int, receiver: int
) -> dict[tuple[int, int, int], list[tuple[int, int]]] | str:
    """The reference's tokens per window or chunk edge, under the adapter's replica rule
    [PLAN-4], or its refusal's text."""
    try:
        plan = case.group_plan(
            seq_len,
            spec_rule(adapter, case),
            source_block_size=sender,
            target_block_size=receiver,
        )
    except ValueError as error:
        return str(error)
    groups = case.model.layer_groups
    return {
        (e.group, e.src, e.dst): [(r.start, r.stop) for r in e.tokens.ranges]
        for e in plan.edges
        if e.tokens is not None and isinstance(groups[e.group], SlidingWindow | ChunkedLocal)
    }


_PINNED = TransferCase(
    StageLayout(1),
    StageLayout(2),
    ModelShape(
        4,
        2,
        4,
        groups=(
            group_from_dict({"kind": "sliding", "num_kv_heads": 2, "head_dim": 4, "window": 20}),
        ),
        layers=(1, 0, 1, 0),
    ),
).to_dict()
"""A window of 20 over 2 KV heads: after 50 tokens it starts at 30."""


@check(
    "WINDOW-2",
    "block-sizes-differ",
    "a window or chunk edge carries the receiver's block-aligned tokens, which the sender, "
    "aligned to its own blocks, still holds; a plan that needs evicted tokens is refused",
    needs=("block-sizes",),
    strategy=_two_blocks,
    examples=(
        # sender 8, receiver 4: the receiver needs 28-49, the sender holds 24-49: planned
        {"case": _PINNED, "seq_len": 50, "source_block_size": 8, "target_block_size": 4},
        # sender 4, receiver 8: the receiver needs 24-49, the sender evicted 24-27: refused
        {"case": _PINNED, "seq_len": 50, "source_block_size": 4, "target_block_size": 8},
        # sender 12, receiver 8: 24-49 needed, 24-49 held although neither divides the other
        {"case": _PINNED, "seq_len": 50, "source_block_size": 12, "target_block_size": 8},
    ),
    covers=("WINDOW-2.1", "WINDOW-2.2", "WINDOW-2.3"),
)
def _block_sizes_differ(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    seq_len = example["seq_len"]
    sender, receiver = example["source_block_size"], example["target_block_size"]
    where = (
        f"{case.source.describe()} -> {case.target.describe()}, {case.model.describe()}, "
        f"{seq_len} tokens, sender blocks {sender}, receiver blocks {receiver}"
    )
    want = _expected(ctx.adapter, case, seq_len, sender, receiver)
    call = lambda: ctx.adapter.window_tokens(case, seq_len, sender, receiver)  # noqa: E731
    if isinstance(want, str):
        expect_refused(
            "WINDOW-2.3",
            f"{where}: the receiver needs evicted tokens ({want})",
            call,
            naming=_evicted(case, seq_len, sender, receiver),
        )
        return
    try:
        got: Any = call()
    except ValueError as error:
        fail(
            f"{where}: the sender still holds every token the receiver needs, so the plan must "
            f"be made [WINDOW-2.2]; the implementation refused it: {error}"
        )
    got = {key: [tuple(r) for r in ranges] for key, ranges in dict(got).items() if ranges}
    want = {key: ranges for key, ranges in want.items() if ranges}
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            group, src, dst = key
            expect(
                False,
                f"{where}: group {group} {case.model.layer_groups[group].describe()}, edge "
                f"{src} -> {dst} carries tokens {want.get(key, [])} as [start, stop) ranges, "
                f"the window aligned to the receiver's blocks [WINDOW-2.1]; the implementation "
                f"says {got.get(key, [])}",
            )


def _evicted(case: TransferCase, seq_len: int, sender: int, receiver: int) -> tuple[object, ...]:
    """What a refusal of evicted tokens must name: the evicted token range of each window
    or chunk group that has one, as ``first-last`` [WINDOW-2]. Block sizes are not among
    them: a message that names only a size (one of a handful of small numbers) says
    nothing about which tokens are missing."""
    found: list[object] = []
    for group in case.model.layer_groups:
        if not isinstance(group, SlidingWindow | ChunkedLocal):
            continue
        needed = needed_tokens(group, seq_len, receiver)
        held = needed_tokens(group, seq_len, sender)
        if needed is None or held is None or not len(needed):
            continue
        first_needed = needed.ranges[0].start
        first_held = held.ranges[0].start if len(held) else seq_len
        if first_needed < first_held:
            found.append(f"{first_needed}-{first_held - 1}")
    return tuple(found)


@st.composite
def _state_models(draw: st.DrawFn, adapter: Adapter) -> Example:
    # Mostly state hybrids; sometimes windows and chunks only, which keep the user's size.
    example = draw(_cases(adapter, draw(st.sampled_from([STATES, STATES, LOCAL]))))
    example["attn_tp"] = draw(st.sampled_from(hybrid_tp_sizes(adapter)))
    example["user_block_size"] = draw(st.sampled_from([None, 1, 16, 64, 256, 1024]))
    return example


@check(
    "BLOCK-1",
    "hybrid-block-size",
    "a hybrid stage's block size is the aligned ceiling of its rank's state page over one "
    "token's attention page at its TP; a user block size is kept when at least that",
    needs=("hybrid-block-size",),
    strategy=_state_models,
    examples=(
        # Qwen3-Next at TP4: 16 x ceil(274432 / (16 x 1024)) = 272, not TP1's 544
        {
            "case": TransferCase(
                StageLayout(1), StageLayout(4), model_preset("qwen3-next-80b-a3b")
            ).to_dict(),
            "attn_tp": 4,
            "user_block_size": None,
        },
        {
            "case": TransferCase(
                StageLayout(1), StageLayout(4), model_preset("qwen3-next-80b-a3b")
            ).to_dict(),
            "attn_tp": 4,
            "user_block_size": 16,
        },
    ),
    covers=("BLOCK-1.1", "BLOCK-1.2"),
)
def _hybrid_block_size(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    tp, user = example["attn_tp"], example["user_block_size"]
    want = hybrid_block_size(case.model, tp, block_size=user)
    got = ctx.adapter.hybrid_block_size(case.model, tp, user)
    obligation = "BLOCK-1.1" if user is None else "BLOCK-1.2"
    expect(
        got == want,
        f"{case.model.describe()} at attention TP {tp}, user block size {user}: the block "
        f"size is {want} tokens [{obligation}]; the implementation says {got}",
    )
