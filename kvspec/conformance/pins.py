"""Pinned examples as an adapter's engine would run them.

A check's pins (``Check.examples``) are the field's known-hard configurations: replicas,
fan-out, uneven pipeline splits, MLA, TP sizes that do not divide. They are written once,
in kvspec's terms: routed under ``lowest`` and split by kvspec's default partition
[LAYER-1]. An engine with its own replica rule (``Adapter.policies``) or its own default
split (``Adapter.layer_partition``) never runs those exact deployments, and dropping the
pins as outside its domain would leave it checked on drawn examples alone, which is how
the SGLang PP pairing (sgl-project/sglang#27740) went unseen by the suite: its ``3 layers,
PP2 -> PP1`` pin was dropped for its policy, and under kvspec's ``[2, 1]`` split instead of
SGLang's ``[1, 2]`` it would not have met the bug anyway.

So each pin is handed to the adapter as the same topology under the engine's own choices:
``lowest`` becomes the adapter's first replica rule when it does not name ``lowest``, and a
pipeline stage at the default split gets the engine's own split where it differs. A pin
that names another policy (``balanced``: it is about that policy) or an explicit partition
is left as written; what still lies outside the domain is skipped by the checks as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.conformance.adapter import Adapter
from kvspec.testing.strategies import engine_default

_CASE_KEYS = frozenset({"source", "target", "model", "policy"})


def pins_for(adapter: Adapter, examples: Sequence[Any]) -> tuple[Any, ...]:
    """``examples`` with every transfer case in them (at any depth) adapted to ``adapter``
    as the module says; one example out for each one in, in order."""
    return tuple(_adapt(adapter, example) for example in examples)


def _adapt(adapter: Adapter, value: Any) -> Any:
    if isinstance(value, dict):
        value = {key: _adapt(adapter, item) for key, item in value.items()}
        if value.keys() >= _CASE_KEYS:
            value = _adapt_case(adapter, value)
        return value
    if isinstance(value, list | tuple):
        return type(value)(_adapt(adapter, item) for item in value)
    return value


def _adapt_case(adapter: Adapter, case: dict[str, Any]) -> dict[str, Any]:
    case = dict(case)
    policies = adapter.drawn_policies
    if case["policy"] == "lowest" and "lowest" not in policies:
        case["policy"] = policies[0]  # [PLAN-4]: the engine's own replica rule
    num_layers = case["model"].get("num_layers") if isinstance(case["model"], dict) else None
    for side in ("source", "target"):
        stage = case[side]
        if not isinstance(stage, dict) or stage.get("layer_partition") is not None:
            continue
        pp = stage.get("pp", 1)
        if not isinstance(num_layers, int) or not isinstance(pp, int) or pp > num_layers:
            continue  # an invalid pin stays invalid, as written
        split = engine_default(adapter.layer_partition, num_layers, pp)
        if split is not None:
            case[side] = {**stage, "layer_partition": list(split)}  # [LAYER-1, LAYER-2]
    return case
