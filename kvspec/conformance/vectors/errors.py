"""The ``errors`` vectors: every family's error cases
(:func:`kvspec.conformance.families.error_cases`), in the order :data:`EXPORT_ORDER`
declares, which an adapter's validators must refuse. Each case carries the one
clause it breaks (``clause``, not ``clauses``): those of the table, in the STAGE, HEAD,
LAYER, MODEL, DTYPE, PLAN, SLICE, LAYOUT, PAGED, ORACLE, KEY, PORT, PAYLOAD, CHUNK, WIRE,
CP and DP families.
"""

from __future__ import annotations

import random
from typing import Any

from kvspec.conformance.adapter import VALIDATORS, Adapter, provided_capabilities, validator_for
from kvspec.conformance.families import error_cases
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.error_cases import ErrorCase
from kvspec.testing.strategies import divides

EXPORT_ORDER: tuple[str, ...] = (
    "tp-zero",
    "pp-negative",
    "tp-not-int",
    "rank-out-of-range",
    "tp-rank-out-of-range",
    "heads-not-divisible-by-tp",
    "tp-not-divisible-by-heads",
    "tp-4-6-target-cannot-hold-heads",
    "tp-6-4-source-cannot-hold-heads",
    "target-heads-invalid",
    "unknown-policy",
    "transfer-rank-out-of-range",
    "transfer-mismatched-models",
    "fewer-layers-than-pp",
    "partition-wrong-length",
    "partition-zero-entry",
    "partition-wrong-sum",
    "model-zero-layers",
    "model-unknown-attention",
    "model-unknown-dtype",
    "scale-format-without-fp8",
    "mla-with-heads",
    "mismatched-model-facts",
    "slice-offset-out-of-range",
    "slice-applied-without-side",
    "layout-unknown-name",
    "layout-kv-axis-not-2",
    "layout-tuple-of-three",
    "layout-stated-heads-differ",
    "layout-kv-to-latent",
    "layout-block-size-not-dividing",
    "detect-stacked-two-blocks",
    "detect-heads-equal-block-size",
    "detect-heads-unstated",
    "detect-no-layout-fits",
    "paged-block-id-out-of-range",
    "paged-negative-block-id",
    "paged-duplicate-block-ids",
    "paged-seq-len-beyond-blocks",
    "paged-extra-block-ids",
    "paged-kv-heads-differ",
    "paged-fp8-scales-differ",
    "paged-fp8-scales-missing",
    "paged-fp8-cache-without-scales",
    "oracle-heads-past-model",
    "oracle-layers-past-model",
    "oracle-negative-token",
    "oracle-request-id-not-str",
    "oracle-verify-other-token-count",
    "slice-marker-without-offset",
    "key-request-id-with-legacy-head",
    "key-request-id-empty",
    "key-request-id-control-character",
    "key-negative-rank",
    "key-leading-zero",
    "key-three-numbers",
    "key-non-ascii-digit",
    "port-stage-past-rank-stride",
    "port-rank-into-next-replica",
    "port-above-65535",
    "port-zero",
    "port-dp-without-stride",
    "port-replica-into-next-dp-rank",
    "deployment-forward-meets-kv",
    "deployment-stage-id-past-stride",
    "deployment-duplicate-stage-ids",
    "payload-unknown-key",
    "payload-layer-count",
    "payload-seq-len",
    "payload-dtype",
    "payload-fp8-without-scales",
    "payload-no-layer",
    "merge-request-ids-differ",
    "merge-seq-lens-differ",
    "merge-chunks-differ",
    "merge-layer-missing-on-one-shard",
    "merge-payload-for-another-rank",
    "chunk-missing",
    "chunk-final-missing",
    "chunk-overlap",
    "chunk-repeated",
    "wire-not-json",
    "wire-future-version",
    "wire-dtype-outside-allow-list",
    "wire-negative-dimension",
    "wire-frame-length-disagrees",
    "wire-huge-declared-shape",
    "wire-frame-missing",
    "wire-header-over-limit",
    "wire-too-many-layers",
    "cp-unknown-rule",
    "cp-interleave-without-size",
    "cp-interleave-zero",
    "zigzag-request-too-short",
    "interleave-not-dividing-block-size",
    "round-robin-blocks-other-block-size",
    "dp-cp-not-dividing-tp",
    "dcp-not-dividing-attention-tp",
    "dcp-without-replicated-heads",
    "dp-rank-out-of-range",
    "cp-plan-without-length",
    "slice-heads-and-offset",
    "slice-tokens-unsorted",
)
"""The error cases' ids in the order the golden vectors list them: the order they were
written in. A new case goes at the end, so the shipped vectors only grow."""


def ordered_cases() -> list[ErrorCase]:
    """Every family's error cases in :data:`EXPORT_ORDER`; a case it does not list, or an
    id it lists that no family has, is refused naming the ids."""
    found = error_cases()
    cases = {c.id: c for c in found}
    unlisted = sorted(set(cases) - set(EXPORT_ORDER))
    gone = sorted(set(EXPORT_ORDER) - set(cases))
    if unlisted or gone or len(found) != len(EXPORT_ORDER):
        raise RuntimeError(
            f"error cases not in EXPORT_ORDER: {unlisted}; listed but no family has them: "
            f"{gone}; or an id twice (kvspec/conformance/vectors/errors.py)"
        )
    return [cases[i] for i in EXPORT_ORDER]


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    return [
        {"id": f"error-{c.id}", "clause": c.clause, "op": c.op, "args": c.args, "match": c.match}
        for c in ordered_cases()
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
