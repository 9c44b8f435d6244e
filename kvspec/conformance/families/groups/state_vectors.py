"""The ``states`` vectors: the state units each rank of a small hybrid holds, and the
reads that move a state group between two stages [STATE-1, STATE-2].
"""

from __future__ import annotations

import random
from typing import cast

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import hybrid_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import StateGroup
from kvspec.topology.state import part_units, plan_state_reads


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, (case, _, _) in enumerate(hybrid_cases(rng)):
        if case.model.num_layers > 8:
            continue  # the presets' states: their group plans are in the groups family
        group = 2
        state = cast(StateGroup, case.model.layer_groups[group])  # these hybrids' state
        reads = plan_state_reads(case.source, case.target, case.model, group, policy=case.policy)
        units = {
            side: [
                {
                    "rank": rank,
                    "units": {
                        k: [v.start, v.stop]
                        for k, v in part_units(
                            state, layout.attn_tp, layout.locate(rank).attn_tp_rank
                        ).items()
                    },
                }
                for rank in layout.ranks()
            ]
            for side, layout in (("source", case.source), ("target", case.target))
        }
        cases.append(
            {
                "id": f"states-{i:03d}",
                "clauses": ["STATE-1", "STATE-2"],
                **case.to_dict(),
                "group": group,
                "units": units,
                "reads": [
                    [r.src, r.dst, r.layer, r.part, r.src_offset, r.dst_offset, r.length]
                    for r in reads
                ],
            }
        )
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    group = case["group"]
    for side, layout in (("source", transfer.source), ("target", transfer.target)):
        for entry in case["units"][side]:
            held = adapter.state_units(layout, transfer.model, group, entry["rank"])
            have = {k: [v.start, v.stop] for k, v in held.items()}
            if have != entry["units"]:
                return f"{side} rank {entry['rank']} holds {have}, expected {entry['units']}"
    for dst in sorted({r[1] for r in case["reads"]}):
        want = sorted((r[0], r[2], r[4], r[5], r[6]) for r in case["reads"] if r[1] == dst)
        got = sorted(tuple(r) for r in adapter.state_reads(transfer, group, dst))
        if got != want:
            return f"receiver {dst} reads {got[:4]}..., expected {want[:4]}..."
    return None


FAMILY = Family("states", ("state-ownership", "state-reads"), export, check)
