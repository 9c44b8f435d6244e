"""The ``oracle`` vectors: the oracle's fill of a region, every element a hash of its
coordinates, and of a context-parallel rank's token set
[ORACLE-1, ORACLE-2, ORACLE-3, ORACLE-4, CP-1].
"""

from __future__ import annotations

import random
from typing import Any

import torch

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import TOKEN_LAYOUTS
from kvspec.tensors.dtypes import bits_view
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import oracle_kv
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens


def _case(
    tensors: Tensors,
    key: str,
    clauses: list[str],
    model: ModelShape,
    request_id: str,
    seed: int,
    region: dict[str, Any],
    kv: RequestKV,
) -> Case:
    """The case ``key``: the fill of ``region``, its tensors stored in ``tensors``."""
    tensors[f"{key}/data"] = kv.data
    if kv.scales is not None:
        tensors[f"{key}/scales"] = kv.scales
    return {
        "id": key,
        "clauses": clauses,
        "model": model.to_dict(),
        "request_id": request_id,
        "seed": seed,
        "region": region,
        "data": f"{key}/data",
        "scales": f"{key}/scales" if kv.scales is not None else None,
    }


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases: list[Case] = []
    tensors: Tensors = {}
    for i, dtype in enumerate(
        ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"] * 2
    ):
        model = (
            ModelShape.mla(3, 4, dtype=dtype)
            if i >= 5 and i % 2
            else ModelShape(3, 4, 3, dtype=dtype)
        )
        request_id = f"req_{i}-x"
        seed = rng.randrange(2**31)
        region: dict[str, Any] = {
            "tokens": [2, 9],
            "layers": [1, 3],
            "heads": [0, model.num_kv_heads],
        }
        ranges: dict[str, Any] = {k: range(*v) for k, v in region.items()}
        kv = oracle_kv(model, request_id, seed=seed, **ranges)
        clauses = ["ORACLE-1", "ORACLE-2", "ORACLE-3", "ORACLE-4"]
        cases.append(
            _case(tensors, f"oracle-{i:03d}", clauses, model, request_id, seed, region, kv)
        )
    for i, (layout, _) in enumerate(TOKEN_LAYOUTS[:6], len(cases)):
        # a context-parallel rank's token set: its k-th entry is its k-th token [ORACLE-4]
        model = ModelShape(2, 2, 2, dtype=rng.choice(["bfloat16", "float8_e5m2"]))
        tokens = layout.rule.tokens(1, layout.token_shards, 37)
        request_id, seed = f"req_{i}-cp", rng.randrange(2**31)
        kv = oracle_kv(model, request_id, seed=seed, tokens=tokens, layers=range(2))
        region = {"tokens": tokens.to_list(), "layers": [0, 2], "heads": [0, 2]}
        clauses = ["ORACLE-1", "ORACLE-4", "CP-1"]
        cases.append(
            _case(tensors, f"oracle-{i:03d}", clauses, model, request_id, seed, region, kv)
        )
    return cases, tensors


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    model = ModelShape.from_dict(case["model"])
    region: dict[str, Any] = {
        k: Tokens.from_list(v) if v and isinstance(v[0], list) else range(*v)
        for k, v in case["region"].items()
    }
    got = adapter.oracle_fill(model, case["request_id"], seed=case["seed"], **region)
    if not torch.equal(bits_view(got.data.contiguous()), bits_view(tensors[case["data"]])):
        return "the fill differs from the vector"
    return None


FAMILY = Family("oracle", ("oracle",), export, check)
