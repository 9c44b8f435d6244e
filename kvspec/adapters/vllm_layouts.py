"""vLLM's KV cache layout registry, through kvspec's layout presets:
``kvspec conform vllm-layouts``.

Checks the installed ``vllm`` package (pinned in field/requirements/vllm-layouts.txt;
vllm 0.33.0), nothing copied:

- ``vllm/v1/kv_cache_layout.py`` ``KVCacheLayout``: one logical ``[L, B, H, N, C]``
  (RFC vllm#42082) and six stride orders (``LBHNC``, ``LBNHC``, ``LHBNC``, ``BLHNC``,
  ``BLNHC``, ``BHLNC``), C a cell's content: K then V of one head and token (``2 *
  head_size``, ``AttentionSpec.state_content_size_bytes``);
- ``vllm/v1/kv_cache_interface.py`` ``compute_layout_strides`` (the byte strides of
  each logical axis under a stride order; ``vllm/v1/core/kv_cache_planning.py`` calls it
  to place the layers of a ``KVCacheTensor``) and ``create_kv_cache_views`` (the
  per-layer ``[B, H, N, C]`` views the attention backends and connectors are handed).

Each stride order is claimed to hold the same bytes as one of kvspec's presets
(:data:`PRESETS`; ``kvspec layouts``). :meth:`VllmLayoutsAdapter.read_layer` reads a
cache stored in that preset through vLLM's own code only: it places the cache's bytes
as vLLM's allocation (``compute_layout_strides`` for the tensor's layer and block
strides, as ``kv_cache_planning`` does), asks ``create_kv_cache_views`` for the
per-layer views, and splits each cell as the backends do (K the first ``head_size`` of
C, V the rest). kvspec's layout checks then compare every element with what the preset
says it holds [LAYOUT-1, LAYOUT-2, LAYOUT-5]. A cache whose shape is not the preset's is
the adapter's input error (vLLM allocates its caches itself) and refused.

Domain: the six presets, non-fp8 dtypes (an fp8 cache keeps per-tensor scales apart);
no page padding and no kernel-block splitting (kvspec's presets model neither).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from kvspec.adapters._engine import import_engine
from kvspec.adapters._vllm import vllm_version
from kvspec.conformance.adapter import Adapter, AdapterError
from kvspec.conformance.adapter.protocols import LayoutsProtocol
from kvspec.conformance.domain import Domain
from kvspec.memory.cache_layout import get_layout
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES

NAME = "vllm-layouts"
INSTALL = "vllm 0.33.0 (field/requirements/vllm-layouts.txt)"

PRESETS: Mapping[str, str] = MappingProxyType(
    {
        "vllm_packed_hnd": "LBHNC",
        "vllm_packed_nhd": "LBNHC",
        "vllm_packed_lhbnc": "LHBNC",
        "vllm_packed_hnd_layers": "BLHNC",
        "vllm_packed_nhd_layers": "BLNHC",
        "vllm_packed_bhlnc": "BHLNC",
    }
)
"""kvspec preset -> the vLLM stride order claimed to hold the same bytes."""

DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    attention=("mha",),
    layouts=tuple(PRESETS),
)
"""The layout registry's domain as data [LAYOUT-1]; see the module docstring."""


def sizes_of(cache: torch.Tensor, layout: str) -> dict[str, int]:
    """The preset's axis sizes read from ``cache``'s shape, refusing a cache of another
    rank or whose last axis cannot hold K | V [LAYOUT-1]."""
    if layout not in PRESETS:
        raise ValueError(
            f"unknown layout {layout!r} for vLLM's registry; the layouts are "
            f"{', '.join(PRESETS)} [LAYOUT-1]"
        )
    axes = get_layout(layout).axes
    if not isinstance(cache, torch.Tensor) or cache.dim() != len(axes):
        shape = list(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(
            f"a {layout} cache is {get_layout(layout).shape} ({len(axes)} axes); got {shape} "
            "[LAYOUT-1]"
        )
    sizes = dict(zip(axes, cache.shape, strict=True))
    if sizes["dim"] % 2:
        raise ValueError(
            f"a {layout} cache's last axis holds K | V, 2 * head_dim; {sizes['dim']} is odd "
            "[LAYOUT-1]"
        )
    return sizes


class VllmLayoutsAdapter(Adapter, LayoutsProtocol):
    """vLLM's layout registry (``vllm``) against kvspec's presets; see the module docstring."""

    name = NAME
    domain = DOMAIN

    def __init__(self) -> None:
        self.version = vllm_version(NAME, INSTALL)
        self.registry = import_engine("vllm.v1.kv_cache_layout", adapter=NAME, install=INSTALL)
        self.specs = import_engine("vllm.v1.kv_cache_interface", adapter=NAME, install=INSTALL)
        missing = [
            f
            for f in ("compute_layout_strides", "create_kv_cache_views", "KVCacheTensor")
            if not hasattr(self.specs, f)
        ]
        absent = [o for o in PRESETS.values() if not hasattr(self.registry.KVCacheLayout, o)]
        if missing or absent:
            raise AdapterError(
                f"the {NAME!r} adapter reads caches through vLLM's layout registry; "
                f"{self.version} has no {', '.join(missing + absent)}"
            )

    def read_layer(self, cache: Any, layout: str) -> tuple[Any, ...]:  # type: ignore[override]  # no page_size: the suite asks it for no token pool
        """K and V of the cache, ``[num_blocks, block_size, heads, head_dim]`` each (a
        cross-layer preset: ``[layers, ...]``), as vLLM's views of the same bytes."""
        sizes = sizes_of(cache, layout)
        order = self.registry.KVCacheLayout[PRESETS[layout]]
        layers, blocks = sizes.get("layers", 1), sizes["blocks"]
        head_dim = sizes["dim"] // 2
        spec = self.specs.FullAttentionSpec(
            block_size=sizes["slots"],
            num_kv_heads=sizes["heads"],
            head_size=head_dim,
            dtype=cache.dtype,
        )
        if blocks == 0:
            # vLLM never allocates a cache of no blocks (kv_cache_planning refuses to start
            # when none fits); it holds no bytes, so its K and V are empty.
            shape = ((layers,) if "layers" in sizes else ()) + (0, sizes["slots"], sizes["heads"])
            empty = cache.new_empty((*shape, head_dim))
            return (empty, empty)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        strides = self.specs.compute_layout_strides(spec, blocks, layers, order)
        tensor = self.specs.KVCacheTensor(
            size=cache.numel() * cache.element_size(),
            layers=names,
            layer_stride=strides[0],
            block_stride=strides[1],
        )
        raw = cache.view(-1).view(torch.int8) if cache.is_contiguous() else None
        if raw is None:
            raise ValueError(f"a {layout} cache must be one dense allocation [LAYOUT-1]")
        views = self.specs.create_kv_cache_views(raw, spec, blocks, order, tensor)
        # [B, H, N, C] -> [B, N, H, C]: kvspec reads blocks, slots, heads
        cells = [v.permute(0, 2, 1, 3) for v in views]
        if "layers" in sizes:
            first = cells[0]
            step = (strides[0] // cache.element_size()) if layers > 1 else first.numel()
            cells = [
                torch.as_strided(
                    first,
                    (layers, *first.shape),
                    (step, *first.stride()),
                    first.storage_offset(),
                )
            ]
        k = [c[..., :head_dim] for c in cells]
        v = [c[..., head_dim:] for c in cells]
        return (k[0], v[0])
