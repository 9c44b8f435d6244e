"""What the suite asks of an adapter beyond its protocols, as data: the capabilities a
domain declares (:data:`DECLARED`), the validator a clause's refusal probe calls
(:func:`validator_for`), the refusal types the suite knows (:data:`REFUSAL_TYPES`), the
``replicas_write`` choices, the :class:`Acceptance` an engine's start-up validation
returns, and the errors of a malformed adapter or a capability not provided. Stdlib
only: every family's protocol module imports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class AdapterError(Exception):
    """The adapter cannot be loaded or is malformed; the message says why."""


class NotProvided(Exception):
    """Raised by a capability the adapter does not implement."""


DECLARED: dict[str, str] = {
    "fp8-scales": "an fp8 dtype in Adapter.domain (its caches travel with their scales)",
}
"""Capabilities an adapter has by what its domain declares, not by a method [DTYPE-3]."""


def validator_for(clause: str) -> str:
    """The refusal method a configuration broken against ``clause`` is handed to."""
    if clause == "MODEL-3":
        return "validate_agreement"
    family = clause.split("-")[0]
    return {
        "STAGE": "validate_sizes",
        "LAYER": "validate_partition",
        "HEAD": "validate_model",
        "MODEL": "validate_model",
        "DTYPE": "validate_model",
        "GROUP": "validate_model",
        "STATE": "validate_model",
    }.get(family, "validate_topology")


REFUSAL_TYPES: Mapping[str, type[Exception]] = MappingProxyType({"WIRE-4.1": ValueError})
"""Refusals the suite holds to one exception type, by obligation: a decoder refuses a
damaged message with a ``ValueError`` [WIRE-4.1]. Every other refusal may raise any
exception; the suite judges that something was refused, not how."""

REPLICAS_WRITE: tuple[str, ...] = ("one", "every")
"""How many replicas of a replicated head write it to a receiver: kvspec's exactly one
[PLAN-2], or every one of them (identical bytes, counted by the receiver)."""


@dataclass(frozen=True)
class Acceptance:
    """The engine's own verdict on a deployment [:meth:`Adapter.serving_accepts`]:
    whether it starts with it, and the evidence (the engine's error, or what was run)."""

    accepted: bool
    evidence: str
