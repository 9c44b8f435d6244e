"""The ``errors`` vectors: every case of :data:`kvspec.error_cases.ERROR_CASES`, in the
table's order, which an adapter's validators must refuse. Each case carries the one
clause it breaks (``clause``, not ``clauses``): those of the table, in the STAGE, HEAD,
LAYER, MODEL, DTYPE, PLAN, SLICE, LAYOUT, PAGED, ORACLE, KEY, PORT, PAYLOAD, CHUNK, WIRE,
CP and DP families.
"""

from __future__ import annotations

import random
from typing import Any

from kvspec.conformance.adapter import VALIDATORS, Adapter, provided_capabilities, validator_for
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.error_cases import ERROR_CASES
from kvspec.strategies import divides


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    return [
        {"id": f"error-{c.id}", "clause": c.clause, "op": c.op, "args": c.args, "match": c.match}
        for c in ERROR_CASES
    ], {}


_SECOND_RELEASE_AXES = {"cp": "cp_sizes", "dcp": "dcp_sizes", "dp": "dp_sizes"}


def _outside(adapter: Adapter, args: dict[str, Any]) -> str | None:
    """Why a transfer configuration uses an axis the adapter's domain leaves out, or None."""
    domain = adapter.domain
    for side in ("source", "target"):
        layout = args.get(side, {})
        for key, sizes in _SECOND_RELEASE_AXES.items():
            if layout.get(key, 1) != 1 and max(getattr(domain, sizes)) == 1:
                return f"{side} {key} is outside the adapter's domain"
    tps = (args["source"].get("tp"), args["target"].get("tp"))
    positive = all(isinstance(t, int) and t > 0 for t in tps)
    if positive and not divides(*tps) and not domain.non_dividing_tp:
        return "TP pairs that do not divide are outside the adapter's domain"
    return None


def check(adapter: Adapter, case: Case, tensors: Tensors) -> str | None:
    if case["op"] != "transfer":
        raise NotApplicable(f"operation {case['op']!r} has no adapter capability")
    why = _outside(adapter, case["args"])
    if why:
        raise NotApplicable(why)
    method = validator_for(case["clause"])
    capability = VALIDATORS[method]
    if capability not in provided_capabilities(adapter):
        raise NotApplicable(f"needs {capability}")
    try:
        getattr(adapter, method)(case["args"])
    except Exception:
        return None
    return f"accepted {case['args']}, which breaks {case['clause']}"


FAMILY = Family("errors", (), export, check)
