"""The reconstruction property for hybrid models, in process: every layer group's pieces,
cut from oracle-filled senders by the group plan, rebuild every receiver's KV and state
exactly once and bit for bit, with the plan's bytes [GROUP-3, STATE-1, STATE-2, WINDOW-1]."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.conformance.draws.hybrids import KINDS, hybrid_model
from kvspec.tensors import group_reshard as gr
from kvspec.tensors.state_oracle import oracle_state
from kvspec.topology.group_plan import GroupPlan, plan_groups
from kvspec.topology.groups import ChunkedLocal, DraftAttention, Mamba2State, SlidingWindow
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens
from kvspec.topology.windows import chunk_tokens, window_tokens

MAMBA2_ONE_GROUP = ModelShape(
    3,
    2,
    4,
    groups=(Mamba2State(num_heads=4, head_dim=2, n_groups=1, d_state=3, conv_kernel=3),),
    layers=(1, 0, 1),
)
"""vllm#55208's shape: one Mamba-2 group, so B and C are replicated while x is split."""

SLIDING = ModelShape(4, 4, 2, groups=(SlidingWindow(4, 2, window=20),), layers=(1, 0, 1, 0))


def move(plan: GroupPlan, request: str = "req-0", seed: int = 0) -> dict:
    """Fill the senders from the oracles, cut every edge, land every piece; return the
    problems per (group, receiver) and the bytes per (group, src, dst)."""
    senders = gr.plan_regions(plan, receiving=False)
    receivers = gr.plan_regions(plan, receiving=True)
    data = {
        key: gr.fill(plan.model, region, request, layout=plan.source, rank=key[1], seed=seed)
        for key, region in senders.items()
        if not region.empty()
    }
    into = {key: gr.empty(plan.model, region) for key, region in receivers.items()}
    counts = {key: gr.counters(buffers) for key, buffers in into.items()}
    moved: dict[tuple[int, int, int], int] = defaultdict(int)
    for edge in plan.edges:
        source = (edge.group, edge.src)
        for piece in gr.cut(edge, senders[source], data[source], plan.seq_len):
            target = (edge.group, edge.dst)
            gr.place(piece, receivers[target], into[target], counts[target])
            moved[(edge.group, edge.src, edge.dst)] += (
                piece.data.numel() * piece.data.element_size()
            )
    problems = {
        key: gr.check_region(
            plan.model,
            region,
            into[key],
            counts[key],
            request,
            layout=plan.target,
            rank=key[1],
            seed=seed,
        )
        for key, region in receivers.items()
        if not region.empty()
    }
    return {"problems": {k: v for k, v in problems.items() if v}, "moved": dict(moved)}


CHUNKED = ModelShape(3, 2, 4, groups=(ChunkedLocal(2, 4, chunk=10),), layers=(1, 0, 1))
"""A chunked local-attention group of 10 tokens beside full attention [LOCAL-1]."""

INDEXED = ModelShape(
    3,
    1,
    8,
    "mla",
    groups=(DraftAttention(1, 4, "mla", index_head_dim=128),),
    layers=(0, 1, 0),
    index_head_dim=256,
)
"""An MLA latent and an MLA draft layer, each with a sparse indexer [INDEX-1]."""


@st.composite
def hybrid_plans(draw: st.DrawFn) -> GroupPlan:
    model = ModelShape.from_dict(draw(hybrid_model((*KINDS, "chunked"))))
    pp = st.sampled_from([p for p in (1, 2) if p <= model.num_layers])
    source = StageLayout(draw(st.sampled_from([1, 2, 4])), draw(pp))
    target = StageLayout(draw(st.sampled_from([1, 2, 4])), draw(pp))
    return plan_groups(
        source,
        target,
        model,
        seq_len=draw(st.integers(1, 48)),
        block_size=draw(st.sampled_from([1, 4, 16])),
        policy=draw(st.sampled_from(["lowest", "balanced"])),
    )


@given(plan=hybrid_plans(), seed=st.integers(0, 2**16))
@example(plan=plan_groups(StageLayout(1), StageLayout(2), MAMBA2_ONE_GROUP, seq_len=5), seed=0)
@example(plan=plan_groups(StageLayout(4), StageLayout(1), MAMBA2_ONE_GROUP, seq_len=5), seed=1)
@example(
    plan=plan_groups(StageLayout(2), StageLayout(4, 2), SLIDING, seq_len=45, block_size=4), seed=2
)
@example(  # a chunked group on a chunk boundary that is no block boundary moves nothing
    plan=plan_groups(StageLayout(1), StageLayout(2), CHUNKED, seq_len=20, block_size=8), seed=3
)
@example(
    plan=plan_groups(StageLayout(1), StageLayout(2), CHUNKED, seq_len=27, block_size=8), seed=4
)
@example(plan=plan_groups(StageLayout(2), StageLayout(4, 2), INDEXED, seq_len=9), seed=5)
def test_every_group_of_every_receiver_is_rebuilt_with_the_plans_bytes(
    plan: GroupPlan, seed: int
) -> None:
    """RESHARD-2 for hybrids: each receiver's KV of every per-token group and every state
    part arrives exactly once, equals the oracle bit for bit, and each edge moves exactly
    the plan's bytes [GROUP-3, STATE-2, WINDOW-1, LOCAL-1, INDEX-1]."""
    result = move(plan, seed=seed)
    assert result["problems"] == {}
    assert result["moved"] == {k: n for k, n in plan.bytes_per_edge().items() if n}


def test_a_sliding_window_receiver_gets_only_its_block_aligned_window() -> None:
    """WINDOW-1: the window's edges carry the last W tokens from a block boundary; a piece
    with an older token (from a sender that kept them) is refused where it lands."""
    plan = plan_groups(StageLayout(1), StageLayout(2), SLIDING, seq_len=45, block_size=4)
    window = window_tokens(20, 45, 4)
    assert window.tokens() == list(range(24, 45))
    for edge in plan.edges:
        if edge.group == 1:
            assert edge.tokens == window
            assert edge.nbytes == len(edge.heads) * len(edge.layers) * len(window) * 2 * 2 * 2
    senders = gr.plan_regions(plan, receiving=False)
    receivers = gr.plan_regions(plan, receiving=True)
    edge = next(e for e in plan.edges if e.group == 1)
    assert senders[(1, edge.src)].tokens == window  # the sender evicted the rest [WINDOW-2]
    # A sender whose one block spans the request still holds every token.
    region = gr.held_region(
        plan.source, SLIDING, 1, edge.src, seq_len=45, block_size=64, receiving=False
    )
    assert region.tokens == Tokens.span(0, 45)
    data = gr.fill(SLIDING, region, "req-0", layout=plan.source, rank=edge.src)
    whole = gr.Piece(
        1,
        edge.src,
        edge.dst,
        edge.layers,
        data["kv"][[region.layers.index(x) for x in edge.layers]][:, :, :, edge.heads],
        heads=edge.heads,
        tokens=region.tokens,
    )
    target = receivers[(1, edge.dst)]
    buffers = gr.empty(SLIDING, target)
    with pytest.raises(ValueError, match=r"needs only 24-44 \[WINDOW-1\]"):
        gr.place(whole, target, buffers, gr.counters(buffers))


def test_a_replicated_state_part_read_at_a_scaled_offset_is_caught() -> None:
    """vllm#55208: with one Mamba-2 group, scaling B's offset by the TP ratio reads C as
    B; the receiver's check names the part that went wrong [STATE-2]."""
    plan = plan_groups(StageLayout(1), StageLayout(2), MAMBA2_ONE_GROUP, seq_len=3)
    senders = gr.plan_regions(plan, receiving=False)
    receivers = gr.plan_regions(plan, receiving=True)
    dst = 1
    target = receivers[(1, dst)]
    buffers = gr.empty(MAMBA2_ONE_GROUP, target)
    counts = gr.counters(buffers)
    for edge in (e for e in plan.edges if e.group == 1 and e.dst == dst):
        region = senders[(1, edge.src)]
        data = gr.fill(MAMBA2_ONE_GROUP, region, "req-0", layout=plan.source, rank=edge.src)
        for piece in gr.cut(edge, region, data, plan.seq_len):
            if piece.part == "B":  # the field bug: B read at rank x its size, i.e. C's place
                wrong = data["C"][region.layers.index(piece.layers[0])].reshape(-1)
                piece = gr.Piece(**{**piece.__dict__, "data": wrong[: piece.data.numel()]})
            gr.place(piece, target, buffers, counts)
    verdict = gr.check_region(
        MAMBA2_ONE_GROUP, target, buffers, counts, "req-0", layout=plan.target, rank=dst
    )
    assert verdict is not None and "group 1 (mamba2), B:" in verdict


def test_state_oracle_units_agree_across_tp() -> None:
    """ORACLE-4 for states: a rank's units are the same elements as in the TP1 state."""
    model = MAMBA2_ONE_GROUP
    whole = oracle_state(model, 1, "r", layers=(0, 2))
    for rank in range(2):
        part = oracle_state(model, 1, "r", layers=(0, 2), attn_tp=2, attn_tp_rank=rank)
        assert torch.equal(part["x"], whole["x"][:, 2 * rank : 2 * rank + 2])
        assert torch.equal(part["B"], whole["B"])  # one group: every rank holds it whole
        assert torch.equal(part["ssm"], whole["ssm"][:, 2 * rank : 2 * rank + 2])


@given(
    seq_len=st.integers(0, 90),
    blocks=st.sampled_from([(4, 8), (8, 4), (4, 4), (16, 4), (4, 16), (12, 8), (8, 12)]),
    tps=st.sampled_from([(1, 2), (2, 1), (1, 4), (4, 1)]),
    chunked=st.booleans(),
)
@example(seq_len=45, blocks=(8, 4), tps=(1, 2), chunked=False)
@example(seq_len=50, blocks=(4, 8), tps=(2, 1), chunked=False)  # refused: 24-27 evicted
def test_sender_and_receiver_block_sizes_differ(
    seq_len: int, blocks: tuple[int, int], tps: tuple[int, int], chunked: bool
) -> None:
    """WINDOW-2: with the sender's and the receiver's own block sizes, either every element
    of the receiver's block-aligned window arrives from a sender that still holds it, or
    the plan is refused naming both block sizes; never rows missing or wrong."""
    group = ChunkedLocal(4, 2, chunk=20) if chunked else SlidingWindow(4, 2, window=20)
    model = ModelShape(4, 4, 2, groups=(group,), layers=(1, 0, 1, 0))
    sender, receiver = blocks
    needed = (chunk_tokens if chunked else window_tokens)(20, seq_len, receiver)
    held = (chunk_tokens if chunked else window_tokens)(20, seq_len, sender)
    evicted = needed.intersect(Tokens.span(0, seq_len)) != needed.intersect(held)
    build = dict(seq_len=seq_len, source_block_size=sender, target_block_size=receiver)
    if evicted:
        with pytest.raises(ValueError, match=rf"blocks of {receiver} .* blocks of {sender} "):
            plan_groups(StageLayout(tps[0]), StageLayout(tps[1]), model, **build)
        return
    plan = plan_groups(StageLayout(tps[0]), StageLayout(tps[1]), model, **build)
    assert all(e.tokens == needed for e in plan.edges if e.group == 1)
    result = move(plan)
    assert not any(result["problems"].values())
    assert result["moved"] == {k: n for k, n in plan.bytes_per_edge().items() if n}
