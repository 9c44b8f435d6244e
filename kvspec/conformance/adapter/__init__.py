"""Adapters: how an implementation under test is plugged into the conformance suite.

An adapter's capabilities are the protocols it implements, found by type: subclass
:class:`Adapter` and each capability protocol your implementation answers
(:mod:`kvspec.conformance.adapter.protocols` gathers them; each is declared in its
clause family's folder, ``kvspec/conformance/families/<family>/protocol.py``), and override
every method of each. A check needing a protocol you did not implement is reported
"not provided" — never failed, never counted as passed. :class:`FullAdapter` implements
every protocol. An older adapter that overrides a capability's methods without naming its
protocol is still found, with a ``DeprecationWarning`` (:class:`Adapter`).

Inputs are kvspec's own frozen dataclasses (:class:`~kvspec.topology.stage.StageLayout`,
:class:`~kvspec.topology.model.ModelShape`, :class:`~kvspec.topology.case.TransferCase`) and
tensors (:class:`~kvspec.tensors.kv.RequestKV`, ``data`` ``[layers, kv, seq, heads, head_dim]``);
an adapter translates them into its implementation's terms and back.

What the implementation handles is data too: :attr:`Adapter.domain` (a
:class:`~kvspec.conformance.domain.Domain`), :attr:`Adapter.policies` (and
:attr:`Adapter.policy_rules` for policies of its own) and :attr:`Adapter.slicing_modes`.
The checks draw their examples inside that domain.
"""

from kvspec.conformance.adapter.base import Adapter, FullAdapter
from kvspec.conformance.adapter.capabilities import (
    check_adapter,
    implemented_protocols,
    protocol_capabilities,
    provided_capabilities,
)
from kvspec.conformance.adapter.contract import (
    DECLARED,
    REFUSAL_TYPES,
    REPLICAS_WRITE,
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
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.adapter.protocols import (
    CAPABILITIES,
    PROTOCOLS,
    VALIDATORS,
    protocol_for,
)

__all__ = [
    "BUILTIN",
    "CAPABILITIES",
    "DECLARED",
    "PROTOCOLS",
    "REFUSAL_TYPES",
    "REPLICAS_WRITE",
    "VALIDATORS",
    "Acceptance",
    "Adapter",
    "AdapterError",
    "AdapterProtocol",
    "FullAdapter",
    "NotProvided",
    "adapter_names",
    "check_adapter",
    "implemented_protocols",
    "load_adapter",
    "protocol_capabilities",
    "protocol_for",
    "provided_capabilities",
    "validator_for",
]
