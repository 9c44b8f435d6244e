"""The ownership family's adapter protocols: ``ownership``, ``tokens``, ``sizes``, ``partitions``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


class OwnershipProtocol(AdapterProtocol, capability="ownership"):
    """The heads and layers each rank of a stage holds [STAGE-1, STAGE-2, HEAD-1..3, LAYER-1..2]."""

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        """(heads, layers) stage-local ``rank`` holds [STAGE-1, STAGE-2, HEAD-1..3,
        LAYER-1..2]."""
        raise NotProvided


class TokensProtocol(AdapterProtocol, capability="tokens"):
    """The tokens of a request each context-parallel rank holds [CP-1, CP-3]."""

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        """The tokens of a ``seq_len``-token request stage-local ``rank`` holds, as ascending
        ranges of global token positions [CP-1, CP-3]; every token without token shards."""
        raise NotProvided


class SizesProtocol(AdapterProtocol, capability="sizes", older={"validate_sizes": ("validate",)}):
    """Refusing parallel sizes and ranks, where the engine creates its process groups [STAGE-1]."""

    def validate_sizes(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these parallel sizes: TP and PP of at least
        1, a rank inside its stage [STAGE-1]."""
        raise NotProvided


class PartitionsProtocol(
    AdapterProtocol, capability="partitions", older={"validate_partition": ("validate",)}
):
    """Refusing pipeline layer partitions, in the engine's pipeline set-up [LAYER-1, LAYER-2]."""

    def validate_partition(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these pipeline layer partitions
        [LAYER-1, LAYER-2]."""
        raise NotProvided
