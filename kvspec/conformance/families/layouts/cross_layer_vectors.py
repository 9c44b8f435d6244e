"""The ``cross-layer`` vectors: one tensor that holds every layer, in each cross-layer
preset, and its K and V read back layer by layer [LAYOUT-5].

Each case is one random cache of a plain cross-layer preset (vLLM's BLHNC, BLNHC and
BHLNC tensors, TensorRT-LLM's pool, SGLang's HiCache host pools and its page-major
unified pool); ``read`` is K and V, each ``[layers, num_blocks, block_size, heads,
head_dim]``, layer ``i`` being index ``i`` of the layers axis read as the preset's
``per_layer`` layout (LAYOUT-5.2). A token pool's case carries its ``page_size``, which
its shape does not say (LAYOUT-5.3); a preset added later gets its cases after the
older ones, which keep their bytes.
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import layer_tensors, load_layer
from kvspec.memory.cache_layout import CROSS_LAYER, CacheShape, empty_cache, kv_views
from kvspec.tensors.dtypes import bits_view

SHAPES = ((2, 3, 2, 2, 3), (3, 2, 3, 1, 2))
"""(layers, num_blocks, block_size, heads, head_dim) of each preset's cases."""


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases: list[Case] = []
    tensors: Tensors = {}
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    for name, spec in CROSS_LAYER.items():
        for layers, blocks, block_size, heads, dim in SHAPES:
            shape = CacheShape(2, blocks, block_size, heads, dim, layers)
            cache = empty_cache(name, shape, "bfloat16")
            assert isinstance(cache, torch.Tensor)  # a cross-layer cache is one tensor
            bits = bits_view(cache)
            bits.copy_(
                torch.randint(
                    -(2**15), 2**15 - 1, bits.shape, generator=generator, dtype=torch.int16
                )
            )
            key = f"cross-layer-{len(cases):03d}"
            layer, names = layer_tensors(key, cache)
            tensors.update(layer)
            read = [f"{key}/read/{k}" for k in range(2)]
            page = spec.page_size(block_size)  # not in a pool's shape
            views = kv_views(cache, name, block_size=page)
            tensors.update(dict(zip(read, (v.contiguous() for v in views), strict=True)))
            case: Case = {
                "id": key,
                "clauses": ["LAYOUT-5"],
                "layout": name,
                "per_layer": spec.per_layer,
                "shape": {
                    "kv": 2,
                    "layers": layers,
                    "num_blocks": blocks,
                    "block_size": block_size,
                    "heads": heads,
                    "head_dim": dim,
                },
                "cache": names,
                "read": read,
            }
            if page is not None:  # a token pool's page size; the older cases have none
                case["page_size"] = page
            cases.append(case)
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    cache = load_layer(tensors, case["cache"])
    page = case.get("page_size")
    got = adapter.read_layer(cache, case["layout"], **({"page_size": page} if page else {}))
    for k, name in enumerate(case["read"]):
        want = tensors[name]
        if k >= len(got) or tuple(got[k].shape) != tuple(want.shape):
            return f"reading it as {case['layout']} gives no {'KV'[k]} of shape {list(want.shape)}"
        if not torch.equal(bits_view(got[k].contiguous()), bits_view(want)):
            return f"reading it as {case['layout']} gives a different {'KV'[k]} [LAYOUT-5.2]"
    return None


FAMILY = Family("cross-layer", ("layouts",), export, check)
