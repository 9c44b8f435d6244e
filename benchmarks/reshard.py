"""Reshard throughput: executing a plan on tensors versus one memory copy of the same bytes."""

from __future__ import annotations

from benchmarks.figure import Figure, compare, memcpy
from kvspec.tensors.kv import random_request_kv
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
    shards = shard(full, source, model)
    nbytes = plan.nbytes(seq_len)
    copy = memcpy(nbytes)
    figures = []
    for slicing in ("sender", "receiver"):
        figures.append(
            compare(
                f"reshard TP8->TP2 {slicing}-side ({nbytes >> 20} MiB)",
                nbytes,
                lambda s=slicing: reshard(shards, plan, slicing=s),
                copy,
                "memcpy",
            )
        )
    return figures
