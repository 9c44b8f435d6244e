"""Every parallel layout engines deploy: attention groups, token shards, DP ranks and TP pairs
that do not divide [STAGE-2, CP-1..3, PLAN-1, PLAN-6, DP-1, SLICE-1, SLICE-4, PORT-1].

The reconstruction property of the project holds over the whole domain, in-process: slice
-> send -> merge reproduces every target shard bit for bit. Defaults (dp = cp = dcp = 1,
TP pairs that divide) keep the first release's plans, markers, keys, ports and payloads.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.naming.keys import recv_keys, send_keys
from kvspec.naming.ports import (
    DeployedStage,
    Deployment,
    PortScheme,
    check_deployment,
    port,
    rank_port,
)
from kvspec.tensors.kv import kv_equal, random_request_kv
from kvspec.tensors.oracle import oracle_kv, verify
from kvspec.tensors.reshard import receive, reshard, send, shard
from kvspec.tensors.slicing import HeadSlice
from kvspec.testing.strategies import cp_rules, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import CPRule, Tokens
from kvspec.transport.payload import merge_payloads, payload_from_shipment
from kvspec.transport.wire import decode, encode

EVERY_AXIS = transfer_cases(
    non_dividing=True,
    dp_sizes=(1, 2, 4),
    cp_sizes=(1, 2, 3, 4),
    dcp_sizes=(1, 2, 4),
    max_layers=4,
)

TP4_TO_TP6 = TransferCase(StageLayout(4), StageLayout(6), ModelShape(2, 12, 2))
CP_TO_TP6 = TransferCase(
    StageLayout(4, cp=2, cp_rule="interleave:16"), StageLayout(6), ModelShape(2, 12, 2), seq_len=40
)
PCP_TO_DCP = TransferCase(
    StageLayout(4, cp=2, cp_rule="zigzag"),
    StageLayout(8, dcp=2, cp_rule="interleave:3"),
    ModelShape(3, 2, 2, dtype="float8_e4m3fn"),
    "balanced",
    seq_len=13,
)
DP_GROUPS = TransferCase(
    StageLayout(8, dp=2), StageLayout(4, 2, dp=2), ModelShape(3, 2, 2), source_dp=1, target_dp=0
)


# -- the reconstruction property over every axis -------------------------------------------


@given(case=EVERY_AXIS, seq_len=st.integers(1, 4), seed=st.integers(0, 2**16))
@example(case=TP4_TO_TP6, seq_len=3, seed=0)
@example(case=CP_TO_TP6, seq_len=1, seed=1)
@example(case=PCP_TO_DCP, seq_len=1, seed=2)
@example(case=DP_GROUPS, seq_len=2, seed=3)
def test_slice_send_merge_reproduces_every_target_shard(
    case: TransferCase, seq_len: int, seed: int
) -> None:
    """RESHARD-2 over the whole domain: both slicing modes, bit for bit; a receiver that
    holds none of the request (no token of it, or another DP group) assembles nothing."""
    n = case.seq_len if case.sharded else seq_len
    full = random_request_kv(case.model, n, seed=seed)
    plan = case.plan()
    sources = shard(full, case.source, case.model, dp_rank=case.source_dp)
    expected = shard(full, case.target, case.model, dp_rank=case.target_dp)
    for slicing in ("sender", "receiver"):
        for dst, got in enumerate(reshard(sources, plan, slicing=slicing)):
            if plan.sources_of(dst):
                assert kv_equal(got, expected[dst]), f"{slicing}-side, target rank {dst}"
            else:
                assert got.data.numel() == 0 and expected[dst].data.numel() == 0


@given(case=EVERY_AXIS)
@example(case=PCP_TO_DCP)
@example(case=DP_GROUPS)
def test_every_owned_cell_arrives_exactly_once(case: TransferCase) -> None:
    """PLAN-2 over (head, layer, token): disjoint edges that cover each receiver exactly,
    each from a sender that holds what it sends; no edge touches another DP group."""
    plan = case.plan()
    n = case.seq_len or 5
    for dst in case.target.ranks():
        receiver = plan.owner("target", dst)
        mine = receiver.tokens if receiver.tokens is not None else Tokens.span(0, n)
        seen: set[tuple[int, int, int]] = set()
        for edge in plan.edges_to(dst):
            sender = plan.owner("source", edge.src)
            assert sender.active and receiver.active
            held = sender.tokens if sender.tokens is not None else Tokens.span(0, n)
            tokens = edge.tokens if edge.tokens is not None else Tokens.span(0, n)
            assert set(edge.heads) <= set(sender.heads) & set(receiver.heads)
            assert tokens == held.intersect(mine)
            cells = {(h, la, t) for h in edge.heads for la in edge.layers for t in tokens.tokens()}
            assert not cells & seen
            seen |= cells
        want = {(h, la, t) for h in receiver.heads for la in receiver.layers for t in mine.tokens()}
        assert seen == (want if receiver.active else set())


def test_payloads_with_token_sets_cross_the_wire_and_merge() -> None:
    """SLICE-4 and PAYLOAD-3: each payload names its tokens; merged by range, any order."""
    case = PCP_TO_DCP
    full = random_request_kv(case.model, case.seq_len, seed=4)
    plan = case.plan()
    sources = shard(full, case.source, case.model)
    expected = shard(full, case.target, case.model)
    for dst in case.target.ranks():
        received = []
        for src in plan.sources_of(dst):
            [shipment] = [s for s in send(plan, src, sources[src]) if s.edge.dst == dst]
            payload = payload_from_shipment(plan, shipment, "req-1")
            assert payload.head_slice.tokens == shipment.edge.tokens
            received.append((src, decode([bytes(f) for f in encode(payload)])))
        merged = merge_payloads(plan, dst, reversed(received))
        assert merged.head_slice.tokens == plan.owner("target", dst).tokens
        assert kv_equal(merged.to_request_kv(), expected[dst])


def test_a_shipment_marked_with_other_tokens_is_refused() -> None:
    """SLICE-4.2: the marker's tokens must be the edge's."""
    case = CP_TO_TP6
    full = random_request_kv(case.model, case.seq_len, seed=5)
    plan = case.plan()
    sources = shard(full, case.source, case.model)
    good = [s for src in plan.sources_of(0) for s in send(plan, src, sources[src])]
    good = [s for s in good if s.edge.dst == 0]
    victim = good[0]
    shifted = Tokens.of(range(r.start + 1, r.stop + 1) for r in victim.edge.tokens.ranges)
    wrong = replace(victim, marker=replace(victim.marker, tokens=shifted))
    with pytest.raises(ValueError, match=r"marked as carrying tokens .* \[SLICE-4\]"):
        receive(plan, 0, [wrong, *good[1:]])


# -- the token rules, from their definitions [CP-1, CP-2] ------------------------------------


@pytest.mark.parametrize(
    ("rule", "shards", "seq_len", "expected"),
    [
        # 22 tokens = 6 blocks of 4 over 3 shards: 2 blocks each, in order.
        ("contiguous:4", 3, 22, [[[0, 8]], [[8, 16]], [[16, 22]]]),
        # 10 tokens over 4 shards: 3, 3, 2, 2 (the first 10 % 4 shards take one more).
        ("contiguous", 4, 10, [[[0, 3]], [[3, 6]], [[6, 8]], [[8, 10]]]),
        # token t to shard (t // 3) % 2.
        ("interleave:3", 2, 10, [[[0, 3], [6, 9]], [[3, 6], [9, 10]]]),
        # blocks of 2: b0, b2, b4 to shard 0; b1, b3 to shard 1.
        ("round_robin_blocks:2", 2, 9, [[[0, 2], [4, 6], [8, 9]], [[2, 4], [6, 8]]]),
        # 4 segments of 11 tokens: 3, 3, 3, 2; shard 0 takes 0 and 3, shard 1 takes 1 and 2.
        ("zigzag", 2, 11, [[[0, 3], [9, 11]], [[3, 9]]]),
    ],
)
def test_each_rule_gives_the_tokens_its_definition_says(
    rule: str, shards: int, seq_len: int, expected: list
) -> None:
    parsed = CPRule.parse(rule)
    assert [parsed.tokens(s, shards, seq_len).to_list() for s in range(shards)] == expected
    assert str(parsed) == rule


@given(rule=cp_rules(), shards=st.integers(1, 6), seq_len=st.integers(0, 80))
def test_every_rule_splits_a_request_into_disjoint_shards(
    rule: str, shards: int, seq_len: int
) -> None:
    parsed = CPRule.parse(rule)
    if parsed.kind == "zigzag" and shards > 1 and seq_len < 2 * shards:
        with pytest.raises(ValueError, match=r"\[CP-2\]"):
            parsed.tokens(0, shards, seq_len)
        return
    held = [parsed.tokens(s, shards, seq_len).tokens() for s in range(shards)]
    assert sorted(t for tokens in held for t in tokens) == list(range(seq_len))


def test_interleave_and_round_robin_blocks_hold_the_same_tokens_but_fit_other_caches() -> None:
    """As sets interleave:I equals round_robin_blocks:I; vLLM needs I to divide the block
    size, TensorRT-LLM distributes whole cache blocks [CP-2]."""
    for s in range(3):
        assert CPRule.parse("interleave:4").tokens(s, 3, 50) == CPRule.parse(
            "round_robin_blocks:4"
        ).tokens(s, 3, 50)
    CPRule.parse("interleave:4").check_block_size(16)
    with pytest.raises(ValueError, match="distributes cache blocks of 4 tokens"):
        CPRule.parse("round_robin_blocks:4").check_block_size(16)
    with pytest.raises(ValueError, match="multiple of 3"):
        CPRule.parse("interleave:3").check_block_size(16)


def _fits(rule: CPRule, block_size: int) -> bool:
    try:
        rule.check_block_size(block_size)
    except ValueError:
        return False
    return True


@given(size=st.integers(2, 64), block_size=st.integers(1, 256))
def test_an_unfit_interleave_is_refused_with_two_fixes_that_fit(size: int, block_size: int) -> None:
    """The refusal of interleave:I on a block size it does not divide names the nearest
    block size above that fits and the largest interleave size that fits the block [CP-2]."""
    rule = CPRule("interleave", size)
    if block_size % size == 0:
        return
    with pytest.raises(ValueError) as refused:
        rule.check_block_size(block_size)
    fixes = re.search(
        r"use a block size of (\d+), or interleave:(\d+) \[CP-2\]$", str(refused.value)
    )
    assert fixes, str(refused.value)
    bigger, smaller = int(fixes[1]), int(fixes[2])
    assert _fits(rule, bigger) and bigger - size < block_size < bigger
    assert _fits(CPRule("interleave", smaller), block_size) and smaller < size
    assert not any(_fits(CPRule("interleave", i), block_size) for i in range(smaller + 1, size))


@given(text=cp_rules(), count=st.integers(1, 4))
def test_the_block_sizes_a_rule_names_are_the_smallest_it_fits(text: str, count: int) -> None:
    """What a caller draws a cache from [CP-2]: every size named fits, none smaller that
    fits is skipped, and None only where every block size fits."""
    rule = CPRule.parse(text)
    sizes = rule.block_sizes(count)
    if sizes is None:
        assert all(_fits(rule, b) for b in range(1, 4 * rule.size + 2)), rule
        return
    assert len(sizes) <= count and list(sizes) == sorted(set(sizes)), (rule, sizes)
    assert [b for b in range(1, sizes[-1] + 1) if _fits(rule, b)] == list(sizes), (rule, sizes)
    if len(sizes) < count:  # a rule tied to one block size fits no other
        assert not any(_fits(rule, b) for b in range(sizes[-1] + 1, 4 * sizes[-1] + 2)), rule


@pytest.mark.parametrize(
    "text", ["", "ring", "interleave", "interleave:0", "interleave:-1", "zigzag:2", "contiguous:x"]
)
def test_a_malformed_rule_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"\[CP-1\]"):
        CPRule.parse(text)


# -- stages, groups and DCP [STAGE-2, CP-3] --------------------------------------------------


def test_the_stage_rank_formula_is_sglangs() -> None:
    """tp_rank = (dp_rank * cp + cp_rank) * attn_tp + attn_tp_rank [STAGE-2]."""
    layout = StageLayout(12, 2, dp=2, cp=3)
    assert layout.attn_tp == 2 and layout.world_size == 24
    for rank in layout.ranks():
        where = layout.locate(rank)
        tp_rank = (where.dp_rank * 3 + where.cp_rank) * 2 + where.attn_tp_rank
        assert rank == where.pp_rank * 12 + tp_rank
    assert layout.dp_ranks(1) == (6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23)
    model = ModelShape(4, 4, 2)
    assert rank_ownership(layout, model, 9).heads == range(2, 4)  # attention-TP rank 1 of 2


def test_dcp_shares_each_heads_replicas_tokens() -> None:
    """vLLM's rule: DCP reuses TP ranks, tp > K and dcp <= tp / K [CP-3]."""
    layout = StageLayout(8, dcp=2, cp_rule="interleave:1")
    model = ModelShape(2, 4, 2)
    owners = [rank_ownership(layout, model, r, seq_len=6) for r in layout.ranks()]
    assert [o.heads.start for o in owners] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert owners[0].tokens.to_list() == [[0, 1], [2, 3], [4, 5]]
    assert owners[1].tokens.to_list() == [[1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError, match=r"dcp 4 needs every KV head held by at least 4"):
        plan_transfer(StageLayout(2), StageLayout(8, dcp=4), model, seq_len=8)
    with pytest.raises(ValueError, match=r"dcp 3 does not divide the attention-TP size 8"):
        StageLayout(8, dcp=3)


# -- attention DP: keys and ports [DP-1, PORT-1] ---------------------------------------------


def test_a_request_on_dp_group_1_is_named_by_group_1s_ranks() -> None:
    plan = DP_GROUPS.plan()
    assert {e.src for e in plan.edges} <= set(DP_GROUPS.source.dp_ranks(1))
    assert {e.dst for e in plan.edges} <= set(DP_GROUPS.target.dp_ranks(0))
    sent = {k for src in range(8) for k, _ in send_keys(plan, "r", src, from_stage=0, to_stage=1)}
    got = {k for dst in range(8) for k, _ in recv_keys(plan, "r", dst, from_stage=0, to_stage=1)}
    assert sent == got and all(int(k.split("_")[-2]) >= 4 for k in sent)


def test_ports_take_the_dp_term_under_a_dp_stride() -> None:
    layout = StageLayout(8, 2, dp=2)
    # Rank 13 is pp_rank 1, DP group 1, 2nd rank of it: 4*1 + 1 = 5 within the group.
    assert rank_port("kv", 20000, 1, layout, 13) == port("kv", 20000, 1, 13)
    scheme = PortScheme(dp_stride=4096)
    assert rank_port("kv", 20000, 1, layout, 13, scheme=scheme) == 20000 + 100 + 4096 + 5 * 16 + 1
    deployment = Deployment(20000, (DeployedStage(0, layout), DeployedStage(1, StageLayout(4))))
    assert check_deployment(deployment, scheme=scheme).ok
    assert check_deployment(deployment).ok


def test_a_cp_ranks_oracle_fill_is_its_global_tokens() -> None:
    """ORACLE-4.3: the k-th entry of a token set's fill is its k-th token."""
    model = ModelShape(2, 2, 2)
    tokens = CPRule.parse("interleave:2").tokens(1, 3, 20)
    whole = oracle_kv(model, "r", tokens=20)
    part = oracle_kv(model, "r", tokens=tokens)
    assert kv_equal(part, type(part)(whole.data[:, :, tokens.tokens()]))
    assert verify(part, model, "r", tokens=tokens).ok
    assert not verify(part, model, "r", tokens=len(tokens)).ok  # positions 0..n-1 differ


# -- defaults: the first release, unchanged ----------------------------------------------------


@given(case=transfer_cases())
def test_first_release_layouts_plan_markers_and_payloads_as_before(case: TransferCase) -> None:
    """Defaults keep the first release's plan, every edge an equal slice with no tokens,
    the layout and marker dicts with their first-release keys only."""
    plan = case.plan()
    assert plan == plan_transfer(
        case.source, case.target, case.model, policy=case.policy, seq_len=7
    )
    assert plan.seq_len is None and not plan.to_dict().keys() - {
        "source",
        "target",
        "model",
        "policy",
        "edges",
    }
    for side in (case.source, case.target):
        assert list(side.to_dict()) == ["tp", "pp", "layer_partition"]
    for edge in plan.edges:
        assert list(edge.to_dict()) == [
            "src",
            "dst",
            "heads",
            "layers",
            "offset_in_shard",
            "num_slices",
            "bytes_per_token",
        ]
    full = random_request_kv(case.model, 2)
    for src, local in enumerate(shard(full, case.source, case.model)):
        for shipment in send(plan, src, local):
            assert list(shipment.marker.to_dict()) == [
                "target_rank",
                "from_tp",
                "to_tp",
                "offset_in_shard",
                "num_slices",
                "applied",
                "side",
            ]
            assert shipment.marker == HeadSlice.from_dict(shipment.marker.to_dict())
