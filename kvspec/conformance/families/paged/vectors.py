"""The ``paged`` vectors: a request gathered from a paged cache's blocks, and the block
id lists that must be refused [PAGED-1, PAGED-2, PAGED-3, PAGED-4].
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import layer_tensors, load_layer, vector_layouts
from kvspec.memory.cache_layout import get_layout, layouts_for
from kvspec.memory.paged import PagedCache, empty_model_cache, gather_request, scatter_request
from kvspec.tensors.dtypes import FP8_DTYPES, bits_view
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.topology.model import ModelShape


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    """Twelve cases over the first vector layouts, drawn as they always were, then one
    for each per-layer preset added since [PAGED-1, PAGED-2]."""
    cases: list[Case] = []
    tensors: Tensors = {}
    first, later = vector_layouts()
    for i in range(12):
        attention = "mla" if i % 4 == 3 else "mha"
        layout = rng.choice([n for n in layouts_for(attention) if n in first])
        _case(i, layout, attention, rng, cases, tensors)
    for i, layout in enumerate(later, len(cases)):
        _case(
            i, layout, "mla" if get_layout(layout).kv_tensors == 1 else "mha", rng, cases, tensors
        )
    return cases, tensors


def _case(
    i: int, layout: str, attention: str, rng: random.Random, cases: list[Case], tensors: Tensors
) -> None:
    """Case ``i``: a request in a ``layout`` cache, drawn from ``rng``."""
    block_size = rng.randint(1, 5) if get_layout(layout).paged else 1
    seq_len = rng.randint(1, 12)
    needed = -(-seq_len // block_size)
    num_blocks = needed + rng.randint(0, 3)
    ids = rng.sample(range(num_blocks), needed)
    dtype = rng.choice(["bfloat16", "float16", "float8_e4m3fn"])
    model = (
        ModelShape.mla(2, 3, dtype=dtype)
        if attention == "mla"
        else ModelShape(2, rng.randint(1, 3), rng.randint(1, 3), dtype=dtype)
    )
    scales = oracle_scales(model) if model.dtype in FP8_DTYPES else None
    cache = empty_model_cache(
        layout, model, num_blocks=num_blocks, block_size=block_size, scales=scales
    )
    filler = oracle_kv(model, f"fill-{i}", tokens=num_blocks * block_size)
    scatter_request(filler, cache, list(range(num_blocks)))
    key = f"paged-{i:03d}"
    layers = []
    for j, layer in enumerate(cache.layers):
        part, names = layer_tensors(f"{key}/layer/{j}", layer)
        tensors.update(part)
        layers.append(names)
    tensors[f"{key}/gathered"] = gather_request(cache, ids, seq_len).data
    if scales is not None:
        tensors[f"{key}/scales"] = scales
    cases.append(
        {
            "id": key,
            "clauses": ["PAGED-1", "PAGED-2", "PAGED-3", "PAGED-4"],
            "layout": layout,
            "model": model.to_dict(),
            "block_size": block_size,
            "num_blocks": num_blocks,
            "block_ids": ids,
            "seq_len": seq_len,
            "layers": layers,
            "scales": f"{key}/scales" if scales is not None else None,
            "gathered": f"{key}/gathered",
            "refuse": [[*ids[:-1], num_blocks], [ids[0], *ids]],
        }
    )


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    scales = tensors[case["scales"]] if case["scales"] else None
    cache = PagedCache(
        get_layout(case["layout"]),  # a vector names its layout
        tuple(load_layer(tensors, names) for names in case["layers"]),
        scales,
        block_size=case["block_size"],
    )
    got = adapter.gather(cache, list(case["block_ids"]), case["seq_len"])
    if not torch.equal(bits_view(got.data.contiguous()), bits_view(tensors[case["gathered"]])):
        return "the gathered request differs from the vector"
    for bad in case["refuse"]:
        try:
            adapter.gather(cache, list(bad), case["seq_len"])
        except Exception:
            continue
        return f"gather with block ids {bad} was accepted"
    return None


FAMILY = Family("paged", ("paged",), export, check)
