"""The models family's adapter protocols: ``models``, ``agreement``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.transfer_config import TransferConfig


class ModelsProtocol(AdapterProtocol, capability="models", older={"validate_model": ("validate",)}):
    """Refusing model facts, where the model loads and its attention layers are built [MODEL-1,
    MODEL-2, DTYPE-1, HEAD-1, HEAD-2]."""

    def validate_model(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these model facts, its head count over
        either side's TP included [MODEL-1, MODEL-2, DTYPE-1, HEAD-1, HEAD-2]."""
        raise NotProvided


class AgreementProtocol(
    AdapterProtocol, capability="agreement", older={"validate_agreement": ("validate",)}
):
    """Refusing a receiver whose model facts differ from the sender's, in a handshake [MODEL-3]."""

    def validate_agreement(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses a receiver whose model facts
        (``target_model``) differ from the sender's (``model``) [MODEL-3]."""
        raise NotProvided
