"""The ``scaled`` vectors: block-scaled caches — vLLM's NVFP4 pages, SGLang's MXFP8 pool —
every field read out of its plane, split slot axis or side tensor [LAYOUT-8], and the
oracle's fp4 and e8m0 fill of a region [ORACLE-8].

A case's cache is its tensors' bytes (one tensor, or K, V and the side tensors); each
field is stored as its bytes in the read's shape: ``[num_blocks, block_size, heads,
width]``, or ``[num_blocks, block_size / unit, unit, heads, width]`` where the slot axis
is split. A fill case holds each field ``[layers, tokens, heads, width]`` as bytes.
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter, provided_capabilities
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.memory.cache_layout import SCALED, CacheShape, empty_cache, field_views, get_layout
from kvspec.memory.layout_model import FIELD_DTYPES
from kvspec.memory.records import record_fill
from kvspec.tensors.dtypes import bits_view
from kvspec.topology.model import ModelShape


def _shapes(layout: str) -> list[tuple[int, int, int, int]]:
    """(blocks, block_size, heads, head_dim) the layout holds: two per preset."""
    spec = get_layout(layout)
    multiple = spec.head_dim_multiple or 16
    if spec.fixed_block_size:
        return [
            (2, spec.fixed_block_size, 2, 4 * multiple),
            (1, spec.fixed_block_size, 1, 2 * multiple),
        ]
    return [(3, 8, 2, multiple), (2, 4, 3, 2 * multiple)]


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases: list[Case] = []
    tensors: Tensors = {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    i = 0
    for layout in SCALED:
        spec = get_layout(layout)
        assert spec.dtypes is not None
        dtype = spec.dtypes[0]
        for blocks, block_size, heads, head_dim in _shapes(layout):
            shape = CacheShape(2, blocks, block_size, heads, head_dim)
            cache = empty_cache(layout, shape, dtype)
            parts = cache if isinstance(cache, tuple) else (cache,)
            key = f"scaled-{i:03d}"
            i += 1
            names = []
            for j, tensor in enumerate(parts):
                raw = tensor.view(torch.uint8)
                raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
                names.append(f"{key}/cache/{j}")
                tensors[names[-1]] = raw.clone()
            page = spec.page_size(block_size)
            fields = {}
            for name, view in field_views(cache, layout, block_size=page).items():
                fields[name] = f"{key}/field/{name}"
                tensors[fields[name]] = bits_view(view.contiguous()).view(torch.uint8).clone()
            cases.append(
                {
                    "id": key,
                    "clauses": ["LAYOUT-8"],
                    "layout": layout,
                    "dtype": dtype,
                    "shape": {
                        "kv": 2,
                        "num_blocks": blocks,
                        "block_size": block_size,
                        "heads": heads,
                        "head_dim": head_dim,
                    },
                    "page_size": page,
                    "cache": names,
                    "fields": fields,
                }
            )
        model = ModelShape(2, 3, _shapes(layout)[0][3], dtype=dtype)
        region = {"tokens": [5, 14], "layers": [0, 2], "heads": [1, 3]}
        seed = rng.randrange(2**40)
        request = f"scaled-{layout}"
        fill = record_fill(
            model,
            layout,
            request,
            seed=seed,
            tokens=range(*region["tokens"]),
            layers=range(*region["layers"]),
            heads=range(*region["heads"]),
        )
        key = f"scaled-{i:03d}"
        i += 1
        stored = {}
        for name, tensor in fill.items():
            stored[name] = f"{key}/fill/{name}"
            tensors[stored[name]] = bits_view(tensor.contiguous()).view(torch.uint8).clone()
        cases.append(
            {
                "id": key,
                "clauses": ["ORACLE-6", "ORACLE-8"],
                "layout": layout,
                "model": model.to_dict(),
                "request_id": request,
                "seed": seed,
                **region,
                "fill": stored,
            }
        )
    return cases, tensors


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return bits_view(tensor.contiguous()).view(torch.uint8)


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    spec = get_layout(case["layout"])
    if "fill" in case:
        if "record-oracle" not in provided_capabilities(adapter):
            raise NotApplicable
        model = ModelShape.from_dict(case["model"])
        region = {k: range(*case[k]) for k in ("tokens", "layers", "heads")}
        got = adapter.record_fill(
            model, case["layout"], case["request_id"], seed=case["seed"], **region
        )
        if sorted(got) != sorted(case["fill"]):
            return f"filled fields {sorted(got)}, expected {sorted(case['fill'])}"
        for name, key in case["fill"].items():
            if not torch.equal(_as_bytes(got[name]), tensors[key]):
                return f"fill of field {name} differs from the vector [ORACLE-8]"
        return None
    element = FIELD_DTYPES[spec.element_dtype(case["dtype"])]
    parts = [tensors[n].clone() for n in case["cache"]]
    main = [t.view(element) for t in parts[: (2 if spec.tuple_form else 1)]]
    cache = (*main, *parts[len(main) :]) if spec.tuple_form else main[0]
    page = case["page_size"]
    got = adapter.read_fields(cache, case["layout"], **({"page_size": page} if page else {}))
    if sorted(got) != sorted(case["fields"]):
        return f"read fields {sorted(got)}, expected {sorted(case['fields'])}"
    for name, key in case["fields"].items():
        have = _as_bytes(got[name])
        if tuple(have.shape) != tuple(tensors[key].shape) or not torch.equal(have, tensors[key]):
            return f"field {name} differs from the vector [LAYOUT-8]"
    return None


FAMILY = Family("scaled", ("fields",), export, check)
