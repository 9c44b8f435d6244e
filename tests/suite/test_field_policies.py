"""The field's replica rules (kvspec/topology/field_policies.py) through the reference
planner: each gives plans that satisfy PLAN-2 and PLAN-3, chooses as its engine does on
pinned deployments, and a one-bug mutant of each is told apart [PLAN-2, PLAN-3, PLAN-4]."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest

from kvspec.testing.strategies import dividing_pairs, head_counts_for
from kvspec.topology.field_policies import (
    FIELD_RULES,
    SGLANG,
    TRTLLM_MLA,
    VLLM_MOONCAKE,
    VLLM_MORIIO,
    VLLM_NIXL,
    sglang_rank_ratio,
    trtllm_mla_first_of_domain,
    vllm_mooncake_write,
    vllm_moriio_write,
    vllm_nixl_read,
)
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.plan import ReplicaChoice, ReplicaRule, plan_transfer
from kvspec.topology.stage import StageLayout

SIZES = (1, 2, 4, 8)


def deployments(mla: bool):
    for p, d in dividing_pairs(SIZES):
        for pp_s, pp_t in ((1, 1), (2, 1)):
            if mla:
                yield StageLayout(p, pp_s), StageLayout(d, pp_t), ModelShape.mla(2, 2)
                continue
            for heads in head_counts_for((p, d), max_heads=8):
                yield StageLayout(p, pp_s), StageLayout(d, pp_t), ModelShape(2, heads, 2)


def plan_violations(rule: ReplicaRule, name: str, *, mla: bool = False) -> list[str]:
    """What breaks PLAN-2 (exact cover from owners) or PLAN-3 (inverse, ascending) in the
    reference planner's plans under ``rule``, checked from ownership, not from the plan."""
    found = []
    for source, target, model in deployments(mla):
        where = f"{source.describe()} -> {target.describe()}, {model.describe()}"
        try:
            plan = plan_transfer(source, target, model, policy=name, rule=rule)
        except ValueError as error:  # the rule chose a rank that does not hold the head
            found.append(f"{where}: {error}")
            continue
        senders = stage_ownership(source, model)
        for receiver in stage_ownership(target, model):
            edges = [e for e in plan.edges if e.dst == receiver.rank]
            for head in receiver.heads:
                for layer in receiver.layers:
                    carriers = [e.src for e in edges if head in e.heads and layer in e.layers]
                    owned = [s for s in carriers if head in senders[s].heads]
                    if len(carriers) != 1 or owned != carriers:
                        found.append(
                            f"{where}: rank {receiver.rank} gets ({head}, {layer}) "
                            f"from {carriers} [PLAN-2]"
                        )
            srcs = list(plan.sources_of(receiver.rank))
            back = [s for s in source.ranks() if receiver.rank in plan.targets_of(s)]
            if srcs != sorted(set(srcs)) or srcs != back:
                found.append(
                    f"{where}: rank {receiver.rank} sources {srcs}, inverse {back} [PLAN-3]"
                )
    return found


def senders(rule: ReplicaRule, p: int, d: int, heads: int, *, mla: bool = False) -> list[list[int]]:
    model = ModelShape.mla(1, 2) if mla else ModelShape(1, heads, 2)
    plan = plan_transfer(StageLayout(p), StageLayout(d), model, policy="field", rule=rule)
    return [list(plan.sources_of(dst)) for dst in range(d)]


# What each engine's cited lines give on pinned deployments (read at the source, worked
# by hand from the formula quoted in the rule's docstring).
GOLDEN: dict[str, list[tuple[tuple[int, int, int, bool], list[list[int]]]]] = {
    SGLANG: [
        # TP4 -> TP8, 2 KV heads: decode rank r reads prefill r // 2
        ((4, 8, 2, False), [[0], [0], [1], [1], [2], [2], [3], [3]]),
        # TP8 -> TP2, 2 heads: window of 4 holds 4 replicas; the first sends in the plan
        ((8, 2, 2, False), [[0], [4]]),
        # TP4 -> TP2, 8 heads: a window of two distinct slices
        ((4, 2, 8, False), [[0, 1], [2, 3]]),
        # MLA TP8 -> TP2: target_tp_rank = target_tp_ranks[0]
        ((8, 2, 1, True), [[0], [4]]),
    ],
    VLLM_NIXL: [
        ((4, 8, 2, False), [[0], [0], [1], [1], [2], [2], [3], [3]]),
        ((8, 2, 2, False), [[0], [4]]),  # np.unique keeps the first rank of each head
        ((4, 2, 8, False), [[0, 1], [2, 3]]),
        ((2, 8, 1, True), [[0], [0], [0], [0], [1], [1], [1], [1]]),  # tp_rank * P // D
    ],
    VLLM_MOONCAKE: [
        # vllm#52516: TP8 -> TP1 with 4 heads, ranks 0, 2, 4, 6 (rank % (8 // 4) == 0) write
        ((8, 1, 4, False), [[0, 2, 4, 6]]),
        ((8, 2, 2, False), [[0], [4]]),  # both replicated: local_tp_rank % tp_ratio == 0
        ((2, 8, 4, False), [[0], [0], [0], [0], [1], [1], [1], [1]]),  # tp_rank // (D // P)
        ((8, 4, 1, True), [[0], [2], [4], [6]]),  # MLA: rank % (P // D) == 0
    ],
    VLLM_MORIIO: [
        ((8, 1, 4, False), [[0, 2, 4, 6]]),  # first_holder of each head in the group
        ((8, 2, 2, False), [[0], [4]]),
        ((2, 8, 4, False), [[0], [0], [0], [0], [1], [1], [1], [1]]),  # p * ratio + j
        ((8, 4, 1, True), [[0], [2], [4], [6]]),
    ],
    TRTLLM_MLA: [
        ((8, 2, 1, True), [[0], [4]]),  # selfTpRank % (8 / 2) == 0 sends
        ((8, 4, 1, True), [[0], [2], [4], [6]]),
        ((2, 4, 1, True), [[0], [0], [1], [1]]),  # every context rank sends its domain
        # fan-ins that do not divide: the domain [d * (P/D), (d+1) * (P/D)) with P/D an
        # integer division (6 / 4 = 1, 8 / 3 = 2), its first rank sending
        ((6, 4, 1, True), [[0], [1], [2], [3]]),
        ((8, 3, 1, True), [[0], [2], [4]]),
    ],
}


def golden_violations(rule: ReplicaRule, name: str) -> list[str]:
    found = []
    for (p, d, heads, mla), want in GOLDEN[name]:
        try:
            got = senders(rule, p, d, heads, mla=mla)
        except ValueError as error:
            got = [str(error)]
        if got != want:
            found.append(f"TP{p} -> TP{d}, {heads} heads{' MLA' * mla}: {got}, not {want}")
    return found


RULES: dict[str, tuple[ReplicaRule, bool]] = {
    SGLANG: (sglang_rank_ratio, False),
    VLLM_NIXL: (vllm_nixl_read, False),
    VLLM_MOONCAKE: (vllm_mooncake_write, False),
    VLLM_MORIIO: (vllm_moriio_write, False),
    TRTLLM_MLA: (trtllm_mla_first_of_domain, True),  # stated for MLA only
}


def _shift(c: ReplicaChoice, window: range) -> int:
    for rank in c.replicas:
        if rank in window:
            return rank
    return c.replicas[0]


def sglang_modulo(c: ReplicaChoice) -> int:
    """Mutant: ``rank % ratio`` for ``rank // ratio`` (a larger decode TP)."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size > p:
        return d % (d_size // p)
    return sglang_rank_ratio(c)


def vllm_last_per_head(c: ReplicaChoice) -> int:
    """Mutant: the fan-in keeps the last rank per head, not np.unique's first."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size < p:
        window = range(d * (p // d_size), (d + 1) * (p // d_size))
        inside = [r for r in c.replicas if r in window]
        return inside[-1] if inside else c.replicas[0]
    return vllm_nixl_read(c)


def trtllm_last_of_domain(c: ReplicaChoice) -> int:
    """Mutant: the last rank of each target's TP domain sends."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size < p:
        return (d + 1) * (p // d_size) - 1
    return trtllm_mla_first_of_domain(c)


def trtllm_domain_scaled_after(c: ReplicaChoice) -> int:
    """Mutant: the domain's first rank as ``d * P // D`` (the product divided, as vLLM's
    formula reads) for ``d * (P / D)`` (the ratio an integer first): the same on every
    pair that divides, another rank on a fan-in that does not."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size < p:
        return d * p // d_size
    return trtllm_mla_first_of_domain(c)


def mooncake_rank_zero_only(c: ReplicaChoice) -> int:
    """Mutant: vllm#52516's bug as a rule, the fan-in's first window rank writes every head
    (before the fix only ``local_tp_rank % tp_ratio == 0`` wrote)."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size < p:
        return d * (p // d_size)
    return vllm_mooncake_write(c)


def moriio_last_holder(c: ReplicaChoice) -> int:
    """Mutant: the last holder of a head in the group writes it, not ``first_holder``."""
    p, d_size, d = c.source_attn_tp, c.target_attn_tp, c.receiver_tp_rank
    if d_size < p:
        window = range(d * (p // d_size), (d + 1) * (p // d_size))
        inside = [r for r in c.replicas if r in window]
        return inside[-1] if inside else c.replicas[0]
    return vllm_moriio_write(c)


MUTANTS: dict[str, Callable[[ReplicaChoice], int]] = {
    SGLANG: sglang_modulo,
    VLLM_NIXL: vllm_last_per_head,
    VLLM_MOONCAKE: mooncake_rank_zero_only,
    VLLM_MORIIO: moriio_last_holder,
    TRTLLM_MLA: trtllm_last_of_domain,
}


def violations(rule: ReplicaRule, name: str) -> list[str]:
    _, mla_only = RULES[name]
    found = plan_violations(rule, name, mla=True) + golden_violations(rule, name)
    if not mla_only:
        found += plan_violations(rule, name)
    return found


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_field_rule_plans_exact_covers_and_chooses_as_its_engine(name):
    rule, _ = RULES[name]
    assert FIELD_RULES[name] is rule
    assert violations(rule, name) == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_one_bug_mutant_of_each_rule_is_killed(name):
    assert violations(MUTANTS[name], name)


def test_the_first_of_domain_window_is_told_apart_on_a_non_dividing_fan_in():
    """TensorRT-LLM's domain with P/D an integer division: a mutant that divides the
    product instead passes every dividing deployment and pin, and fails the
    non-dividing fan-in pins (MLA TP6 -> TP4, TP8 -> TP3) [PLAN-4]."""
    dividing = [(k, want) for k, want in GOLDEN[TRTLLM_MLA] if k[0] % k[1] == 0 or k[1] % k[0] == 0]
    mutant = trtllm_domain_scaled_after
    assert plan_violations(mutant, TRTLLM_MLA, mla=True) == []
    assert all(senders(mutant, p, d, h, mla=m) == want for (p, d, h, m), want in dividing)
    assert golden_violations(mutant, TRTLLM_MLA) == [
        "TP6 -> TP4, 1 heads MLA: [[0], [1], [3], [4]], not [[0], [1], [2], [3]]",
        "TP8 -> TP3, 1 heads MLA: [[0], [2], [5]], not [[0], [2], [4]]",
    ]


def test_the_rules_need_the_stage_sizes():
    bare = ReplicaChoice(0, range(2), 0, 0, 0, 0)
    with pytest.raises(ValueError, match="attention-TP sizes"):
        sglang_rank_ratio(bare)


def test_on_dividing_pairs_the_three_windows_agree_and_part_where_sizes_do_not():
    for p, d in dividing_pairs(SIZES):
        mla = [senders(rule, p, d, 1, mla=True) for rule, _ in RULES.values()]
        assert all(m == mla[0] for m in mla)
    # MLA TP2 -> TP3 does not divide: SGLang reads prefill rank r // (3 // 2) = r (rank 2
    # does not exist: the rule falls back on the lowest), vLLM's formula reads r * 2 // 3
    assert senders(sglang_rank_ratio, 2, 3, 1, mla=True) == [[0], [1], [0]]
    assert senders(vllm_nixl_read, 2, 3, 1, mla=True) == [[0], [0], [1]]


ENGINES = {
    SGLANG: "sglang.srt.disaggregation.common.conn",
    VLLM_NIXL: "vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not _installed(ENGINES[SGLANG]), reason="sglang is not installed")
def test_sglang_rule_is_what_sglang_resolves():  # pragma: no cover - field venv only
    from kvspec.adapters.sglang import SglangAdapter
    from kvspec.topology.case import TransferCase

    adapter = SglangAdapter()
    for source, target, model in deployments(mla=False):
        case = TransferCase(source, target, model, SGLANG)
        plan = case.plan(sglang_rank_ratio)
        for dst in target.ranks():
            real = list(adapter.sources(case, dst))
            # every replica of the window sends (replicas_write "every"): the plan's one
            # sender of each head is among them, and each real sender holds its heads
            assert set(plan.sources_of(dst)) <= set(real), (case.describe(), dst, real)
