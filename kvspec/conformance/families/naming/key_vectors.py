"""The ``keys`` vectors: rank-aware and legacy connector keys, and the arguments a
rank-aware key must refuse [KEY-1, KEY-2, KEY-3].
"""

from __future__ import annotations

import random

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.naming.keys import legacy_key, rank_aware_key


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    ids = ["req_7", "5_0_0_0_0", "chatcmpl-7f3a", "a_b_c", "omni", "0", "ü_名_0", "x-1"]
    cases: list[Case] = []
    for i, request_id in enumerate(ids):
        fields = {
            "from_stage": rng.randint(0, 3),
            "chunk_id": rng.randint(0, 2),
            "from_rank": rng.randint(0, 15),
            "to_rank": rng.randint(0, 15),
        }
        cases.append(
            {
                "id": f"key-{i:03d}",
                "clauses": ["KEY-1", "KEY-3"],
                "kind": "rank_aware",
                "args": {"request_id": request_id, **fields},
                "key": rank_aware_key(request_id, **fields),
            }
        )
        stages = {"from_stage": rng.randint(0, 3), "to_stage": rng.randint(0, 3)}
        cases.append(
            {
                "id": f"key-legacy-{i:03d}",
                "clauses": ["KEY-2", "KEY-3"],
                "kind": "legacy",
                "args": {"request_id": request_id, **stages},
                "key": legacy_key(request_id, **stages),
            }
        )
    refused = [
        {
            "request_id": "omni_0_to_1_kv_cache_5",
            "from_stage": 0,
            "chunk_id": 0,
            "from_rank": 0,
            "to_rank": 0,
        },
        {"request_id": "", "from_stage": 0, "chunk_id": 0, "from_rank": 0, "to_rank": 0},
        {"request_id": "r", "from_stage": -1, "chunk_id": 0, "from_rank": 0, "to_rank": 0},
        {"request_id": "r", "from_stage": "0_1", "chunk_id": 0, "from_rank": 0, "to_rank": 0},
    ]
    cases += [
        {
            "id": f"key-refused-{i:03d}",
            "clauses": ["KEY-3"],
            "kind": "rank_aware",
            "args": args,
            "key": None,
        }
        for i, args in enumerate(refused)
    ]
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    make = adapter.rank_aware_key if case["kind"] == "rank_aware" else adapter.legacy_key
    try:
        got = make(**case["args"])
    except Exception as error:
        return None if case["key"] is None else f"refused {case['args']}: {error!r}"
    if got != case["key"]:
        return f"{case['kind']} key of {case['args']} is {got!r}, expected {case['key']!r}"
    return None


FAMILY = Family("keys", ("keys",), export, check)
