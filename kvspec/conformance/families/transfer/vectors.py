"""The ``reshard`` vectors: a full request's KV, each target rank's share, and every
edge's tensor sliced on the sender's and on the receiver's side
[RESHARD-1, RESHARD-2, SLICE-1, SLICE-2, DTYPE-2, DTYPE-3].
"""

from __future__ import annotations

import random
from typing import cast

import torch

from kvspec.conformance.adapter import FullAdapter, provided_capabilities
from kvspec.conformance.draws import difference
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import PARALLEL, PINNED, sample_cases, sample_parallel
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.reshard import Shipment, edge_marker, send, shard
from kvspec.topology.case import TransferCase


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    chosen = [*PINNED[:3], PINNED[4], PINNED[5], *sample_cases(rng, 10, max_layers=4)]
    more = random.Random(f"{rng.random()}:parallel")
    chosen += [*PARALLEL, *sample_parallel(more, 6)]
    for i, case in enumerate(chosen):
        key = f"reshard-{i:03d}"
        # A sharded case has its seq_len [PLAN-6].
        seq_len = cast(int, case.seq_len) if case.sharded else 1 + i % 3
        full = random_request_kv(case.model, seq_len, seed=i)
        plan = case.plan()
        tensors[f"{key}/full"] = full.data
        if full.scales is not None:
            tensors[f"{key}/full_scales"] = full.scales
        targets = shard(full, case.target, case.model, dp_rank=case.target_dp)
        held = [plan.sources_of(dst) != () for dst in case.target.ranks()]
        for dst, kv in enumerate(targets):
            if held[dst]:
                tensors[f"{key}/target/{dst}"] = kv.data.contiguous()
        edges = []
        sources = shard(full, case.source, case.model, dp_rank=case.source_dp)
        for src, local in enumerate(sources):
            for slicing in ("sender", "receiver"):
                for s in send(plan, src, local, slicing=slicing):
                    tensors[f"{key}/edge/{src}-{s.edge.dst}/{slicing}"] = s.kv.data.contiguous()
            edges += [e.to_dict() for e in plan.edges_from(src)]
        cases.append(
            {
                "id": key,
                "clauses": ["RESHARD-1", "RESHARD-2", "SLICE-1", "SLICE-2", "DTYPE-2", "DTYPE-3"],
                **case.to_dict(),
                "seq_len": seq_len,
                "tensors": {
                    "full": f"{key}/full",
                    "full_scales": f"{key}/full_scales" if full.scales is not None else None,
                    "targets": [
                        f"{key}/target/{d}" if held[d] else None for d in range(len(targets))
                    ],
                    "edges": {
                        f"{e['src']}-{e['dst']}": {
                            s: f"{key}/edge/{e['src']}-{e['dst']}/{s}"
                            for s in ("sender", "receiver")
                        }
                        for e in edges
                    },
                },
                "edges": edges,
            }
        )
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if not adapter.domain.holds(transfer) or not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    names = case["tensors"]
    scales = tensors[names["full_scales"]] if names["full_scales"] else None
    full = RequestKV(tensors[names["full"]], scales)
    sources = shard(full, transfer.source, transfer.model, dp_rank=transfer.source_dp)
    targets = shard(full, transfer.target, transfer.model, dp_rank=transfer.target_dp)
    plan = transfer.plan()
    for slicing in adapter.slicing_modes:
        inbox: dict[int, list[Shipment]] = {t: [] for t in transfer.target.ranks()}
        for src in transfer.source.ranks():
            for dst, kv in adapter.sender_transform(transfer, src, sources[src], slicing).items():
                edge = plan.edge(src, dst)
                want = tensors[names["edges"][f"{src}-{dst}"][slicing]]
                if not torch.equal(kv.data.contiguous().view(torch.uint8), want.view(torch.uint8)):
                    return f"edge {src}->{dst} ({slicing}-side) differs from the vector"
                marker = edge_marker(plan, edge, applied=slicing == "sender")
                inbox[dst].append(Shipment(edge, marker, kv))
        if "receiver" in provided_capabilities(adapter):
            marks = "marker" in provided_capabilities(adapter)
            for dst in transfer.target.ranks():
                if names["targets"][dst] is None:
                    continue  # holds none of the request
                received = [
                    adapter.apply_marker(transfer, dst, s) if marks else s for s in inbox[dst]
                ]
                got = adapter.receiver_combine(transfer, dst, received)
                problem = difference(got, targets[dst])
                if problem:
                    return f"target rank {dst} ({slicing}-side): {problem}"
    return None


FAMILY = Family("reshard", ("sender",), export, check)
