"""SGLang's Mooncake sender, through kvspec: ``kvspec conform sglang-mooncake``.

Checks the installed ``sglang`` package (field/requirements/sglang.txt; sglang 0.5.23),
nothing copied. What it reaches, in ``sglang/srt/disaggregation/mooncake/conn.py``:

- ``MooncakeKVManager.send_kvcache`` and its ``_send_kvcache_generic`` (MLA and equal
  attention-TP pairs: whole pages of every layer, the layers paired by
  ``get_mha_kv_ptrs_with_pp`` / ``get_mla_kv_ptrs_with_pp``, runs of contiguous pages
  grouped by ``group_concurrent_contiguous``, ``src_ptr + page * item_len``);
- ``MooncakeKVManager.send_kvcache_slice`` (other TP pairs: its own head-slice byte
  arithmetic, ``bytes_per_head_slice_to_send = dst_kv_item_len // page_size //
  dst_heads_per_rank``, the per-token slot offsets, the slice-fits check);

each run on a ``MooncakeKVManager`` built bare (``object.__new__``: no Mooncake
transfer engine, no bootstrap or worker threads, no GPU) holding only the attributes the
sender reads, with kvspec's registered caches as stand-in buffer addresses
(``_sglang_backend.AddressPlan``). Its ``engine`` is a :class:`RecordingEngine`
standing in for Mooncake's ``TransferEngine``: it records every ``(src address, dst
address, length)`` that ``batch_transfer_sync`` is handed and reports success; the
adapter turns them into kvspec descriptors, which DESC-1 judges by the bytes they write.

Which sender runs is ``transfer_worker``'s choice, stated in
:func:`~kvspec.adapters._sglang_backend.sends_slices` (MLA or
equal attention TP: ``send_kvcache``; otherwise ``send_kvcache_slice``); the staging
path (``SGLANG_DISAGG_STAGING_BUFFER``), DCP relayout, HiSparse device indices, the
state caches (``maybe_send_extra``) and the custom memory pool's per-layer threads are
not reached. Routing, the receiver's combine, the refusals and the start-up checks are
the ``sglang`` adapter's (common/conn.py), which this class extends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvspec.adapters._engine import import_engine
from kvspec.adapters._sglang_backend import (
    AddressPlan,
    InlineExecutor,
    SglangBackendAdapter,
    plain_memory,
    sends_slices,
)
from kvspec.adapters.sglang import INSTALL
from kvspec.topology.case import TransferCase

NAME = "sglang-mooncake"
MODULE = "sglang.srt.disaggregation.mooncake.conn"


class RecordingEngine:
    """Stands in for Mooncake's ``TransferEngine``: records what the sender hands
    ``batch_transfer_sync`` (one session, lists of source addresses, destination
    addresses and lengths) and returns 0, Mooncake's success."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, int, int]] = []
        self.sessions: list[str] = []

    def batch_transfer_sync(
        self, session_id: str, src: list[int], dst: list[int], lengths: list[int]
    ) -> int:
        if not len(src) == len(dst) == len(lengths):
            raise ValueError(
                f"batch_transfer_sync got {len(src)} sources, {len(dst)} destinations and "
                f"{len(lengths)} lengths"
            )
        self.sessions.append(session_id)
        self.copies.extend(zip(map(int, src), map(int, dst), map(int, lengths), strict=True))
        return 0


class SglangMooncakeAdapter(SglangBackendAdapter):
    """SGLang's Mooncake sender (``sglang-mooncake``); see the module docstring."""

    name = NAME

    def __init__(self) -> None:
        super().__init__()
        self.mooncake = import_engine(MODULE, adapter=NAME, install=INSTALL)
        self.version = f"{self.version} (mooncake/conn.py)"

    def _manager_class(self) -> Any:
        return self.mooncake.MooncakeKVManager

    def _sender_copies(
        self,
        case: TransferCase,
        src: int,
        dst: int,
        source: AddressPlan,
        source_pages: np.ndarray,
        target: AddressPlan,
        target_pages: np.ndarray,
    ) -> list[tuple[int, int, int]]:
        manager = self._bare_manager(case, src, source)
        engine = RecordingEngine()
        manager.engine = engine
        manager.enable_custom_mem_pool = False
        manager.custom_mem_pool_type = None
        manager.max_transfer_batch_indices = 0
        manager.state_strides_validated = set()
        manager.enable_deferred_decode_kv_release = False
        session = f"decode-rank-{dst}"
        with plain_memory(self.mooncake):
            status = self._send(case, dst, manager, session, (source_pages, target, target_pages))
        if status != 0:
            # transfer_worker records the failure for the room: the request fails.
            raise self.conn.KVTransferError(
                0, f"prefill rank {src}'s Mooncake sender returned {status} for decode rank {dst}"
            )
        return engine.copies

    def _send(
        self, case: TransferCase, dst: int, manager: Any, session: str, request: tuple[Any, ...]
    ) -> int:
        """The sender ``transfer_worker`` picks for this pair (:func:`sends_slices`)."""
        source_pages, target, target_pages = request
        if sends_slices(case):
            return manager.send_kvcache_slice(
                session,
                source_pages,
                target.ptrs,
                target_pages,
                dst % case.target.tp,
                case.target.tp,
                target.item_lens[0],
                InlineExecutor(),
            )
        return manager.send_kvcache(
            session,
            source_pages,
            target.ptrs,
            target_pages,
            InlineExecutor(),
            dst_kv_item_len=target.item_lens[0],
            dst_attn_tp_size=case.target.tp,
        )
