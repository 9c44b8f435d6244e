"""What the SGLang transfer-backend adapters share (``sglang-mooncake``, ``sglang-nixl``).

Each backend's KV manager restates the page, head and layer byte arithmetic in its own
sender; these adapters build that manager bare (no ``__init__``: no transfer engine, no
threads, no GPU), give it kvspec's registered caches as stand-in addresses, and record
what its sender hands the transfer library. This module holds the parts that do not
depend on the backend: the address plan (region ``i`` of a rank at ``(i + 1) * BASE``,
in SGLang's pointer order), a page index list for a token range, turning recorded
``(src address, dst address, length)`` copies into kvspec
:class:`~kvspec.memory.descriptors.Descriptor`\\ s, and the adapter base class over the
``sglang`` adapter's routing and start-up checks.

Routing, the receiver's combine and the refusals are the ``sglang`` adapter's (common
conn.py's rank mapping, ``compute_head_slice_params``, ``get_pp_indices``); what a backend
adapter adds is :meth:`SglangBackendAdapter.descriptors`: the byte ranges the backend's
own sender posts for one edge, judged by DESC-1 by their effect.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvspec.adapters.sglang import DOMAIN, SglangAdapter
from kvspec.conformance.adapter import NotProvided
from kvspec.conformance.adapter.protocols import DescriptorsProtocol
from kvspec.conformance.domain import Domain
from kvspec.memory.descriptors import Descriptor, RegisteredCache
from kvspec.tensors.dtypes import DTYPES
from kvspec.topology.case import TransferCase

BASE = 1 << 40
"""Region ``i`` of a rank (in SGLang's pointer order) is given the address
``(i + 1) * BASE``, so an address the engine computes names its region and offset."""

BACKEND_DOMAIN = dataclasses.replace(
    DOMAIN,
    layouts=("sglang_mha", "sglang_mla"),
    block_sizes=(1,),
)
"""The ``sglang`` adapter's domain [PLAN-1] on SGLang's own token pools (per layer a K
and a V buffer, or one latent buffer, row = token slot), with page size 1 for the
descriptor checks: SGLang's senders copy whole pages and a request's pages start at a
page boundary in serving, while DESC-1 judges slot by slot; at one token a page the two
agree, and the offsets scale with the page size and do not otherwise depend on it."""


def sends_slices(case: TransferCase) -> bool:
    """Each backend's ``transfer_worker`` choice of sender: whole pages
    (``send_kvcache``) for an MLA backend or equal attention-TP sizes, head slices
    (``send_kvcache_slice``) otherwise (mooncake/conn.py, nixl/conn.py)."""
    return case.model.attention != "mla" and case.source.tp != case.target.tp


def pointer_regions(cache: RegisteredCache) -> list[str]:
    """The cache's regions in SGLang's ``kv_data_ptrs`` order: ``[K of each layer...,
    V of each layer...]`` for an MHA token pool, one latent per layer for MLA
    (``MHATokenToKVPool.get_contiguous_buf_infos``, ``MLATokenToKVPool``)."""
    names = list(cache.regions())
    if cache.layout.name == "sglang_mha":
        return [f"L{i}.K" for i in range(cache.num_layers)] + [
            f"L{i}.V" for i in range(cache.num_layers)
        ]
    if cache.layout.name == "sglang_mla":
        return names
    raise ValueError(
        f"SGLang's senders address its own token pools (sglang_mha, sglang_mla); a "
        f"{cache.layout.name} cache is not one [DESC-1]"
    )


@dataclasses.dataclass(frozen=True)
class AddressPlan:
    """One rank's registered buffers as SGLang's ``KVArgs`` lists them."""

    cache: RegisteredCache
    names: tuple[str, ...]

    @classmethod
    def of(cls, cache: RegisteredCache) -> AddressPlan:
        return cls(cache, tuple(pointer_regions(cache)))

    @property
    def ptrs(self) -> list[int]:
        return [(i + 1) * BASE for i in range(len(self.names))]

    @property
    def data_lens(self) -> list[int]:
        """Registered bytes of each buffer (DESC-2 may shorten one)."""
        sizes = self.cache.regions()
        return [sizes[n] for n in self.names]

    @property
    def item_lens(self) -> list[int]:
        """Bytes of one page of each buffer (``kv_item_lens``): the tensor's bytes over
        its pages, whatever was registered."""
        page = self.cache.tensor_bytes() // self.cache.num_blocks
        return [page] * len(self.names)

    def locate(self, address: int) -> tuple[str, int]:
        """(region, offset) of an address; an address in no buffer is refused."""
        index, offset = divmod(int(address), BASE)
        if not 1 <= index <= len(self.names):
            raise RuntimeError(f"address {address:#x} lies in no registered buffer")
        return self.names[index - 1], offset


def page_indices(ids: Sequence[int], tokens: range, page_size: int) -> np.ndarray:
    """The pages holding ``tokens`` of a request whose pages are ``ids`` (page ``k`` of
    the request holds tokens ``k * page_size ...``), as SGLang's int32 index arrays."""
    first, last = tokens.start // page_size, (tokens.stop - 1) // page_size
    return np.asarray(list(ids)[first : last + 1], dtype=np.int32)


def descriptors_of(
    copies: Sequence[tuple[int, int, int]], source: AddressPlan, target: AddressPlan
) -> list[Descriptor]:
    """Recorded ``(src address, dst address, length)`` copies as kvspec descriptors, each
    refused if it runs past its buffer's registered bytes (the transfer library finds no
    registered memory there) [DESC-2]."""
    out = []
    for src, dst, length in copies:
        (sr, so), (dr, do) = source.locate(src), target.locate(dst)
        for plan, region, offset in ((source, sr, so), (target, dr, do)):
            size = plan.cache.regions()[region]
            if offset + int(length) > size:
                raise ValueError(
                    f"a write of {int(length)} bytes at offset {offset} of region {region!r} "
                    f"runs past its {size} registered bytes: the transfer library refuses "
                    "memory nobody registered"
                )
        out.append(Descriptor(sr, so, dr, do, int(length)))
    return out


class InlineExecutor(concurrent.futures.Executor):
    """An executor that runs each task at once, in the caller's thread: a sender's
    per-layer futures complete in order, recording stays deterministic."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:
            future.set_exception(error)
        return future


def kv_args(case: TransferCase, rank: int, plan: AddressPlan, start_layer: int) -> Any:
    """The ``KVArgs`` fields a sender reads, for prefill stage-local ``rank``."""
    tp = case.source.tp
    heads = 1 if case.model.attention == "mla" else max(1, case.model.num_kv_heads // tp)
    return SimpleNamespace(
        kv_data_ptrs=plan.ptrs,
        kv_data_lens=plan.data_lens,
        kv_item_lens=plan.item_lens,
        kv_layer_ids=None,
        page_size=plan.cache.block_size,
        kv_head_num=heads,
        total_kv_head_num=case.model.num_kv_heads,
        engine_rank=rank % tp,
        prefill_start_layer=start_layer,
        prefill_end_layer=start_layer + plan.cache.num_layers,
        num_draft_entries=0,
        mla_compression_ratios=None,
        gpu_id=0,
        kv_data_mem_kinds=None,
    )


@contextmanager
def plain_memory(module: Any) -> Iterator[None]:
    """``module.get_memory()`` answering a deployment without ``--enable-unified-memory``
    while the block runs. The senders read that server argument from the runtime
    context SGLang publishes at start-up (sglang/srt/runtime_context.py), which a bare
    manager has none of; a shim for every release that reads it so (0.5.23)."""
    real = getattr(module, "get_memory", None)
    if real is None:
        yield
        return
    module.get_memory = lambda: SimpleNamespace(enable_unified_memory=False)
    try:
        yield
    finally:
        module.get_memory = real


def head_bytes(case: TransferCase) -> int:
    """Bytes of one head of one token (one row of one layer's K)."""
    return case.model.head_dim * DTYPES[case.model.dtype].itemsize


class SglangBackendAdapter(SglangAdapter, DescriptorsProtocol):
    """The ``sglang`` adapter's routing, combine and refusals, with a backend's own
    sender behind :meth:`descriptors`; subclasses give :meth:`_sender_copies`."""

    domain: Domain = BACKEND_DOMAIN
    backend_module: str = ""

    def _manager_class(self) -> Any:
        raise NotProvided

    def _bare_manager(self, case: TransferCase, src: int, plan: AddressPlan) -> Any:
        """A manager of the backend's class with only what its sender reads."""
        manager = object.__new__(self._manager_class())
        pp_rank = src // case.source.tp
        start = self._layers(case.source, case.model.num_layers, pp_rank)[0]
        manager.kv_args = kv_args(case, src, plan, start)
        manager.attn_tp_size = case.source.tp
        manager.pp_size = case.source.pp
        manager.is_mla_backend = case.model.attention == "mla"
        manager.is_hybrid_mla_backend = False
        return manager

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
        raise NotProvided

    def descriptors(
        self,
        case: TransferCase,
        src: int,
        dst: int,
        source: RegisteredCache,
        source_ids: list[int],
        target: RegisteredCache,
        target_ids: list[int],
        tokens: range,
    ) -> Sequence[Any]:
        """The byte ranges the backend's own sender posts for edge ``src`` -> ``dst``:
        the pages holding ``tokens`` on each side, as ``transfer_worker`` hands them to
        the sender, over kvspec's registered caches."""
        if dst not in self.targets(case, src):
            raise ValueError(
                f"prefill rank {src} does not write decode rank {dst}: the decode registers "
                f"only with prefill ranks {list(self.sources(case, dst))} [PLAN-3]"
            )
        plans = AddressPlan.of(source), AddressPlan.of(target)
        pages = (
            page_indices(source_ids, tokens, source.block_size),
            page_indices(target_ids, tokens, target.block_size),
        )
        copies = self._sender_copies(case, src, dst, plans[0], pages[0], plans[1], pages[1])
        return descriptors_of(copies, *plans)
