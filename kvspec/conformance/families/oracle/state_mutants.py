"""Mutants of the state oracle [ORACLE-7]: each unit of a rank's state hashed under its
index on the rank instead of its global unit.
"""

from __future__ import annotations

from typing import Any, cast

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.state_oracle import oracle_state
from kvspec.topology.groups import StateGroup
from kvspec.topology.model import ModelShape
from kvspec.topology.state import part_units


@mutant("ORACLE-7.1")
class StateOracleHashesLocalUnits(ReferenceAdapter):
    """Hashes each unit under its index on the rank (0, 1, ...) instead of its global unit:
    right at TP1 and on rank 0, wrong on every other rank of a split part."""

    def state_oracle(self, model: ModelShape, group: int, request_id: str, **kw: Any) -> dict:
        state = cast(StateGroup, model.layer_groups[group])  # state_oracle: of a state
        held = part_units(state, kw["attn_tp"], kw["attn_tp_rank"])
        whole = oracle_state(
            model,
            group,
            request_id,
            layers=kw["layers"],
            attn_tp=1,
            attn_tp_rank=0,
            seed=kw["seed"],
        )
        return {name: values[:, : len(held[name])] for name, values in whole.items()}
