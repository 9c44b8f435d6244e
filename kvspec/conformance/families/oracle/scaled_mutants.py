"""Mutants of the oracle's fp4 values in block-scaled cells [ORACLE-8].

Each re-reads the rule text with one slip a field engineer makes: fp4 values that may
be zero, fp4 nibbles in the wrong order, fp4 K and V hashed like any other field.
"""

from __future__ import annotations

from typing import Any

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import get_layout
from kvspec.memory.layout_model import FIELD_DTYPES
from kvspec.memory.records import FIELD_TAG, ORACLE_FIELDS
from kvspec.tensors.oracle import PRIME, absorb, mix, oracle_hashes, request_value
from kvspec.tensors.scaled_oracle import FOUR_BIT, pack_fp4, scaled_values


def _region(region: dict[str, Any]) -> dict[str, Any]:
    return {k: region[k] for k in ("tokens", "layers", "heads", "seed") if k in region}


class _Fp4Fill(ReferenceAdapter):
    """The reference's fill and refusals, then each fp4 field remade by :meth:`remake`."""

    def remake(self, model, layout, request_id, name, field, region) -> torch.Tensor:
        raise NotImplementedError

    def record_fill(self, model, layout, request_id, **region):
        fields = super().record_fill(model, layout, request_id, **region)
        for f in get_layout(layout).fields(model.kv_tensors):
            if f.resolve(model.dtype, model.head_dim)[0] == FOUR_BIT:
                fields[f.name] = self.remake(
                    model, layout, request_id, f.name, fields[f.name], _region(region)
                ).to(fields[f.name].device)
        return fields


@mutant("ORACLE-8.1")
class Fp4ZeroKept(_Fp4Fill):
    """Takes an fp4 value's bits as h & 15 and stops there: one value in eight is +0 or -0."""

    def remake(self, model, layout, request_id, name, field, region):
        if name not in ORACLE_FIELDS:
            return field
        hashes = oracle_hashes(model, request_id, **region)[:, ORACLE_FIELDS[name]]
        return pack_fp4((hashes & 15).to(torch.uint8))


@mutant("ORACLE-8.2")
class Fp4NibblesSwapped(_Fp4Fill):
    """Packs fp4 value 2i into a byte's high nibble and 2i + 1 into its low one."""

    def remake(self, model, layout, request_id, name, field, region):
        return (field >> 4) | ((field & 15) << 4)


@mutant("ORACLE-8.3")
class Fp4KeyValueHashedByName(_Fp4Fill):
    """Hashes an fp4 k or v like any other field, by its name, not as ORACLE-1's K or V."""

    def remake(self, model, layout, request_id, name, field, region):
        if name not in ORACLE_FIELDS:
            return field
        start = absorb(mix(region.get("seed", 0) % PRIME), request_value(request_id))
        h = torch.full((1, 1, 1, 1), absorb(start, request_value(FIELD_TAG + name)))
        for r, dim in (
            (region.get("layers") or range(model.num_layers), 0),
            (region.get("heads") or range(model.num_kv_heads), 2),
            (
                region["tokens"]
                if not isinstance(region["tokens"], int)
                else range(region["tokens"]),
                1,
            ),
            (range(2 * field.shape[-1]), 3),
        ):
            shape = [1, 1, 1, 1]
            shape[dim] = len(r)
            h = absorb(h, torch.tensor(list(r), dtype=torch.int64).view(shape))
        values = h.expand(*field.shape[:-1], 2 * field.shape[-1]).contiguous()
        return scaled_values(values, FOUR_BIT).view(FIELD_DTYPES[FOUR_BIT])
