"""Mutants of the record oracle and its verifier [ORACLE-6].

Each re-derives a field's fill from the clause text with one slip a field engineer
makes: K and V hashed as fields of their own, the field's name left out of the hash,
scales given the hash's sign, a verifier that looks at the data and not the scales, a
fill that never asks whether the layout can hold the model.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import get_layout
from kvspec.memory.records import FIELD_TAG, ORACLE_FIELDS, record_fill, verify_fields
from kvspec.tensors.dtypes import raw_bits
from kvspec.tensors.oracle import _values, absorb, mix, request_value


def _axis(r: range, dim: int) -> torch.Tensor:
    shape = [1, 1, 1, 1]
    shape[dim] = len(r)
    return torch.arange(r.start, r.stop, dtype=torch.int64).view(shape)


def _hand_field(
    name: str,
    dtype: str,
    width: int,
    request_id: str,
    *,
    tokens: range,
    layers: range,
    heads: range,
    seed: int,
    positive: bool,
    with_name: bool = True,
) -> torch.Tensor:
    """A non-ORACLE-1 field as ORACLE-6 states it, the slips as parameters."""
    start = absorb(mix(seed % 2_147_483_647), request_value(request_id))
    if with_name:
        start = absorb(start, request_value(FIELD_TAG + name))
    h = torch.full((1, 1, 1, 1), start, dtype=torch.int64)
    for r, dim in ((layers, 0), (heads, 2), (tokens, 1), (range(width), 3)):
        h = absorb(h, _axis(r, dim))
    shape = (len(layers), len(tokens), len(heads), width)
    return _values(h.expand(shape).contiguous(), dtype, positive=positive)


class _HandWrittenRecords(ReferenceAdapter):
    """The reference's refusals, then each field rebuilt by :func:`_hand_field`."""

    hash_oracle_fields = False
    with_name = True
    signed_scales = False

    def record_fill(self, model, layout, request_id, **region):
        fields = super().record_fill(model, layout, request_id, **region)  # refuses
        out = {}
        for f in get_layout(layout).fields(model.kv_tensors):
            if f.name in ORACLE_FIELDS and not self.hash_oracle_fields:
                out[f.name] = fields[f.name]
                continue
            dtype, width = f.resolve(model.dtype, model.head_dim)
            out[f.name] = _hand_field(
                f.name,
                dtype,
                width,
                request_id,
                **region,
                positive=f.is_scale and not self.signed_scales,
                with_name=self.with_name,
            ).to(fields[f.name].device)
        return out


@mutant("ORACLE-6.1")
class KeyFieldsHashedByName(_HandWrittenRecords):
    """Hashes a record's k and v like any other field (by name), not as ORACLE-1's K and V."""

    hash_oracle_fields = True


@mutant("ORACLE-6.2")
class FieldNameNotAbsorbed(_HandWrittenRecords):
    """Leaves the field's name out of its hash: k_scale and v_scale of a cell are equal."""

    with_name = False


@mutant("ORACLE-6.3")
class SignedInlineScales(_HandWrittenRecords):
    """Builds inline scales with the hash's sign bit, as other values are: half are negative."""

    signed_scales = True


@mutant("ORACLE-6.4")
class RecordVerifierSkipsScales(ReferenceAdapter):
    """Verifies K, V and other values of a record, and never looks at its inline scales."""

    def record_verify(self, fields, model, layout, request_id, **region):
        verify_fields(fields, model, layout, request_id, **region)  # the same refusals
        want = record_fill(model, layout, request_id, **region)
        return sum(
            int((raw_bits(fields[name].to(w.device)) != raw_bits(w)).sum())
            for name, w in want.items()
            if not name.endswith("scale")
        )


@mutant("ORACLE-6.5")
class FillsAnyModel(ReferenceAdapter):
    """Takes the record's fields from the layout but never asks whether its dtype and fixed
    width hold the model: a bfloat16 model gets a per-token-head record."""

    def record_fill(self, model, layout, request_id, **region):
        loose = replace(get_layout(layout), dtypes=None, fixed_head_dim=None)
        return record_fill(model, loose, request_id, **region)
