"""The ``records`` vectors: caches whose records hold inline scales, and every field read
out of them [LAYOUT-5, LAYOUT-6].
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.memory.cache_layout import RECORDS, CacheShape, empty_cache, field_views, get_layout
from kvspec.tensors.dtypes import bits_view, torch_dtype


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = [(2, 3, 2, 4), (3, 2, 3, 8), (1, 4, 1, 4)]
    for i, (layout, (blocks, block_size, heads, dim)) in enumerate(
        (name, shape) for name in RECORDS for shape in shapes
    ):
        spec = get_layout(layout)
        kv = spec.tensors()
        shape = CacheShape(
            kv, blocks, block_size, 1 if kv == 1 else heads, spec.fixed_head_dim or dim
        )
        assert spec.dtypes is not None
        cache = empty_cache(layout, shape, spec.dtypes[0])
        assert isinstance(cache, torch.Tensor)
        raw = cache.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
        key = f"records-{i:03d}"
        tensors[f"{key}/cache"] = raw.clone()
        fields = {}
        for name, view in field_views(cache, layout).items():
            fields[name] = f"{key}/field/{name}"
            tensors[fields[name]] = bits_view(view.contiguous()).clone()
        cases.append(
            {
                "id": key,
                "clauses": ["LAYOUT-5", "LAYOUT-6"],
                "layout": layout,
                "dtype": spec.dtypes[0],
                "shape": {
                    "kv": kv,
                    "num_blocks": blocks,
                    "block_size": block_size,
                    "heads": shape.heads,
                    "head_dim": shape.head_dim,
                },
                "cache": f"{key}/cache",
                "fields": fields,
            }
        )
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    spec = get_layout(case["layout"])
    element = torch_dtype(case["dtype"]) if spec.element is None else torch.uint8
    cache = tensors[case["cache"]].clone().view(element)
    got = adapter.read_fields(cache, case["layout"])
    if sorted(got) != sorted(case["fields"]):
        return f"read fields {sorted(got)}, expected {sorted(case['fields'])}"
    for name, key in case["fields"].items():
        if not torch.equal(bits_view(got[name].contiguous()), tensors[key]):
            return f"field {name} differs from the vector"
    return None


FAMILY = Family("records", ("fields",), export, check)
