"""Layout conversion and paged gather/scatter throughput versus a memory copy of the same bytes."""

from __future__ import annotations

import torch

from benchmarks.figure import Figure, compare, memcpy
from kvspec.memory.cache_layout import CacheShape, convert, empty_cache
from kvspec.memory.paged import empty_paged_cache, gather_request, scatter_request

CONVERSIONS = (
    ("flash_attn", "flashinfer", None),
    ("flash_attn", "flash_attn_hnd", None),
    ("flash_attn", "kv_tuple", None),
    ("flash_attn", "token_major", None),
    ("flashinfer_hnd", "kv_tuple", 32),
)
"""(source, target, target block size or None for the same): stacked-axis moves, the
NHD/HND transpose, unstacking, flattening to the request form, and re-blocking."""


def run(quick: bool) -> list[Figure]:
    shape = CacheShape(
        kv=2, num_blocks=128 if quick else 1024, block_size=16, heads=8, head_dim=128
    )
    dtype = "bfloat16"
    nbytes = shape.kv * shape.slots * shape.heads * shape.head_dim * 2
    copy = memcpy(nbytes)
    label = f"{nbytes >> 20} MiB"
    figures = []
    for source, target, block_size in CONVERSIONS:
        cache = empty_cache(source, shape, dtype)
        blocks = f", block 16->{block_size}" if block_size else ""
        figures.append(
            compare(
                f"convert {source}->{target}{blocks}",
                nbytes,
                lambda c=cache, s=source, t=target, b=block_size: convert(c, s, t, block_size=b),
                copy,
                "memcpy",
                f"{label}, includes allocating the new cache",
            )
        )

    # One request over every block of a one-layer cache, in a shuffled block order.
    sender = empty_paged_cache(
        "flash_attn_hnd",
        num_layers=1,
        num_blocks=shape.num_blocks,
        block_size=16,
        heads=shape.heads,
        head_dim=shape.head_dim,
        dtype=dtype,
    )
    receiver = empty_paged_cache(
        "flashinfer",
        num_layers=1,
        num_blocks=shape.num_blocks // 2,
        block_size=32,
        heads=shape.heads,
        head_dim=shape.head_dim,
        dtype=dtype,
    )
    generator = torch.Generator().manual_seed(0)
    send_ids = torch.randperm(shape.num_blocks, generator=generator).tolist()
    recv_ids = torch.randperm(shape.num_blocks // 2, generator=generator).tolist()
    request = gather_request(sender, send_ids, shape.slots)
    figures.append(
        compare(
            "gather from flash_attn_hnd, block 16",
            nbytes,
            lambda: gather_request(sender, send_ids, shape.slots),
            copy,
            "memcpy",
            f"{label}, shuffled block ids, includes allocating the request",
        )
    )
    figures.append(
        compare(
            "scatter into flashinfer, block 32",
            nbytes,
            lambda: scatter_request(request, receiver, recv_ids),
            copy,
            "memcpy",
            f"{label}, shuffled block ids, in place",
        )
    )
    return figures
