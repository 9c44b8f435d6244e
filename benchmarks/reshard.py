"""Reshard throughput: executing a plan on tensors versus one memory copy of the same bytes.

The target shards are written into preallocated tensors (``reshard(out=...)``), as a
receiver reusing its buffers would; the memcpy baseline copies between preallocated
buffers too. Every byte moves once: each sender's contiguous shard is read in order and
lands in its receiver's shard in runs of one head (256 B).
"""

from __future__ import annotations

import torch

from benchmarks.figure import Figure, compare, memcpy
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.reshard import reshard, shard
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout


def run(quick: bool) -> list[Figure]:
    seq_len = 256 if quick else 2048
    model = ModelShape(num_layers=8, num_kv_heads=8, head_dim=128)
    source, target = StageLayout(tp=8), StageLayout(tp=2)
    full = random_request_kv(model, seq_len)
    plan = plan_transfer(source, target, model)
    # Each source rank holds its shard in its own memory, as deployed (not as views of
    # one tensor, which would make every sender's read a strided sweep of all of it).
    shards = [RequestKV(s.data.contiguous(), s.scales) for s in shard(full, source, model)]
    nbytes = plan.nbytes(seq_len)
    copy = memcpy(nbytes)
    outs = [t.data.clone() for t in shard(full, target, model)]
    figures = []
    for slicing in ("sender", "receiver"):
        figures.append(
            compare(
                f"reshard TP8->TP2 {slicing}-side ({nbytes >> 20} MiB)",
                nbytes,
                lambda s=slicing: reshard(shards, plan, slicing=s, out=outs),
                copy,
                "memcpy",
                "into preallocated target shards; each contiguous sender shard lands in 256 B runs",
            )
        )
    if torch.cuda.is_available():  # pragma: no cover - needs a GPU
        figures += _on_cuda(full, plan, source, target, model, nbytes)
    return figures


def _on_cuda(full, plan, source, target, model, nbytes: int) -> list[Figure]:  # pragma: no cover
    """The same reshard with every shard in device memory, against a device-to-device
    copy of the same bytes (the baseline a GPU path is held to)."""
    device = torch.device("cuda")
    shards = [
        RequestKV(s.data.contiguous().to(device), s.scales) for s in shard(full, source, model)
    ]
    outs = [t.data.to(device) for t in shard(full, target, model)]

    def run(slicing: str) -> None:
        reshard(shards, plan, slicing=slicing, out=outs)
        torch.cuda.synchronize()

    return [
        compare(
            f"reshard TP8->TP2 {slicing}-side on cuda ({nbytes >> 20} MiB)",
            nbytes,
            lambda s=slicing: run(s),
            memcpy(nbytes, device="cuda"),
            "cuda memcpy",
            "device shards into preallocated device shards",
        )
        for slicing in ("sender", "receiver")
    ]
