"""The ``layouts`` vectors: one layer's cache in every layout, its K/V views read back,
and what detection answers from its shape [LAYOUT-1, LAYOUT-2, LAYOUT-4].

:func:`layer_tensors` and :func:`load_layer` write and read back a layer cache (one
tensor or a tuple); the paged family stores its layers the same way.
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter, provided_capabilities
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import layer_tensors, load_layer, vector_layouts
from kvspec.memory.cache_layout import LAYOUTS, CacheShape, detect_layout, empty_cache, kv_views
from kvspec.tensors.dtypes import bits_view


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = [(2, 2, 4, 2, 3), (2, 3, 2, 2, 3), (2, 5, 3, 1, 2), (1, 3, 2, 1, 4), (2, 4, 1, 3, 2)]
    i = 0
    for group, (kv, blocks, block_size, heads, dim) in (
        (group, shape) for group in vector_layouts() for shape in shapes
    ):
        for name in group:
            spec = LAYOUTS[name]
            if spec.kv_tensors not in (None, kv):
                continue
            shape = CacheShape(kv, blocks, block_size if spec.paged else 1, heads, dim)
            cache = empty_cache(name, shape, "bfloat16")
            page = spec.page_size(shape.block_size)  # not in a pool's shape
            for view in kv_views(cache, name, block_size=page):
                bits = bits_view(view)
                bits.copy_(
                    torch.randint(
                        -(2**15), 2**15 - 1, bits.shape, generator=generator, dtype=torch.int16
                    )
                )
            key = f"layouts-{i:03d}"
            i += 1
            layer, names = layer_tensors(key, cache)
            tensors.update(layer)
            views = kv_views(cache, name, block_size=page)
            read = [f"{key}/read/{k}" for k in range(len(views))]
            tensors.update(dict(zip(read, (v.contiguous() for v in views), strict=True)))
            known = {"heads": heads, "head_dim": dim}
            try:
                detected: str | None = detect_layout(cache, **known)
            except ValueError:
                detected = None
            cases.append(
                {
                    "id": key,
                    "clauses": ["LAYOUT-1", "LAYOUT-2", "LAYOUT-4"],
                    "layout": name,
                    "shape": {
                        "kv": kv,
                        "num_blocks": blocks,
                        "block_size": shape.block_size,
                        "heads": heads,
                        "head_dim": dim,
                    },
                    "cache": names,
                    "page_size": page,
                    "read": read,
                    "detect": {"known": known, "answer": detected},
                }
            )
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    cache = load_layer(tensors, case["cache"])
    provided = provided_capabilities(adapter)
    if "layouts" in provided:
        page = case.get("page_size")
        got = adapter.read_layer(cache, case["layout"], **({"page_size": page} if page else {}))
        for k, name in enumerate(case["read"]):
            if k >= len(got) or not torch.equal(
                bits_view(got[k].contiguous()), bits_view(tensors[name])
            ):
                return f"reading it as {case['layout']} gives a different tensor {k}"
    if "detection" in provided:
        try:
            answer: str | None = adapter.detect_layout(cache, **case["detect"]["known"])
        except Exception:
            answer = None
        if answer != case["detect"]["answer"]:
            return (
                f"detection said {answer!r}, expected {case['detect']['answer']!r} (null = refuse)"
            )
    return None


FAMILY = Family("layouts", ("layouts",), export, check)
