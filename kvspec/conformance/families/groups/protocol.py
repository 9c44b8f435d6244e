"""The groups family's adapter protocols: ``state-ownership``, ``state-reads``, ``group-bytes``,
``block-sizes``, ``hybrid-block-size``, ``state-layout``, ``state-runs``.

Each is a mixin an adapter subclasses beside :class:`~kvspec.conformance.adapter.Adapter`
to say it implements that capability, overriding every one of its methods; the suite
finds it by type. It imports no other family."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvspec.conformance.adapter.contract import NotProvided
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


class StateOwnershipProtocol(AdapterProtocol, capability="state-ownership"):
    """The units of a state group each rank holds [STATE-1]."""

    def state_units(
        self, layout: StageLayout, model: ModelShape, group: int, rank: int
    ) -> Mapping[str, range]:
        """Each part's units of state group ``group`` that stage-local ``rank`` holds, by
        part name (``x``, ``B``, ``C``, ``ssm``; ``Q``, ``K``, ``V``; ``conv``) [STATE-1]."""
        raise NotProvided


class StateReadsProtocol(AdapterProtocol, capability="state-reads"):
    """The reads that fill a receiver's recurrent state [STATE-2]."""

    def state_reads(
        self, case: TransferCase, group: int, dst: int
    ) -> Sequence[tuple[int, int, int, int, int]]:
        """The reads that fill receiver ``dst``'s state of group ``group``: each ``(src, layer,
        src offset, dst offset, length)`` in elements of one rank's state layer (its parts in
        order, each unit contiguous) [STATE-2]."""
        raise NotProvided


class GroupBytesProtocol(AdapterProtocol, capability="group-bytes"):
    """The bytes each edge moves of each layer group [GROUP-3, WINDOW-1]."""

    def group_bytes(
        self, case: TransferCase, seq_len: int, block_size: int
    ) -> Mapping[tuple[int, int, int], int]:
        """Bytes each edge moves of each layer group for a ``seq_len``-token request, keyed
        ``(group, src, dst)``; sliding windows aligned to ``block_size`` [GROUP-3, WINDOW-1]."""
        raise NotProvided


class BlockSizesProtocol(AdapterProtocol, capability="block-sizes"):
    """The sliding-window tokens each edge carries under two block sizes [WINDOW-2]."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Mapping[tuple[int, int, int], Sequence[tuple[int, int]]]:
        """The tokens each edge of each sliding-window or chunked group carries, keyed
        ``(group, src, dst)``, as ``[start, stop)`` ranges, when the sender's blocks hold
        ``source_block_size`` tokens and the receiver's ``target_block_size``; raise
        (``ValueError``) to refuse a plan whose receiver needs tokens the sender has
        evicted [WINDOW-2]."""
        raise NotProvided


class HybridBlockSizeProtocol(AdapterProtocol, capability="hybrid-block-size"):
    """The attention block size of a hybrid model [BLOCK-1]."""

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        """The attention block size a stage of attention TP ``attn_tp`` uses for ``model``,
        ``block_size`` the user's (None: not given) [BLOCK-1]."""
        raise NotProvided


class StateLayoutProtocol(AdapterProtocol, capability="state-layout"):
    """Where a state element lives in a state layer's buffer [SLAYOUT-1]."""

    def state_offset(
        self,
        layout: str,
        model: ModelShape,
        group: int,
        *,
        attn_tp: int,
        attn_tp_rank: int,
        page_size: int | None,
        block: int,
        part: str,
        unit: int,
        element: int,
    ) -> int:
        """Byte offset, in one state layer's buffer under state layout ``layout``
        (``vllm_conv_sd``, ``vllm_conv_ds``), of element ``element`` of global unit ``unit``
        of part ``part`` in block ``block``, as attention-TP rank ``attn_tp_rank`` of
        ``attn_tp`` keeps it; ``page_size`` None is the state's own bytes [SLAYOUT-1]. Raise
        for an unknown layout, a page that cannot hold the state aligned, a unit the rank
        does not hold or an element outside its unit."""
        raise NotProvided


class StateRunsProtocol(AdapterProtocol, capability="state-runs"):
    """The byte runs of a state part in a block [SLAYOUT-2]."""

    def state_runs(
        self,
        layout: str,
        model: ModelShape,
        group: int,
        *,
        attn_tp: int,
        attn_tp_rank: int,
        page_size: int | None,
        block: int,
        part: str,
        units: range,
    ) -> Sequence[tuple[int, int]]:
        """The bytes holding ``units`` of ``part`` in block ``block``, as ``(offset, nbytes)``
        runs in address order, adjacent runs merged [SLAYOUT-2]."""
        raise NotProvided
