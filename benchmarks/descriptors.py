"""What a layout choice costs a pull connector: conversion and descriptor execution against a
memory copy of the same bytes, and the descriptors per 1k tokens of common layout pairs.

python -m benchmarks --only descriptors     the figures
python -m benchmarks.descriptors            the table: layout pair x TP pair -> descriptors
                                            per 1k tokens (32 layers, 8 KV heads x 128)
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from benchmarks.figure import Figure, compare, memcpy
from kvspec.memory.cache_layout import CacheShape, convert, empty_cache, get_layout
from kvspec.memory.descriptors import (
    RegisteredCache,
    execute_descriptors,
    plan_descriptors,
    region_buffers,
)
from kvspec.memory.paged import blocks_needed, empty_paged_cache
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout

CONVERSIONS = (("vllm_pth_hnd", "vllm_pth_nhd", "float8_e4m3fn"),)
"""(source, target, dtype): a record with inline scales. The plain presets' pairs are
all in ``benchmarks.layouts``."""

PAIRS = (
    ("vllm_packed_hnd", "vllm_packed_hnd"),
    ("vllm_packed_nhd", "vllm_packed_nhd"),
    ("vllm_packed_nhd", "vllm_packed_hnd"),
    ("vllm_packed_hnd", "sglang_mha"),
    ("sglang_mha", "sglang_mha"),
    ("flash_attn", "flash_attn"),
    ("vllm_packed_hnd_layers", "vllm_packed_hnd_layers"),
    ("trtllm_pool", "trtllm_pool"),
    ("trtllm_pool", "vllm_packed_hnd"),
)
"""Layout pairs of the table: same layout (HND and NHD), an NHD sender to an HND receiver
(vLLM's permute case), vLLM to SGLang, the old kv-first form, cross-layer tensors."""

TP_PAIRS = ((1, 1), (2, 2), (8, 2), (2, 8))


def descriptors_per_1k(
    src_layout: str,
    dst_layout: str,
    source_tp: int,
    target_tp: int,
    *,
    layers: int = 32,
    heads: int = 8,
    head_dim: int = 128,
    tokens: int = 1024,
    block_size: int = 16,
    seed: int = 0,
) -> float:
    """Descriptors per 1k tokens of one request over every edge [DESC-3]: block tables
    shuffled (seeded), as a busy engine's are."""
    model = ModelShape(layers, heads, head_dim)
    plan = plan_transfer(StageLayout(source_tp), StageLayout(target_tp), model)
    rng = random.Random(seed)
    count = 0
    for edge in plan.edges:
        sides = []
        for layout, stage, rank in (
            (src_layout, plan.source, edge.src),
            (dst_layout, plan.target, edge.dst),
        ):
            owner = rank_ownership(stage, model, rank)
            needed = blocks_needed(tokens, block_size)
            cache = RegisteredCache(
                get_layout(layout),
                len(owner.layers),
                needed * 2,
                block_size,
                len(owner.heads),
                head_dim,
                "bfloat16",
            )
            sides.append((cache, rng.sample(range(needed * 2), needed)))
        made = plan_descriptors(
            plan, edge, sides[0][0], sides[0][1], sides[1][0], sides[1][1], range(tokens),
            count_only=True,
        )  # fmt: skip
        count += made.count
    return count * 1000 / tokens


def table(*, layers: int = 32) -> str:
    """The markdown table: layout pair x TP pair -> descriptors per 1k tokens."""
    head = "| sender -> receiver | " + " | ".join(f"TP{s}->TP{t}" for s, t in TP_PAIRS) + " |"
    lines = [head, "|---|" + "---:|" * len(TP_PAIRS)]
    for src, dst in PAIRS:
        cells = [f"{descriptors_per_1k(src, dst, s, t, layers=layers):,.0f}" for s, t in TP_PAIRS]
        lines.append(f"| {src} -> {dst} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(quick: bool) -> list[Figure]:
    figures = []
    blocks = 256 if quick else 2048
    shape = CacheShape(kv=2, num_blocks=blocks, block_size=16, heads=8, head_dim=128)
    for source, target, dtype in CONVERSIONS:
        cache, out = empty_cache(source, shape, dtype), empty_cache(target, shape, dtype)
        nbytes = sum(
            t.numel() * t.element_size() for t in (cache if isinstance(cache, tuple) else (cache,))
        )
        figures.append(
            compare(
                f"convert {source}->{target}",
                nbytes,
                lambda c=cache, s=source, t=target, o=out: convert(c, s, t, out=o),
                memcpy(nbytes),
                "memcpy",
                f"{nbytes >> 20} MiB {dtype}, into a preallocated cache",
            )
        )
    # Descriptor execution: one request's edge between two real caches, moved range by
    # range, against one copy of the same number of bytes.
    layers, tokens = (4, 512) if quick else (16, 2048)
    for src_layout, dst_layout, note in (
        (
            "vllm_packed_hnd",
            "vllm_packed_hnd",
            "same layout: one range per block run; one memcpy per range, from Python",
        ),
        (
            "vllm_packed_hnd",
            "sglang_mha",
            "HND pages into a token pool: a range per token; below goal by design: a "
            "connector pays per range [DESC-3]",
        ),
    ):
        model = ModelShape(layers, 8, 128)
        plan = plan_transfer(StageLayout(2), StageLayout(1), model)
        edge = plan.edges[0]
        caches = []
        for layout, stage, rank in ((src_layout, plan.source, 0), (dst_layout, plan.target, 0)):
            owner = rank_ownership(stage, model, rank)
            caches.append(
                empty_paged_cache(
                    layout,
                    num_layers=len(owner.layers),
                    num_blocks=tokens // 16,
                    block_size=16,
                    heads=len(owner.heads),
                    head_dim=128,
                    dtype="bfloat16",
                )
            )
        ids = torch.randperm(tokens // 16, generator=torch.Generator().manual_seed(1)).tolist()
        made = plan_descriptors(
            plan,
            edge,
            RegisteredCache.of(caches[0]),
            ids,
            RegisteredCache.of(caches[1]),
            ids,
            range(tokens),
        )
        source, target = region_buffers(caches[0]), region_buffers(caches[1])
        figures.append(
            compare(
                f"execute {made.count} descriptors {src_layout}->{dst_layout}",
                made.share_bytes,
                lambda m=made, s=source, t=target: execute_descriptors(m.descriptors, s, t),
                memcpy(made.share_bytes),
                "memcpy",
                f"{made.share_bytes >> 20} MiB, {made.share_bytes / made.count:.0f} B each; {note}",
            )
        )
    quick_layers = 4 if quick else 32
    for src, dst in PAIRS[:4]:
        for s, t in ((2, 2), (8, 2)):
            figures.append(
                Figure(
                    f"desc/1k tok {src}->{dst} TP{s}->TP{t}",
                    "count",
                    descriptors_per_1k(src, dst, s, t, layers=quick_layers),
                    note=f"{quick_layers} layers, 8 KV heads x 128, block 16, shuffled ids",
                )
            )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.descriptors", description=__doc__)
    parser.add_argument("--layers", type=int, default=32, help="model layers (32)")
    args = parser.parse_args(argv)
    print(table(layers=args.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
