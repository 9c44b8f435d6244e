"""The ``plan`` vectors: a transfer plan's edges, the source ranks each target rank
takes KV from [PLAN-1, PLAN-2, PLAN-3, PLAN-4, PLAN-5, PLAN-6, SLICE-1, DP-1].
"""

from __future__ import annotations

import random

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import PARALLEL, PINNED, sample_cases, sample_parallel
from kvspec.topology.case import TransferCase


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, case in enumerate([*PINNED, *sample_cases(rng, 40)]):
        plan = case.plan()
        cases.append(
            {
                "id": f"plan-{i:03d}",
                "clauses": ["PLAN-2", "PLAN-3", "PLAN-4", "PLAN-5", "SLICE-1"],
                **case.to_dict(),
                "edges": [e.to_dict() for e in plan.edges],
            }
        )
    more = random.Random(f"{rng.random()}:parallel")
    for i, case in enumerate([*PARALLEL, *sample_parallel(more, 20)], len(cases)):
        cases.append(
            {
                "id": f"plan-{i:03d}",
                "clauses": ["PLAN-1", "PLAN-2", "PLAN-3", "PLAN-4", "PLAN-5", "PLAN-6", "DP-1"],
                **case.to_dict(),
                "edges": [e.to_dict() for e in case.plan().edges],
            }
        )
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    if not adapter.domain.holds(transfer) or not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    for dst in transfer.target.ranks():
        expected = sorted(e["src"] for e in case["edges"] if e["dst"] == dst)
        got = list(adapter.sources(transfer, dst))
        if got != expected:
            return f"target rank {dst} takes KV from {got}, expected {expected}"
    return None


FAMILY = Family("plan", ("routing",), export, check)
