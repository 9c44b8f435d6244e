"""Mutants of record rows [LAYOUT-7].

Each re-derives the rows from the clause text with one slip a field engineer makes:
rows with each scale before its values, rows read back from the wrong end, K and V of
a plain layout made into rows.
"""

from __future__ import annotations

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.cache_layout import get_layout
from kvspec.memory.records import (
    split_rows,
)


def _scale_first_rows(model, layout) -> list[list]:
    """Each K/V row's fields (split at v, as LAYOUT-7 says) with the scale moved first:
    ``[K scale | K]``, ``[V scale | V]``, FlashMLA's ``[scales | NoPE | RoPE]``."""
    fields = get_layout(layout).fields(model.kv_tensors)
    names = [f.name for f in fields]
    at = names.index("v") if "v" in names else len(fields)
    rows = [fields[:at], fields[at:]] if at < len(fields) else [fields]
    return [sorted(row, key=lambda f: not f.is_scale) for row in rows]


@mutant("LAYOUT-7.1")
class ScaleBeforeItsValues(ReferenceAdapter):
    """Lays each row out as [scale | values], reading vLLM's record from the wrong end."""

    def record_rows(self, fields, model, layout):
        want = super().record_rows(fields, model, layout)  # the same refusals
        rows = [
            torch.cat([fields[f.name].contiguous().view(torch.uint8) for f in row], -1)
            for row in _scale_first_rows(model, layout)
        ]
        return torch.stack(rows, 1).view(want.dtype)


@mutant("LAYOUT-7.2")
class RowsReadScaleFirst(ReferenceAdapter):
    """Makes rows right, then reads the fields back as if each scale came first."""

    def record_fields(self, rows, model, layout):
        super().record_fields(rows, model, layout)  # the same refusals
        return split_rows(rows, _scale_first_rows(model, layout), model)


@mutant("LAYOUT-7.3")
class RowsOfPlainLayouts(ReferenceAdapter):
    """Makes K and V of a plain layout into rows too, where they travel as themselves."""

    def record_rows(self, fields, model, layout):
        if get_layout(layout).plain:
            return torch.stack([fields[n] for n in ("k", "v", "latent") if n in fields], 1)
        return super().record_rows(fields, model, layout)
