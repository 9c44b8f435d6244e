"""Mutants of a hybrid's replica choice under an engine's declared rule [PLAN-4, GROUP-3,
STATE-2].

Written from the rule text, not the checks: PLAN-4 says a declared (field) policy picks
the sender of a replicated head "and routing follows it", and STATE-2 that "the sender of
a replicated unit is chosen by the plan's policy". An engine whose connector takes its own
rule on the one-group path, and whose hybrid path (layer groups, Mamba and GDN states)
was written beside it and still asks kvspec's default, sends the same bytes from another
replica: every element arrives, but from a sender the engine's plan never names; or only
its state reads were (the byte counts follow the rule, the reads of a replicated state
part do not). The mutants declare SGLang's rule (kvspec/topology/field_policies.py
``sglang_rank_ratio``); tests/suite/test_field_rules_through_families.py declares each
field rule in turn.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import SGLANG, sglang_rank_ratio


@mutant("PLAN-4.5", "GROUP-3.1", "GROUP-3.2")
class HybridPlannerChoosesLowest(ReferenceAdapter):
    """Declares the engine's replica rule and routes a uniform model by it, but plans a
    hybrid's layer groups, windows and state reads under kvspec's ``lowest``: the rule
    reached the one-group path only."""

    policies = (SGLANG,)
    policy_rules = MappingProxyType({SGLANG: sglang_rank_ratio})

    def group_bytes(
        self, case: TransferCase, seq_len: int, block_size: int
    ) -> dict[tuple[int, int, int], int]:
        return super().group_bytes(replace(case, policy="lowest"), seq_len, block_size)

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> dict[tuple[int, int, int], list[tuple[int, int]]]:
        lowest = replace(case, policy="lowest")
        return super().window_tokens(lowest, seq_len, source_block_size, target_block_size)

    def state_reads(
        self, case: TransferCase, group: int, dst: int
    ) -> list[tuple[int, int, int, int, int]]:
        return super().state_reads(replace(case, policy="lowest"), group, dst)


@mutant("STATE-2.3")
class ReplicatedStateFromLowestHolder(ReferenceAdapter):
    """Declares the engine's replica rule and plans every byte count under it, but its
    state reads take a replicated unit (Mamba-2's B and C with fewer groups than ranks)
    from the lowest rank holding it: the bytes are the same, the sender is not the one
    the rule picks."""

    policies = (SGLANG,)
    policy_rules = MappingProxyType({SGLANG: sglang_rank_ratio})

    def state_reads(
        self, case: TransferCase, group: int, dst: int
    ) -> list[tuple[int, int, int, int, int]]:
        return super().state_reads(replace(case, policy="lowest"), group, dst)
