"""Every capability protocol, gathered from the family folders that declare them
(``kvspec/conformance/families/<family>/protocol.py``): :class:`EveryProtocol` (their
union), :data:`PROTOCOLS` (each once, family by family), and what is derived from them:
:data:`CAPABILITIES` (capability name -> its methods) and :data:`VALIDATORS` (each refusal
method -> its capability). The protocols are the source; these tables are read off them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvspec.conformance.adapter.protocol import AdapterProtocol, is_protocol
from kvspec.conformance.families.chunks.protocol import (
    ChunksProtocol,
)
from kvspec.conformance.families.descriptors.protocol import (
    DescriptorsProtocol,
)
from kvspec.conformance.families.groups.protocol import (
    BlockSizesProtocol,
    GroupBytesProtocol,
    HybridBlockSizeProtocol,
    StateLayoutProtocol,
    StateOwnershipProtocol,
    StateReadsProtocol,
    StateRunsProtocol,
)
from kvspec.conformance.families.layouts.protocol import (
    ConversionProtocol,
    DetectionProtocol,
    FieldsProtocol,
    LayoutsProtocol,
    RecordRowsProtocol,
)
from kvspec.conformance.families.lifecycle.protocol import (
    LifecycleProtocol,
)
from kvspec.conformance.families.models.protocol import (
    AgreementProtocol,
    ModelsProtocol,
)
from kvspec.conformance.families.naming.protocol import (
    DpPortsProtocol,
    EdgeKeysProtocol,
    KeysProtocol,
    PortsProtocol,
)
from kvspec.conformance.families.oracle.protocol import (
    OracleProtocol,
    RecordOracleProtocol,
    StateOracleProtocol,
    VerifierProtocol,
)
from kvspec.conformance.families.ownership.protocol import (
    OwnershipProtocol,
    PartitionsProtocol,
    SizesProtocol,
    TokensProtocol,
)
from kvspec.conformance.families.paged.protocol import (
    PagedProtocol,
)
from kvspec.conformance.families.payloads.protocol import (
    PayloadProtocol,
)
from kvspec.conformance.families.routing.protocol import (
    RoutingProtocol,
    TopologyProtocol,
)
from kvspec.conformance.families.streaming.protocol import (
    StreamingProtocol,
)
from kvspec.conformance.families.transfer.protocol import (
    MarkerProtocol,
    ReceiverProtocol,
    SenderProtocol,
)
from kvspec.conformance.families.wire.protocol import (
    WireProtocol,
)


class EveryProtocol(
    OwnershipProtocol,
    TokensProtocol,
    SizesProtocol,
    PartitionsProtocol,
    ModelsProtocol,
    AgreementProtocol,
    RoutingProtocol,
    TopologyProtocol,
    SenderProtocol,
    ReceiverProtocol,
    MarkerProtocol,
    LayoutsProtocol,
    ConversionProtocol,
    FieldsProtocol,
    DetectionProtocol,
    RecordRowsProtocol,
    PagedProtocol,
    DescriptorsProtocol,
    OracleProtocol,
    VerifierProtocol,
    RecordOracleProtocol,
    StateOracleProtocol,
    StateOwnershipProtocol,
    StateReadsProtocol,
    GroupBytesProtocol,
    BlockSizesProtocol,
    HybridBlockSizeProtocol,
    StateLayoutProtocol,
    StateRunsProtocol,
    KeysProtocol,
    EdgeKeysProtocol,
    PortsProtocol,
    DpPortsProtocol,
    PayloadProtocol,
    ChunksProtocol,
    StreamingProtocol,
    WireProtocol,
    LifecycleProtocol,
):
    """The union of every capability protocol, in the families' order: what
    :class:`~kvspec.conformance.adapter.base.FullAdapter` implements."""


PROTOCOLS: tuple[type[AdapterProtocol], ...] = tuple(
    c for c in EveryProtocol.__mro__ if isinstance(c, type) and is_protocol(c)
)
"""Every capability protocol, family by family (the order reports and pages list them in)."""

CAPABILITIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {p.capability: p.methods for p in PROTOCOLS}
)
"""Capability name -> the adapter methods it consists of (read off :data:`PROTOCOLS`)."""

VALIDATORS: Mapping[str, str] = MappingProxyType(
    {m: p.capability for p in PROTOCOLS for m in p.methods if m.startswith("validate_")}
)
"""Each refusal method (``validate_*``) and its capability."""


def protocol_for(capability: str) -> type[AdapterProtocol]:
    """The protocol of ``capability``; a name no protocol owns is refused with the known ones."""
    for protocol in PROTOCOLS:
        if protocol.capability == capability:
            return protocol
    raise KeyError(
        f"no protocol owns the capability {capability!r}; known: {', '.join(CAPABILITIES)}"
    )
