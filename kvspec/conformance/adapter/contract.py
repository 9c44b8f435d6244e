"""What the suite asks of an adapter, as data: the capabilities and their methods
(:data:`CAPABILITIES`), the capabilities a domain declares (:data:`DECLARED`), the
validator a clause's refusal probe calls (:data:`VALIDATORS`), the refusal types the
suite knows (:data:`REFUSAL_TYPES`), the ``replicas_write`` choices, and the
:class:`Acceptance` an engine's start-up validation returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class AdapterError(Exception):
    """The adapter cannot be loaded or is malformed; the message says why."""


class NotProvided(Exception):
    """Raised by a capability the adapter does not implement."""


CAPABILITIES: dict[str, tuple[str, ...]] = {
    "ownership": ("owned",),
    "tokens": ("owned_tokens",),
    "routing": ("sources", "targets"),
    "sender": ("sender_transform",),
    "receiver": ("receiver_combine",),
    "marker": ("apply_marker",),
    "sizes": ("validate_sizes",),
    "partitions": ("validate_partition",),
    "topology": ("validate_topology",),
    "models": ("validate_model",),
    "agreement": ("validate_agreement",),
    "layouts": ("read_layer",),
    "conversion": ("convert_layout",),
    "fields": ("read_fields",),
    "detection": ("detect_layout",),
    "paged": ("gather", "scatter"),
    "descriptors": ("descriptors",),
    "oracle": ("oracle_fill",),
    "verifier": ("oracle_verify",),
    "record-oracle": ("record_fill", "record_verify"),
    "record-rows": ("record_rows", "record_fields"),
    "keys": ("rank_aware_key", "legacy_key"),
    "edge-keys": ("send_keys", "recv_keys"),
    "ports": ("kv_port",),
    "dp-ports": ("stage_port",),
    "payload": ("merge",),
    "chunks": ("reassemble",),
    "streaming": ("layer_groups", "stream_key", "merge_layers"),
    "wire": ("encode", "decode"),
    "lifecycle": ("lifecycle",),
    "state-ownership": ("state_units",),
    "state-reads": ("state_reads",),
    "group-bytes": ("group_bytes",),
    "block-sizes": ("window_tokens",),
    "hybrid-block-size": ("hybrid_block_size",),
    "state-oracle": ("state_oracle",),
    "state-layout": ("state_offset",),
    "state-runs": ("state_runs",),
}
"""Capability name -> the adapter methods it consists of."""

DECLARED: dict[str, str] = {
    "fp8-scales": "an fp8 dtype in Adapter.domain (its caches travel with their scales)",
}
"""Capabilities an adapter has by what its domain declares, not by a method [DTYPE-3]."""

VALIDATORS: dict[str, str] = {
    "validate_sizes": "sizes",
    "validate_partition": "partitions",
    "validate_topology": "topology",
    "validate_model": "models",
    "validate_agreement": "agreement",
}
"""Each refusal method and its capability."""


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

_ALIASES: dict[str, tuple[str, ...]] = {method: ("validate",) for method in VALIDATORS}
"""Methods an older adapter may provide under another name: ``validate`` refused every
invalid configuration before the refusals were separate capabilities."""


REPLICAS_WRITE: tuple[str, ...] = ("one", "every")
"""How many replicas of a replicated head write it to a receiver: kvspec's exactly one
[PLAN-2], or every one of them (identical bytes, counted by the receiver)."""


@dataclass(frozen=True)
class Acceptance:
    """The engine's own verdict on a deployment [:meth:`Adapter.serving_accepts`]:
    whether it starts with it, and the evidence (the engine's error, or what was run)."""

    accepted: bool
    evidence: str
