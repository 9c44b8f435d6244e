"""The ``descriptors`` vectors: the byte-range descriptors of one edge between two
registered caches, and the fewest that cover it [DESC-1, DESC-2, DESC-3].
"""

from __future__ import annotations

import random
from typing import Any

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import PINNED, sample_cases
from kvspec.memory.cache_layout import get_layout
from kvspec.memory.descriptors import RegisteredCache, judge_descriptors, plan_descriptors
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape

DESC_LAYOUT_PAIRS = (
    ("vllm_pth_hnd", "vllm_pth_nhd"),
    ("vllm_packed_hnd", "sglang_mha"),
    ("flash_attn", "vllm_packed_nhd"),
    ("vllm_packed_hnd_layers", "trtllm_pool"),
    ("flashinfer_hnd", "kv_tuple"),
    ("mla", "sglang_mla"),
)


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    chosen = [
        PINNED[0],
        PINNED[2],
        PINNED[3],
        PINNED[4],
        PINNED[5],
        *sample_cases(rng, 4, max_layers=3),
    ]
    for i, case in enumerate(chosen):
        attention = case.model.attention
        pairs = [
            p for p in DESC_LAYOUT_PAIRS if get_layout(p[0]).kv_tensors == case.model.kv_tensors
        ]
        src_layout, dst_layout = pairs[i % len(pairs)]
        model = case.model
        if get_layout(src_layout).dtypes:  # an inline-scale record holds fp8
            model = ModelShape(model.num_layers, model.num_kv_heads, 4, dtype="float8_e4m3fn")
            case = TransferCase(case.source, case.target, model, case.policy)
        plan = case.plan()
        edge = plan.edges[rng.randrange(len(plan.edges))]
        seq_len = rng.randint(1, 12)
        start = rng.randrange(seq_len)
        sides = []
        for layout, stage, rank in (
            (src_layout, case.source, edge.src),
            (dst_layout, case.target, edge.dst),
        ):
            spec = get_layout(layout)
            block_size = rng.randint(1, 5) if spec.paged else 1
            needed = -(-seq_len // block_size)
            num_blocks = needed + rng.randint(0, 2)
            registered = RegisteredCache.of_rank(
                spec,
                stage,
                model,
                rank,
                num_blocks=num_blocks,
                block_size=block_size,
                dtype=spec.dtypes[0] if spec.dtypes else None,
            )
            sides.append((registered, rng.sample(range(num_blocks), needed)))
        made = plan_descriptors(
            plan, edge, sides[0][0], sides[0][1], sides[1][0], sides[1][1], range(start, seq_len)
        )
        cases.append(
            {
                "id": f"descriptors-{i:03d}",
                "clauses": ["DESC-1", "DESC-2", "DESC-3"],
                **case.to_dict(),
                "attention": attention,
                "edge": [edge.src, edge.dst],
                "tokens": [start, seq_len],
                "src_cache": {**sides[0][0].to_dict(), "block_ids": sides[0][1]},
                "dst_cache": {**sides[1][0].to_dict(), "block_ids": sides[1][1]},
                "regions": {
                    "source": sides[0][0].regions(),
                    "target": sides[1][0].regions(),
                },
                "descriptors": [d.to_list() for d in made.descriptors],
                "share_bytes": made.share_bytes,
            }
        )
    return cases, {}


def _registered(entry: dict[str, Any]) -> tuple[RegisteredCache, list[int]]:
    data = {k: v for k, v in entry.items() if k != "block_ids"}
    return RegisteredCache.from_dict(data), list(entry["block_ids"])


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if not adapter.supports(transfer):
        raise NotApplicable("outside the adapter's declared domain")
    (source, source_ids), (target, target_ids) = (
        _registered(case["src_cache"]),
        _registered(case["dst_cache"]),
    )
    reference = plan_descriptors(
        transfer.plan(),
        transfer.plan().edge(*case["edge"]),
        source,
        source_ids,
        target,
        target_ids,
        range(*case["tokens"]),
    )
    if [d.to_list() for d in reference.descriptors] != case["descriptors"]:
        return "the vector's list is not the spec's (regenerate the vectors)"
    src, dst = case["edge"]  # a pair: plan().edge(*case["edge"]) took it above
    got = adapter.descriptors(
        transfer, src, dst, source, source_ids, target, target_ids, range(*case["tokens"])
    )
    verdict = judge_descriptors(list(got), reference)
    if not verdict.ok:
        return verdict.problems[0]
    if adapter.coalesces and verdict.count != verdict.minimum:
        return f"{verdict.count} descriptors; the minimum is {verdict.minimum} [DESC-3.1]"
    return None


FAMILY = Family("descriptors", ("descriptors",), export, check)
