"""The ``wire`` vectors: a payload's frames as sent, and the header and tensors they
decode to [WIRE-1, WIRE-3, PAYLOAD-1].
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import PINNED, sample_cases
from kvspec.tensors.dtypes import bits_view
from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.transport.payload import payload_from_shipment
from kvspec.transport.wire import encode


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases, tensors = [], {}
    for i, case in enumerate(
        [PINNED[0], PINNED[2], PINNED[5], *sample_cases(rng, 3, max_layers=3)]
    ):
        plan = case.plan()
        full = random_request_kv(case.model, 2 + i % 2, seed=i)
        src = plan.edges[0].src
        shipment = send(plan, src, shard(full, case.source, case.model)[src])[0]
        payload = payload_from_shipment(plan, shipment, f"req_{i}", block_size=16, block_ids=[i])
        key = f"wire-{i:03d}"
        frames = [bytes(f) for f in encode(payload)]
        names = []
        for j, frame in enumerate(frames):
            names.append(f"{key}/frame/{j}")
            tensors[names[-1]] = (
                torch.frombuffer(bytearray(frame), dtype=torch.uint8)
                if frame
                else torch.zeros(0, dtype=torch.uint8)
            )
        tensors.update(
            {f"{key}/{name}/{layer}": t.contiguous() for name, layer, t in payload.tensors()}
        )
        cases.append(
            {
                "id": key,
                "clauses": ["WIRE-1", "WIRE-3", "PAYLOAD-1"],
                "frames": names,
                "request_id": payload.request_id,
                "metadata": payload.metadata(),
                "tensors": {
                    f"{name}/{layer}": f"{key}/{name}/{layer}"
                    for name, layer, _ in payload.tensors()
                },
            }
        )
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    frames = [tensors[n].numpy().tobytes() for n in case["frames"]]
    got = adapter.decode(frames)
    if got.request_id != case["request_id"] or got.metadata() != case["metadata"]:
        return "the decoded header differs from the vector"
    for name, layer, t in got.tensors():
        want = tensors[case["tensors"][f"{name}/{layer}"]]
        if not torch.equal(bits_view(t.contiguous()), bits_view(want)):
            return f"decoded {name}[{layer}] differs from the vector"
    if len(got.tensors()) != len(case["tensors"]):
        return f"decoded {len(got.tensors())} tensors, expected {len(case['tensors'])}"
    return None


FAMILY = Family("wire", ("wire",), export, check)
