"""Adapters: how an implementation under test is plugged into the conformance suite.

Subclass :class:`Adapter` and override the methods your implementation can answer.
Each group of methods is a *capability*; a check needing a capability you did not
provide is reported "not provided" — never failed, never counted as passed.

Inputs are kvspec's own frozen dataclasses (:class:`~kvspec.topology.stage.StageLayout`,
:class:`~kvspec.topology.model.ModelShape`, :class:`~kvspec.strategies.TransferCase`) and
tensors (:class:`~kvspec.tensors.kv.RequestKV`, ``data`` ``[layers, kv, seq, heads, head_dim]``);
an adapter translates them into its implementation's terms and back.

What the implementation handles is data too: :attr:`Adapter.domain` (a
:class:`~kvspec.conformance.domain.Domain`), :attr:`Adapter.policies` (and
:attr:`Adapter.policy_rules` for policies of its own) and :attr:`Adapter.slicing_modes`.
The checks draw their examples inside that domain.
"""

from kvspec.conformance.adapter.base import Adapter
from kvspec.conformance.adapter.capabilities import (
    check_adapter,
    method_capabilities,
    provided_capabilities,
)
from kvspec.conformance.adapter.contract import (
    CAPABILITIES,
    DECLARED,
    REFUSAL_TYPES,
    REPLICAS_WRITE,
    VALIDATORS,
    Acceptance,
    AdapterError,
    NotProvided,
    validator_for,
)
from kvspec.conformance.adapter.loading import (
    BUILTIN,
    adapter_names,
    load_adapter,
)

__all__ = [
    "BUILTIN",
    "CAPABILITIES",
    "DECLARED",
    "REFUSAL_TYPES",
    "REPLICAS_WRITE",
    "VALIDATORS",
    "Acceptance",
    "Adapter",
    "AdapterError",
    "NotProvided",
    "adapter_names",
    "check_adapter",
    "load_adapter",
    "method_capabilities",
    "provided_capabilities",
    "validator_for",
]
