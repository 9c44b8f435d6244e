"""Mutants of routing: who sends to whom, and which replica [PLAN-2..4, HEAD-3]."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import MappingProxyType

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.strategies import TransferCase
from kvspec.topology.ownership import head_replicas, layer_ranges, rank_ownership
from kvspec.topology.plan import POLICIES, ReplicaChoice, edge_between


def _overlapping(case: TransferCase, dst: int) -> list[int]:
    """Every source rank that shares a head and a layer with receiver ``dst``."""
    receiver = rank_ownership(case.target, case.model, dst)
    found = []
    for src in case.source.ranks():
        try:
            edge_between(rank_ownership(case.source, case.model, src), receiver, case.model)
        except ValueError:
            continue
        found.append(src)
    return found


@mutant("PLAN-2.1")
class ForgetsOtherPipelineStages(ReferenceAdapter):
    """Takes a receiver's heads only from the source pipeline stage holding its first layer."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        first = rank_ownership(case.target, case.model, dst).layers.start
        stage = next(
            p for p, r in enumerate(layer_ranges(case.source, case.model.num_layers)) if first in r
        )
        return [s for s in super().sources(case, dst) if case.source.coords(s)[0] == stage]

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        return [t for t in case.target.ranks() if src in self.sources(case, t)]


@mutant("PLAN-2.2", "HEAD-3.2")
class ReplicasMergedTwice(ReferenceAdapter):
    """Takes a replicated head from every replica (the classic GQA bug)."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return _overlapping(case, dst)

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        return [t for t in case.target.ranks() if src in _overlapping(case, t)]


@mutant("PLAN-2.3")
class WrongReplicaGroup(ReferenceAdapter):
    """Picks the replica of the next head: ``tp_rank + tp/H`` instead of ``tp_rank``."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        heads, tp = case.model.num_kv_heads, case.source.tp
        if heads >= tp:
            return super().sources(case, dst)
        shifted = []
        for src in super().sources(case, dst):
            pp_rank, tp_rank = case.source.coords(src)
            shifted.append(case.source.rank(pp_rank, (tp_rank + tp // heads) % tp))
        return sorted(shifted)


@mutant("PLAN-2.4")
class SourcePerHead(ReferenceAdapter):
    """Lists the sender of every head it needs, so a sender of two heads appears twice."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        plan = self.plan(case)
        found = []
        for edge in plan.edges_to(dst):
            found.extend([edge.src] * len(edge.heads))
        return found


@mutant("PLAN-3.1")
class TargetsOmitLast(ReferenceAdapter):
    """A sender with several targets forgets the last one."""

    def targets(self, case, src):
        found = list(super().targets(case, src))
        return found[:-1] if len(found) > 1 else found


@mutant("PLAN-3.2")
class SourcesInHeadMajorOrder(ReferenceAdapter):
    """Lists sources head by head, then pipeline stage by stage: not ascending with PP."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        chosen = set(super().sources(case, dst))
        tp_ranks = sorted({case.source.coords(s)[1] for s in chosen})
        order = itertools.product(tp_ranks, range(case.source.pp))
        return [case.source.rank(p, t) for t, p in order if case.source.rank(p, t) in chosen]


def _pick(case: TransferCase, dst: int, pick: Callable[[range, int], int]) -> list[int]:
    """Sources of ``dst`` where each replicated head's sender is ``pick(replicas, dst)``."""
    lowest = replace(case, policy="lowest")
    chosen = set()
    for src in ReferenceAdapter().sources(lowest, dst):
        pp_rank = case.source.coords(src)[0]
        heads = rank_ownership(case.source, case.model, src).heads
        replicas = head_replicas(case.model.num_kv_heads, case.source.tp, heads[0])
        if len(replicas) > 1:
            chosen.add(case.source.rank(pp_rank, pick(replicas, dst)))
        else:
            chosen.add(src)
    return sorted(chosen)


@mutant("PLAN-4.1")
class LowestPicksByReceiver(ReferenceAdapter):
    """Under 'lowest', spreads replicas by receiver rank (``replicas[dst % R]``)."""

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        if case.policy != "lowest":
            return super().sources(case, dst)
        return _pick(case, dst, lambda replicas, d: replicas[d % len(replicas)])

    def targets(self, case, src):
        return [t for t in case.target.ranks() if src in self.sources(case, t)]


@mutant("PLAN-4.2")
class BalancedWithoutModulo(ReferenceAdapter):
    """'balanced' clamps the consumer index instead of wrapping it."""

    def sources(self, case, dst):
        if case.policy != "balanced" or case.model.num_kv_heads >= case.source.tp:
            return super().sources(case, dst)
        lowest = replace(case, policy="lowest")
        reference = ReferenceAdapter()
        chosen = []
        for src in reference.sources(lowest, dst):
            pp_rank = case.source.coords(src)[0]
            head = rank_ownership(case.source, case.model, src).heads[0]
            replicas = head_replicas(case.model.num_kv_heads, case.source.tp, head)
            consumers = [t for t in case.target.ranks() if src in reference.sources(lowest, t)]
            k = consumers.index(dst)
            chosen.append(case.source.rank(pp_rank, replicas[min(k, len(replicas) - 1)]))
        return sorted(chosen)


@mutant("PLAN-4.2")
class BalancedCountsWholeStage(ReferenceAdapter):
    """'balanced' numbers a head's receivers across the whole target stage, not only those
    needing it from one source pipeline stage."""

    def sources(self, case, dst):
        if case.policy != "balanced":
            return super().sources(case, dst)
        receiver = rank_ownership(case.target, case.model, dst)
        lowest = replace(case, policy="lowest")
        chosen = []
        for src in super().sources(lowest, dst):
            pp_rank = case.source.coords(src)[0]
            head = rank_ownership(case.source, case.model, src).heads[0]
            if (
                head not in receiver.heads
                or len(rank_ownership(case.source, case.model, src).heads) > 1
            ):
                chosen.append(src)
                continue
            replicas = head_replicas(case.model.num_kv_heads, case.source.tp, head)
            consumers = [
                t
                for t in case.target.ranks()
                if head in rank_ownership(case.target, case.model, t).heads
            ]
            k = consumers.index(dst)
            chosen.append(case.source.rank(pp_rank, replicas[k % len(replicas)]))
        return sorted(set(chosen))

    def targets(self, case, src):
        return [t for t in case.target.ranks() if src in self.sources(case, t)]


@mutant("PLAN-4.3")
class StatefulBalancing(ReferenceAdapter):
    """'balanced' hands out replicas from a counter that lives across calls."""

    def __init__(self) -> None:
        self._turn = 0

    def sources(self, case, dst):
        if case.policy != "balanced":
            return super().sources(case, dst)

        def pick(replicas: range, d: int) -> int:
            self._turn += 1
            return replicas[self._turn % len(replicas)]

        return _pick(case, dst, pick)


@mutant("PLAN-4.4")
class UnknownPolicyReadAsLowest(ReferenceAdapter):
    """``if policy == "balanced": ... else: lowest`` — any other name is read as 'lowest'."""

    def plan(self, case: TransferCase):
        if case.policy not in POLICIES and case.policy not in self.policy_rules:
            case = replace(case, policy="lowest")
        return super().plan(case)


def _by_receiver(choice: ReplicaChoice) -> int:
    """The field's ``dst // ratio``-style rule: spread replicas by the receiver's TP rank."""
    return choice.replicas[choice.receiver_tp_rank % len(choice.replicas)]


@mutant("PLAN-4.5")
class DeclaredRuleNotFollowed(ReferenceAdapter):
    """Declares a field policy by the receiver's TP rank, but routes by its stage rank."""

    policies = (*POLICIES, "by_receiver")
    policy_rules = MappingProxyType({"by_receiver": _by_receiver})

    def sources(self, case, dst):
        if case.policy != "by_receiver":
            return super().sources(case, dst)
        return _pick(case, dst, lambda replicas, d: replicas[d % len(replicas)])

    def targets(self, case, src):
        return [t for t in case.target.ranks() if src in self.sources(case, t)]
