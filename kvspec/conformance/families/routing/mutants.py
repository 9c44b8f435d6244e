"""Mutants of routing: who sends to whom, and which replica [PLAN-2..4, HEAD-3], and what
an edge moves [PLAN-5, PLAN-6]."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.naming.keys import recv_keys, send_keys
from kvspec.tensors.kv import RequestKV
from kvspec.topology.case import TransferCase
from kvspec.topology.ownership import head_replicas, layer_ranges, rank_ownership
from kvspec.topology.plan import POLICIES, ReplicaChoice, TransferPlan, edge_between
from kvspec.topology.stage import StageLayout


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


@mutant("PLAN-6.3")
class PlanCachedPerTopology(ReferenceAdapter):
    """Caches the plan per (layouts, model, policy), so the second request of the same
    layouts reuses the first one's token sets, whatever its length."""

    def __init__(self) -> None:
        self._plans: dict[Any, TransferPlan] = {}

    def plan(self, case: TransferCase) -> TransferPlan:
        key = (case.source, case.target, case.model, case.policy, case.source_dp, case.target_dp)
        if key not in self._plans:
            self._plans[key] = super().plan(case)
        return self._plans[key]


@mutant("DP-1.1")
class RouterChoiceIgnored(ReferenceAdapter):
    """Plans every request between DP group 0 of each stage, whatever DP ranks the router
    chose."""

    def plan(self, case: TransferCase) -> TransferPlan:
        return super().plan(replace(case, source_dp=0, target_dp=0))


def _group_local(layout: StageLayout, rank: int) -> int:
    """A rank's index within its attention-DP group."""
    if layout.dp == 1:
        return rank
    width = layout.tp // layout.dp
    where = layout.locate(rank)
    return where.pp_rank * width + where.tp_rank % width


@mutant("DP-1.2")
class GroupLocalKeyRanks(ReferenceAdapter):
    """Names the ranks of a key by their index within the DP group, so the key of DP group
    1's rank 0 is DP group 0's rank 0's."""

    def _local(self, case: TransferCase, keys: Sequence[tuple[str, int]]) -> list:
        if case.source.dp == 1 and case.target.dp == 1:
            return list(keys)
        out = []
        for key, other in keys:
            request, stage, chunk, src, dst = key.rsplit("_", 4)
            src = str(_group_local(case.source, int(src)))
            dst = str(_group_local(case.target, int(dst)))
            out.append(("_".join((request, stage, chunk, src, dst)), other))
        return out

    def send_keys(self, case: TransferCase, request_id: str, src: int, **stages: Any):
        return self._local(case, send_keys(self.plan(case), request_id, src, **stages))

    def recv_keys(self, case: TransferCase, request_id: str, dst: int, **stages: Any):
        return self._local(case, recv_keys(self.plan(case), request_id, dst, **stages))


@mutant("PLAN-6.1", "SLICE-1.3")
class EqualSliceArithmetic(ReferenceAdapter):
    """Cuts every edge as an equal slice (offset = head_offset // heads), the first
    release's arithmetic, which TP4 -> TP6 breaks: heads 1..2 of a 3-head shard become 0..1."""

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        out = super().sender_transform(case, src, shard, slicing)
        if slicing != "sender":
            return out
        whole = super().sender_transform(case, src, shard, "receiver")
        plan = self.plan(case)
        for dst in out:
            edge = plan.edge(src, dst)
            if edge.offset_in_shard is None:
                width = len(edge.heads)
                offset = min(edge.head_offset // width, edge.shard_heads // width - 1)
                out[dst] = whole[dst].head_slice(offset * width, (offset + 1) * width)
        return out


@mutant("PLAN-6.2")
class WholeTokenShardOnEveryEdge(ReferenceAdapter):
    """Sends its whole token shard on every edge, leaving the receiver to pick its tokens."""

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        out = super().sender_transform(case, src, shard, slicing)
        owner = case.owner("source", src)
        if owner.tokens is None and not case.sharded:
            return out
        plan = self.plan(case)
        for dst in list(out):
            edge = plan.edge(src, dst)
            first = edge.layers.start - owner.layers.start
            kv = shard.layer_slice(first, first + len(edge.layers))
            if slicing == "sender":
                start = edge.head_offset
                kv = kv.head_slice(start, start + len(edge.heads))
            out[dst] = kv
        return out


@mutant("PLAN-5.1")
class PadsToWholeBlocks(ReferenceAdapter):
    """Sends whole blocks of 4 tokens: the last block's unused slots travel too (zeros)."""

    def sender_transform(self, case, src, shard, slicing):
        out = super().sender_transform(case, src, shard, slicing)
        padded = {}
        for dst, kv in out.items():
            extra = -kv.seq_len % 4
            pad = kv.data.new_zeros((*kv.data.shape[:2], extra, *kv.data.shape[3:]))
            padded[dst] = RequestKV(torch.cat([kv.data, pad], dim=2), kv.scales)
        return padded

    def receiver_combine(self, case, dst, shipments):
        seq = min(s.kv.seq_len for s in shipments)
        longest = max(s.kv.seq_len for s in shipments)
        if seq != longest:
            trimmed = [
                replace(s, kv=RequestKV(s.kv.data[:, :, :seq], s.kv.scales)) for s in shipments
            ]
            return super().receiver_combine(case, dst, trimmed)
        return super().receiver_combine(case, dst, shipments)


@mutant("PLAN-5.2")
class ReceiverModeSendsTheSlice(ReferenceAdapter):
    """Under receiver-side slicing, still sends only the edge's slice (marked unapplied)."""

    def sender_transform(self, case, src, shard, slicing):
        return super().sender_transform(case, src, shard, "sender")
