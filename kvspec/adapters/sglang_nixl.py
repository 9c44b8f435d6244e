"""SGLang's NIXL sender, through kvspec: ``kvspec conform sglang-nixl``.

Checks the installed ``sglang`` package (field/requirements/sglang.txt; sglang 0.5.23),
nothing copied. What it reaches, in ``sglang/srt/disaggregation/nixl/conn.py``:

- ``NixlKVManager._prepare_payload_xfer``: the prepared descriptor lists a prefill rank
  builds once per decode peer, by its own arithmetic: ``_init_equal_tp_prep_handle`` /
  ``_prep_equal_tp_dlist`` (MLA and equal attention TP: one strided run of page slots
  per buffer, ``_build_transfer_dst_indices`` pairing the layers) and
  ``_init_hetero_tp_prep_handle`` (other TP pairs: ``bytes_per_head_slice``, the head
  groups interleaved per token, ``dst_head_offset``, its own tiling asserts);
- ``NixlKVManager.send_kvcache`` (``repeat_indices_over_layers``) and
  ``send_kvcache_slice`` (``expand_page_indices_for_slice``): which entries of those
  lists one request's pages write;

each run on a ``NixlKVManager`` built bare (``object.__new__``: no NIXL agent, no UCX, no
threads, no GPU) holding only the attributes they read, with kvspec's registered caches
as stand-in buffer addresses and the decode's registration as a plain
``KVArgsRegisterInfo``-shaped record. Its ``agent`` is a :class:`RecordingAgent`
standing in for ``nixl_agent``: ``prep_xfer_dlist`` refuses, as NIXL does, a list with a
descriptor outside the memory registered for the side it names (each side's
``kv_data_ptrs`` with their ``kv_data_lens``), and keeps each list's descriptors
(strided ``(addr, len, dev, stride, count)`` runs expanded); ``make_prepped_xfer``
resolves the index lists into ``(src address, dst address, length)`` copies, refusing
index lists of unequal length or pairs of unequal length as NIXL does; DESC-1 judges them
by the bytes they write.

Not reached: the non-prepped path (state caches through ``maybe_send_extra``), mixed
memory kinds (``send_kvcache_mixed``), DCP relayout, the staging path, notifications.
Routing, the receiver's combine, the refusals and the start-up checks are the ``sglang``
adapter's (common/conn.py), which this class extends.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from kvspec.adapters._engine import import_engine
from kvspec.adapters._sglang_backend import AddressPlan, SglangBackendAdapter, sends_slices
from kvspec.adapters._vllm import parameters
from kvspec.adapters.sglang import INSTALL
from kvspec.topology.case import TransferCase

NAME = "sglang-nixl"
MODULE = "sglang.srt.disaggregation.nixl.conn"
MEM_KIND = "VRAM"
"""The memory kind both sides register, as on GPUs (SGLang refuses heterogeneous TP into host
memory; the kind changes only the device id each descriptor carries)."""


def expand_descs(descs: Any) -> list[tuple[int, int]]:
    """``(address, length)`` of every descriptor of a list handed to ``prep_xfer_dlist``:
    ``N x 5`` strided runs ``(addr, len, dev, stride, count)`` or ``N x 3`` descriptors
    ``(addr, len, dev)``."""
    rows = np.asarray(descs, dtype=np.uint64).tolist()
    out: list[tuple[int, int]] = []
    for row in rows:
        if len(row) == 5:
            addr, length, _, stride, count = row
            out.extend((addr + i * stride, length) for i in range(count))
        elif len(row) == 3:
            out.append((row[0], row[1]))
        else:
            raise ValueError(f"a NIXL descriptor has 3 or 5 fields, got {row}")
    return out


class NixlNotFound(ValueError):
    """What NIXL's ``prep_xfer_dlist`` raises (``NIXL_ERR_NOT_FOUND``) for a descriptor
    that lies in no memory region registered for the side it names; a refusal: nothing is
    written, the request fails in the prefill's bootstrap thread (sgl-project/sglang#31968)."""


Regions = list[tuple[int, int]]
"""``(address, length)`` of each registered memory region of one agent."""


class RecordingAgent:
    """Stands in for ``nixl_agent``: checks and keeps the prepared lists, turns each
    prepped WRITE into ``(src address, dst address, length)`` copies, reports every
    transfer done.

    ``prep_xfer_dlist`` behaves as NIXL's does where a sender can get it wrong: every
    descriptor of the list must lie inside one memory region registered for the agent
    it names (``""`` or ``"NIXL_INIT_AGENT"``: this agent's own ``register_memory``;
    another name: the regions in that peer's metadata, loaded by ``add_remote_agent``),
    else NIXL finds no backend that can handle all elements and refuses the list
    (NIXL Python API, ``prep_xfer_dlist``: "Preparation succeeds if at least one backend
    can handle all elements in the descriptor list", ai-dynamo/nixl docs; the
    ``NIXL_ERR_NOT_FOUND`` of sgl-project/sglang#31968) [DESC-2]. ``local`` and
    ``remote`` are what each side registered: SGLang's ``register_buffer_to_engine``
    registers each ``kv_data_ptrs[i]`` with ``kv_data_lens[i]`` bytes, on both sides."""

    LOCAL = ("", "NIXL_INIT_AGENT")

    def __init__(self, local: Regions, remote: dict[str, Regions]) -> None:
        self.local = list(local)
        self.remote = dict(remote)
        self.lists: list[list[tuple[int, int]]] = []
        self.copies: list[tuple[int, int, int]] = []

    def get_xfer_descs(self, descs: Any, mem_kind: str) -> Any:
        return descs

    def registered(self, agent_name: str) -> Regions:
        """The regions registered for ``agent_name``; a peer whose metadata was never
        loaded is refused, as NIXL refuses it."""
        if agent_name in self.LOCAL:
            return self.local
        if agent_name not in self.remote:
            raise NixlNotFound(f"prep_xfer_dlist: no metadata loaded for agent {agent_name!r}")
        return self.remote[agent_name]

    def prep_xfer_dlist(self, agent_name: str, descs: Any, mem_kind: str) -> int:
        regions = self.registered(agent_name)
        expanded = expand_descs(descs)
        for index, (addr, length) in enumerate(expanded):
            if not any(base <= addr and addr + length <= base + size for base, size in regions):
                side = "local" if agent_name in self.LOCAL else f"agent {agent_name!r}'s"
                raise NixlNotFound(
                    f"prep_xfer_dlist: descriptor {index} ({length} bytes at {addr:#x}) lies "
                    f"in no {side} registered memory region "
                    f"({', '.join(f'{b:#x}+{n}' for b, n in regions)}) [DESC-2]"
                )
        self.lists.append(expanded)
        return len(self.lists) - 1

    def make_prepped_xfer(
        self, op: str, src: int, src_indices: Any, dst: int, dst_indices: Any, *notif: Any
    ) -> tuple[str, int]:
        src_list, dst_list = self.lists[src], self.lists[dst]
        src_idx, dst_idx = list(map(int, src_indices)), list(map(int, dst_indices))
        if len(src_idx) != len(dst_idx):
            raise ValueError(
                f"make_prepped_xfer: {len(src_idx)} source and {len(dst_idx)} destination indices"
            )
        for i, j in zip(src_idx, dst_idx, strict=True):
            if not (0 <= i < len(src_list) and 0 <= j < len(dst_list)):
                raise ValueError(
                    f"make_prepped_xfer: index pair ({i}, {j}) outside prepared lists of "
                    f"{len(src_list)} and {len(dst_list)} descriptors"
                )
            (sa, sn), (da, dn) = src_list[i], dst_list[j]
            if sn != dn:
                raise ValueError(
                    f"make_prepped_xfer: descriptor lengths differ, {sn} bytes at {sa:#x} "
                    f"and {dn} bytes at {da:#x}"
                )
            self.copies.append((sa, da, sn))
        return (op, len(self.copies))

    def transfer(self, handle: Any) -> str:
        return "PROC"

    def check_xfer_state(self, handle: Any) -> str:
        return "DONE"


class SglangNixlAdapter(SglangBackendAdapter):
    """SGLang's NIXL sender (``sglang-nixl``); see the module docstring."""

    name = NAME

    def __init__(self) -> None:
        super().__init__()
        self.nixl = import_engine(MODULE, adapter=NAME, install=INSTALL)
        self.version = f"{self.version} (nixl/conn.py)"

    def _manager_class(self) -> Any:
        return self.nixl.NixlKVManager

    def _source_slots(self, args: Any) -> int:
        """The prefill's slot count, as ``NixlKVManager.__init__`` sets it: the module's
        ``num_kv_slots`` (the shortest buffer), or, in releases without it (0.5.16 and
        older), ``kv_data_lens[0] // kv_item_lens[0]`` as their ``__init__`` computes it."""
        slots = getattr(self.nixl, "num_kv_slots", None)
        if slots is None:
            return int(args.kv_data_lens[0] // args.kv_item_lens[0])
        return int(slots(args.kv_data_lens, args.kv_item_lens))

    def _peer(self, case: TransferCase, dst: int, target: AddressPlan) -> Any:
        """The decode rank's registration as the prefill reads it (``KVArgsRegisterInfo``'s
        fields the prepared lists use)."""
        return SimpleNamespace(
            agent_name=f"decode-rank-{dst}",
            gpu_id=0,
            dst_kv_ptrs=target.ptrs,
            dst_kv_item_lens=target.item_lens,
            dst_kv_item_len=target.item_lens[0],
            dst_kv_mem_kinds=[MEM_KIND] * len(target.ptrs),
            dst_kv_layer_ids=None,
            dst_num_slots=target.cache.num_blocks,
            decode_tp_size=case.target.tp,
            decode_tp_rank=dst % case.target.tp,
            requires_dcp_relayout=False,
            kv_xfer_segments=None,
            dst_homogeneous_mem_kind=None,
        )

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
        peer = self._peer(case, dst, target)
        agent = RecordingAgent(
            list(zip(source.ptrs, source.data_lens, strict=True)),
            {peer.agent_name: list(zip(target.ptrs, target.data_lens, strict=True))},
        )
        manager.agent = agent
        manager.src_mem_kind = MEM_KIND
        manager.kv_args.kv_data_mem_kinds = [MEM_KIND] * len(source.ptrs)
        manager._num_slots_src = self._source_slots(manager.kv_args)
        manager._use_strided_descs = True
        manager.prep_handles = {}
        manager.prep_handle_slice_src = None
        manager.prep_handles_slice_dst = {}
        manager.prep_handles_segment_src = {}
        manager.decode_kv_args_table = {peer.agent_name: peer}
        manager._prepare_payload_xfer(peer)
        # Releases 0.5.16 and older pass the room's notification to each send.
        if sends_slices(case):
            send = manager.send_kvcache_slice
            notif = {"notif": "room"} if "notif" in parameters(send) else {}
            send(peer.agent_name, source_pages, target_pages, **notif)
        else:
            send = manager.send_kvcache
            notif = {"notif": "room"} if "notif" in parameters(send) else {}
            send(
                peer.agent_name,
                source_pages,
                peer.dst_kv_ptrs,
                target_pages,
                peer.gpu_id,
                dst_mem_kind=peer.dst_homogeneous_mem_kind or MEM_KIND,
                **notif,
            )
        return agent.copies
