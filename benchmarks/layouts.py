"""Layout conversion and paged gather/scatter throughput versus a memory copy of the same bytes.

Every conversion writes into a preallocated cache (``convert(out=...)``) and every
gather into a preallocated request (``gather_request(out=...)``), as an engine reusing
its buffers would; the memcpy baseline copies between preallocated buffers too. The
conversions cover every ordered pair of the per-layer K/V presets and both directions
of a block-size change; two extra figures show what allocating the output adds.
"""

from __future__ import annotations

import itertools

import torch

from benchmarks.figure import Figure, compare, memcpy
from kvspec.memory.cache_layout import (
    LAYOUTS,
    CacheShape,
    LayerCache,
    convert,
    empty_cache,
    kv_views,
)
from kvspec.memory.paged import PagedCache, empty_paged_cache, gather_request, scatter_request

KV_PRESETS: tuple[str, ...] = tuple(
    name for name, spec in LAYOUTS.items() if spec.kv_tensors in (2, None)
)
"""The per-layer presets that hold K and V: every ordered pair of them is measured."""

REBLOCKING = (
    ("flash_attn", "flash_attn", 16, 32),
    ("flash_attn", "flash_attn", 32, 16),
    ("flash_attn", "flash_attn_hnd", 16, 32),
    ("flash_attn", "flash_attn_hnd", 32, 16),
    ("flashinfer_hnd", "kv_tuple", 16, 32),
    ("flashinfer_hnd", "kv_tuple", 32, 16),
    ("vllm_packed_hnd", "vllm_packed_hnd", 16, 32),
    ("vllm_packed_hnd", "vllm_packed_hnd", 32, 16),
)
"""(source, target, source block size, target block size): both directions of a block
size change, within one stride order and across the NHD/HND transpose."""

SLOTS, HEADS, HEAD_DIM = 16384, 8, 128
"""Full size: K and V of 16384 slots x 8 heads x 128 in bfloat16 are 64 MiB."""


def run_bytes(have: torch.Tensor, want: torch.Tensor) -> int:
    """Bytes of the longest runs contiguous on both sides of a copy between two views of
    one shape [.., blocks, slots, heads, dim]: what a strided copy moves per step."""
    run, expected = 1, 1
    sides = zip(reversed(have.stride()), reversed(want.stride()), strict=True)
    for size, (a, b) in zip(reversed(have.shape), sides, strict=True):
        if size == 1:
            continue
        if a != expected or b != expected:
            break
        run, expected = run * size, expected * size
    return run * have.element_size()


def _note(label: str, cache: LayerCache, out: LayerCache, source: str, target: str) -> str:
    """The figure's note: where the copy goes, and the contiguous run it moves per step."""
    have = kv_views(cache, source, block_size=_page(source, cache))[0]
    want = kv_views(out, target, block_size=_page(target, out))[0]
    small, large = sorted((have.shape[-3], want.shape[-3]))
    if small != large:  # the views convert's re-blocking copies between
        have, want = (
            t.unflatten(-3, (large // small, small))
            if t.shape[-3] == large
            else t.unflatten(-4, (-1, large // small))
            for t in (have, want)
        )
    return f"{label}, into a preallocated cache; runs of {run_bytes(have, want)} B"


def _page(layout: str, cache: LayerCache) -> int | None:
    return 16 if LAYOUTS[layout].merged_tokens else None


def _shape(layout: str, slots: int, block_size: int) -> CacheShape:
    block = 1 if layout == "token_major" else block_size
    return CacheShape(
        kv=2, num_blocks=slots // block, block_size=block, heads=HEADS, head_dim=HEAD_DIM
    )


def _conversion(
    source: str, target: str, slots: int, block: int, new_block: int
) -> tuple[LayerCache, LayerCache, dict[str, int | None]]:
    """A source cache, a preallocated target and the convert keywords between them."""
    cache = empty_cache(source, _shape(source, slots, block), "bfloat16")
    out_shape = _shape(target, slots, new_block)
    out = empty_cache(target, out_shape, "bfloat16")
    keywords: dict[str, int | None] = {
        "block_size": out_shape.block_size,
        "source_block_size": block if LAYOUTS[source].merged_tokens else None,
    }
    return cache, out, keywords


def _paged(layout: str, num_blocks: int, block_size: int) -> PagedCache:
    return empty_paged_cache(
        layout,
        num_layers=1,
        num_blocks=num_blocks,
        block_size=block_size,
        heads=HEADS,
        head_dim=HEAD_DIM,
        dtype="bfloat16",
    )


def run(quick: bool) -> list[Figure]:
    slots = 2048 if quick else SLOTS
    nbytes = 2 * slots * HEADS * HEAD_DIM * 2
    copy = memcpy(nbytes)
    label = f"{nbytes >> 20} MiB"
    figures = []
    cases = [(s, t, 16, 16) for s, t in itertools.product(KV_PRESETS, KV_PRESETS) if s != t]
    for source, target, block, new_block in [*cases, *REBLOCKING]:
        cache, out, keywords = _conversion(source, target, slots, block, new_block)
        blocks = f", block {block}->{new_block}" if block != new_block else ""
        figures.append(
            compare(
                f"convert {source}->{target}{blocks}",
                nbytes,
                lambda c=cache, o=out, s=source, t=target, k=keywords: convert(c, s, t, out=o, **k),
                copy,
                "memcpy",
                _note(label, cache, out, source, target),
            )
        )
    cache, _, _ = _conversion("flash_attn", "flashinfer", slots, 16, 16)
    figures.append(
        compare(
            "convert flash_attn->flashinfer, allocating",
            nbytes,
            lambda: convert(cache, "flash_attn", "flashinfer"),
            copy,
            "memcpy",
            f"{label}; a new cache each time: first-touch page faults on fresh memory",
        )
    )

    # One request over every block of a one-layer cache, in a shuffled block order.
    num_blocks = slots // 16
    sender = _paged("flash_attn_hnd", num_blocks, 16)
    receivers = {
        (layout, block): _paged(layout, slots // block, block)
        for layout, block in (("flashinfer", 32), ("flash_attn_hnd", 16))
    }
    generator = torch.Generator().manual_seed(0)
    send_ids = torch.randperm(num_blocks, generator=generator).tolist()
    request = gather_request(sender, send_ids, slots)
    out = torch.empty_like(request.data)
    figures.append(
        compare(
            "gather from flash_attn_hnd, block 16",
            nbytes,
            lambda: gather_request(sender, send_ids, slots, out=out),
            copy,
            "memcpy",
            f"{label}, shuffled block ids, into a preallocated request",
        )
    )
    figures.append(
        compare(
            "gather from flash_attn_hnd, block 16, allocating",
            nbytes,
            lambda: gather_request(sender, send_ids, slots),
            copy,
            "memcpy",
            f"{label}; a new request each time: first-touch page faults on fresh memory",
        )
    )
    for (layout, block), receiver in receivers.items():
        recv_ids = torch.randperm(slots // block, generator=generator).tolist()
        figures.append(
            compare(
                f"scatter into {layout}, block {block}",
                nbytes,
                lambda r=receiver, i=recv_ids: scatter_request(request, r, i),
                copy,
                "memcpy",
                f"{label}, shuffled block ids, in place",
            )
        )
    return figures


def is_pair(figure: Figure) -> bool:
    """Whether ``figure`` is one of the same-block-size conversions between two presets."""
    name = figure.name.removeprefix("convert ")
    source, _, target = name.partition("->")
    return figure.name.startswith("convert ") and source in KV_PRESETS and target in KV_PRESETS


def pair_matrix(figures: list[Figure]) -> str:
    """The same-block-size conversions as a markdown matrix of ratios to memcpy (source
    rows, target columns; ✗ below the 0.8 goal), with each ratio's min..max over the runs
    in the figures' JSON."""
    ratios = {}
    for f in figures:
        if is_pair(f) and f.ratio is not None:
            source, _, target = f.name.removeprefix("convert ").partition("->")
            ratios[source, target] = f.ratio
    if not ratios:
        return ""
    lines = [
        "| from \\ to | " + " | ".join(KV_PRESETS) + " |",
        "|---|" + "---:|" * len(KV_PRESETS),
    ]
    for source in KV_PRESETS:
        cells = []
        for target in KV_PRESETS:
            r = ratios.get((source, target))
            cells.append("" if r is None else f"{r:.2f}" + (" ✗" if r < 0.8 else ""))
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
