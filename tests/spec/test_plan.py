"""PLAN-1..5: transfer plans cover exactly, are consistent both ways, and count bytes."""

from collections import Counter

import pytest
from hypothesis import example, given

from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import head_replicas, rank_ownership
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout

GQA_REPLICAS_MERGED_TWICE = TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 2, 2))
"""TP4 -> TP2 with 2 heads: two senders hold each head; a receiver must take it once."""

FAN_OUT_REPLICATED_TARGET = TransferCase(StageLayout(2), StageLayout(8), ModelShape(2, 4, 2))
"""TP2 -> TP8 with 4 heads: each receiver needs one head, a quarter of a sender's shard."""

UNEVEN_PP_BOTH_SIDES = TransferCase(
    StageLayout(2, 3), StageLayout(4, 2, (1, 6)), ModelShape(7, 4, 2), policy="balanced"
)


@given(transfer_cases())
@example(GQA_REPLICAS_MERGED_TWICE)
@example(FAN_OUT_REPLICATED_TARGET)
@example(UNEVEN_PP_BOTH_SIDES)
def test_exact_cover(case: TransferCase) -> None:
    """PLAN-2: each owned (head, layer) of a receiver arrives once, from an owner."""
    plan = case.plan()
    for dst in case.target.ranks():
        owner = rank_ownership(case.target, case.model, dst)
        delivered = Counter()
        for edge in plan.edges_to(dst):
            sender = rank_ownership(case.source, case.model, edge.src)
            assert set(edge.heads) <= set(sender.heads) and set(edge.layers) <= set(sender.layers)
            delivered.update((h, layer) for h in edge.heads for layer in edge.layers)
        owned = {(h, layer) for h in owner.heads for layer in owner.layers}
        assert set(delivered) == owned, f"target rank {dst}"
        assert set(delivered.values()) == {1}, f"target rank {dst} receives something twice"
        assert len(plan.sources_of(dst)) == len(set(plan.sources_of(dst)))


@given(transfer_cases())
@example(GQA_REPLICAS_MERGED_TWICE)
def test_inverse_consistency(case: TransferCase) -> None:
    """PLAN-3: t lists s iff s lists t; both lists ascending."""
    plan = case.plan()
    pairs_by_source = {(s, t) for s in case.source.ranks() for t in plan.targets_of(s)}
    pairs_by_target = {(s, t) for t in case.target.ranks() for s in plan.sources_of(t)}
    assert pairs_by_source == pairs_by_target
    for s in case.source.ranks():
        assert list(plan.targets_of(s)) == sorted(plan.targets_of(s))
    for t in case.target.ranks():
        assert list(plan.sources_of(t)) == sorted(plan.sources_of(t))


@given(transfer_cases())
def test_replica_choice_follows_the_named_policy(case: TransferCase) -> None:
    """PLAN-4: 'lowest' takes the lowest replica; 'balanced' the k-th consumer's k mod R."""
    plan = case.plan()
    consumers: dict[tuple[int, int], int] = Counter()
    for dst in case.target.ranks():
        for edge in plan.edges_to(dst):
            pp_rank, tp_rank = case.source.coords(edge.src)
            for head in edge.heads:
                replicas = head_replicas(case.model.num_kv_heads, case.source.tp, head)
                k = consumers[(pp_rank, head)]
                consumers[(pp_rank, head)] += 1
                expected = replicas[0] if case.policy == "lowest" else replicas[k % len(replicas)]
                assert tp_rank == expected, (edge, case.policy)
    assert case.plan() == plan  # deterministic


@given(transfer_cases())
def test_edge_bytes_and_slices(case: TransferCase) -> None:
    """PLAN-5 and SLICE-1: bytes by formula; heads are an equal slice of the sender's shard."""
    plan = case.plan()
    m = case.model
    for edge in plan.edges:
        per_token = len(edge.heads) * len(edge.layers) * m.head_dim * m.itemsize * m.kv_tensors
        assert edge.nbytes(5) == 5 * per_token
        assert edge.nbytes(5, slicing="receiver") == 5 * per_token * edge.num_slices
        shard = rank_ownership(case.source, m, edge.src).heads
        width = len(shard) // edge.num_slices
        assert len(shard) % edge.num_slices == 0
        assert edge.heads == shard[edge.offset_in_shard * width :][:width]
    assert plan.nbytes(3) == plan.minimum_nbytes(3)


def test_tp8_to_tp2_with_four_heads() -> None:
    """GQA replicated on the sender: each head is taken once, from its lowest replica."""
    plan = plan_transfer(StageLayout(8), StageLayout(2), ModelShape(32, 4, 128))
    assert [(e.src, e.dst, e.heads) for e in plan.edges] == [
        (0, 0, range(0, 1)),
        (2, 0, range(1, 2)),
        (4, 1, range(2, 3)),
        (6, 1, range(3, 4)),
    ]


def test_mla_receivers_each_read_the_latent_once() -> None:
    """HEAD-3 with PLAN-4: MLA TP4 -> TP8; 'balanced' spreads receivers over the replicas."""
    model = ModelShape.mla(4, 576)
    lowest = plan_transfer(StageLayout(4), StageLayout(8), model)
    balanced = plan_transfer(StageLayout(4), StageLayout(8), model, policy="balanced")
    assert [lowest.sources_of(t) for t in range(8)] == [(0,)] * 8
    assert [balanced.sources_of(t) for t in range(8)] == [(t % 4,) for t in range(8)]


def test_pp2_tp2_to_tp4_with_61_layers() -> None:
    """Uneven default partition on the sender: receivers get layers 0-30 and 31-60 separately."""
    plan = plan_transfer(StageLayout(2, 2), StageLayout(4), ModelShape(61, 8, 128))
    edges_to_0 = plan.edges_to(0)
    assert [(e.src, e.layers, e.heads) for e in edges_to_0] == [
        (0, range(0, 31), range(0, 2)),
        (2, range(31, 61), range(0, 2)),
    ]


@pytest.mark.parametrize("policy", ["lowest", "balanced"])
def test_edge_lookup_refuses_a_pair_without_an_edge(policy: str) -> None:
    plan = plan_transfer(StageLayout(8), StageLayout(2), ModelShape(2, 4, 2), policy=policy)
    with pytest.raises(ValueError, match=r"no edge from source rank 1 to target rank 0"):
        plan.edge(1, 0)
