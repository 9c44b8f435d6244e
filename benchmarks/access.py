"""The floor under every strided data-path figure: the same bytes moved as 256 B runs,
one memory copy per run, in order and out of order.

A strided data path (a NHD<->HND conversion, a gather from HND pages, a reshard landing
one head among four) moves each byte once, in runs of 256 B (one head of 128 bfloat16),
but reads or writes them in another order than memory holds them. ``index_select`` over
rows of 256 B is one memcpy per run, with no strided iteration and torch's threads, so
what it costs in an order is what reading in that order costs this machine's memory:

- in order, the runs are one long copy again: this row shows a run's own overhead;
- in the order a NHD<->HND transpose reads them (16 slots x 8 heads per block);
- shuffled, as a gather over a random block table of single-run blocks would.

These are references, not data paths. Torch's and NumPy's copies write in memory order
and read in whatever order that gives, so a data-path figure built on them that reads
in one of these orders stands on its floor; one well below it pays for something else.
A compiled loop that reads the source in order does about 0.1 better on the transpose
and worse on a reshard's landing (docs/benchmarks.md's notes give the figures).
"""

from __future__ import annotations

import torch

from benchmarks.figure import Figure, compare, memcpy

RUN = 256
"""Bytes per run: one head of 128 bfloat16, the run of every strided figure."""

SLOTS, HEADS = 16, 8
"""A block of the transpose: 16 slots x 8 heads, as the layout figures' caches."""


def orders(runs: int) -> dict[str, torch.Tensor]:
    """Which source run each output run copies, for ``runs`` runs (a multiple of a block):
    by name, as the figures' notes describe them."""
    ids = torch.arange(runs)
    return {
        "in order": ids,
        f"NHD<->HND order ({SLOTS} slots x {HEADS} heads per block)": ids.view(-1, SLOTS, HEADS)
        .transpose(1, 2)
        .reshape(-1),
        "shuffled": torch.randperm(runs, generator=torch.Generator().manual_seed(0)),
    }


def run(quick: bool) -> list[Figure]:
    nbytes = (8 if quick else 64) << 20
    runs = nbytes // RUN
    source = torch.empty(runs, RUN // 8, dtype=torch.int64).fill_(1)
    out = torch.empty_like(source)
    copy = memcpy(nbytes)
    figures = []
    for name, index in orders(runs).items():
        figures.append(
            compare(
                f"floor: {RUN} B runs, {name.split(' (')[0]}",
                nbytes,
                lambda i=index: torch.index_select(source, 0, i, out=out),
                copy,
                "memcpy",
                f"{nbytes >> 20} MiB, one memcpy per run (index_select), {name}; a reference, "
                "not a data path",
                reference=True,
            )
        )
    return figures
