"""A rank's memory: its paged cache and block tables, filled from the oracle on stage 0,
the host buffers a request passes through, the staging to and from a device, and the
oracle's verdict on what the cache holds.

Every rule comes from :mod:`kvspec` (paged layouts, records, the oracle); this module
only owns the memory. It knows nothing of sockets: where it must wait for a staging slot
it calls ``wait``, which the rank's loop gives it (serve the sockets for a moment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, overload

import torch

from kvspec.memory.paged import (
    PagedCache,
    empty_model_cache,
    gather_request,
    scatter_request,
)
from kvspec.memory.records import (
    FieldVerdict,
    gather_fields,
    gather_rows,
    record_fill,
    scatter_fields,
    scatter_rows,
    verify_fields,
)
from kvspec.tensors.dtypes import torch_dtype
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import Verdict, oracle_kv, oracle_scales, verify
from kvspec.topology.ownership import RankOwnership, rank_ownership
from kvspec.transport.payload import Layers, Payload
from sim.cache.groups import GroupMemory, GroupVerdict
from sim.cache.pool import BlockPool
from sim.cache.staging import Slot, StagingRing
from sim.net.endpoints import RankId
from sim.run.config import SimConfig
from sim.run.workload import Request, Workload

STAGING_SLOTS = 4
"""Host staging buffers per rank on a device: messages in flight before a sender waits."""


class RankMemory:
    """The cache of one rank and everything that reads or writes it as memory."""

    def __init__(
        self,
        config: SimConfig,
        who: RankId,
        workload: Workload,
        device: torch.device,
        wait: Callable[[], None],
    ) -> None:
        self.config, self.who, self.workload, self.device = config, who, workload, device
        self.model = config.model
        self.requests = {r.request_id: r for r in workload.requests}
        self.wait = wait  # while a staging slot is in flight: serve the sockets a moment
        self.owner = rank_ownership(config.stages[who.stage], self.model, who.rank)
        self.staging: StagingRing | None = None
        self.copy_stream: Any = None
        self.gather_ring: StagingRing | None = None  # a CPU sender's gathered requests
        self.landing: torch.Tensor | None = None  # a CPU receiver's reused shard buffer
        self.pool: BlockPool | None = None  # a pushed-to receiver's blocks [LIFE-1]
        self.groups: GroupMemory | None = None  # a hybrid's group regions [GROUP-3]
        if config.content == "groups":
            self.groups = GroupMemory(config, who, workload)
        if device.type == "cuda":  # pragma: no cover - needs a GPU
            # Every CUDA call of this rank, allocations included, on its own device; copies
            # to and from host memory on a side stream, through a reusable pinned ring.
            torch.cuda.set_device(device)
            self.staging = StagingRing(STAGING_SLOTS, 0)
            self.copy_stream = torch.cuda.Stream(device)

    # -- what this rank holds -------------------------------------------------------
    def mine(self, request: Request) -> RankOwnership:
        """What this rank holds of ``request``: its tokens, or nothing on another DP group."""
        return self.workload.owner(self.who.stage, self.who.rank, request)

    def held(self, request: Request) -> int:
        """How many of ``request``'s tokens this rank holds [CP-1, DP-1]."""
        return self.workload.held(self.who.stage, self.who.rank, request)

    def region(self, request: Request) -> dict[str, Any]:
        """The oracle region of what this rank holds of ``request`` [ORACLE-4]."""
        mine = self.mine(request)
        tokens = request.seq_len if mine.tokens is None else mine.tokens
        return {"tokens": tokens, "layers": self.owner.layers, "heads": self.owner.heads}

    # -- the cache ------------------------------------------------------------------
    def build(self) -> None:
        """The empty cache and its block tables (a pushed-to receiver's from its pool); of
        a hybrid, its group regions instead [GROUP-3]."""
        if self.groups is not None:
            self.groups.build()
            return
        layout, block_size = self.config.layout_of(self.who.stage)
        num_blocks, tables = self.workload.block_table(self.who.stage, self.who.rank)
        if self.who.stage > 0 and self.config.transfer == "push":
            # A pushed-to receiver allocates from its pool as requests arrive [LIFE-1]; a
            # pull receiver holds the workload's table from the start: its reads name it.
            order = self.workload.block_order(self.who.stage, self.who.rank)
            self.pool = BlockPool(order, unsafe=self.config.unsafe_reuse)
            tables = self.pool.tables
        scales = oracle_scales(
            self.model, layers=self.owner.layers, seed=self.config.seed, device=self.device
        )
        self.cache: PagedCache = empty_model_cache(
            layout,
            self.model,
            num_blocks=num_blocks,
            block_size=block_size,
            layers=len(self.owner.layers),
            heads=len(self.owner.heads),
            scales=scales,
            device=self.device,
        )
        self.tables: dict[str, list[int]] = tables

    def fill_from_oracle(self) -> None:
        """Stage 0: every request's KV, as this rank holds it, from the oracle [ORACLE-4]."""
        if self.groups is not None:
            self.groups.fill_from_oracle()
            return
        for request in self.workload.requests:
            if self.held(request):  # else none of it lives here: another DP group's
                self._fill(request, request.request_id)

    def reuse(self, request: Request) -> None:
        """``--faults reuse``: ``request``'s blocks freed before their transfer is done and
        handed to another request, whose KV now fills them [LIFE-3] — what the oracle
        would put there for a request named ``<id>~reused``, at the same places."""
        self._fill(request, f"{request.request_id}~reused")

    def _fill(self, request: Request, identity: str) -> None:
        """Write the oracle's KV of ``identity`` into ``request``'s blocks, over this rank's
        region of ``request`` [ORACLE-4]: of a record cache, every field [ORACLE-6]."""
        table = self.tables[request.request_id]
        if self.config.records:  # every field of every cell, scales too [ORACLE-6]
            fields = record_fill(
                self.model,
                self.cache.layout,
                identity,
                **self.region(request),
                seed=self.config.seed,
                device=self.device,
            )
            scatter_fields(fields, self.cache, table)
            return
        kv = oracle_kv(
            self.model, identity, **self.region(request), seed=self.config.seed, device=self.device
        )
        scatter_request(kv, self.cache, table)

    def gather(self, request: Request) -> tuple[Any, Slot | None]:
        """``request``'s KV as this rank holds it, token-major, and the gather ring's slot
        holding it (None for fresh memory): a record cache's rows of bytes, inline scales
        included [LAYOUT-7], any other's K and V [PAGED-1]."""
        held, table = self.held(request), self.tables[request.request_id]
        if self.config.records:
            return gather_rows(self.cache, self.model, table, held), None
        out, slot = self._gather_out(held)
        return gather_request(self.cache, table, held, out=out), slot

    def scatter(self, kv: RequestKV, cache: PagedCache, table: list[int]) -> None:
        """Write received KV into the cache: a record cache's rows field by field [LAYOUT-7],
        any other's K and V [PAGED-4]."""
        if self.config.records:
            scatter_rows(kv, cache, self.model, table)
        else:
            scatter_request(kv, cache, table)

    def oracle_verdict(self, request_id: str) -> tuple[Verdict | FieldVerdict | GroupVerdict, int]:
        """Every element this rank holds of ``request_id``, against the oracle: its own
        tokens of the request, on its heads and layers [ORACLE-4, ORACLE-5, CP-1]; of a
        record cache, every byte of every field, inline scales included [ORACLE-6].
        With the verdict, the bytes it compared; of a hybrid, every group region
        [GROUP-3, ORACLE-5]."""
        if self.groups is not None:
            return self.groups.verdict(request_id)
        request = self.requests[request_id]
        if self.config.records:
            fields = gather_fields(self.cache, self.tables[request_id], self.held(request))
            verdict: Verdict | FieldVerdict = verify_fields(
                fields,
                self.model,
                self.cache.layout,
                request_id,
                **self.region(request),
                seed=self.config.seed,
            )
            return verdict, sum(t.numel() * t.element_size() for t in fields.values())
        stored = gather_request(self.cache, self.tables[request_id], self.held(request))
        verdict = verify(
            stored, self.model, request_id, **self.region(request), seed=self.config.seed
        )
        tensors = [stored.data] if stored.scales is None else [stored.data, stored.scales]
        return verdict, sum(t.numel() * t.element_size() for t in tensors)

    # -- host buffers ---------------------------------------------------------------
    def request_bytes(self, tokens: int) -> int:
        """Bytes of ``tokens`` tokens of this rank's cache as token-major KV
        ``[layers, kv, seq, heads, head_dim]`` (:func:`gather_request`'s shape)."""
        shape = self.cache.shape
        itemsize = torch.empty((), dtype=torch_dtype(self.cache.dtype)).element_size()
        return self.cache.num_layers * shape.kv * tokens * shape.heads * shape.head_dim * itemsize

    def reserve_host_buffers(self) -> None:
        """Push on the CPU without faults: the memory a request passes through, allocated
        and touched once before the run, as an engine reuses its buffers — a sender's
        ring of gathered requests whose frames go on the wire zero-copy [WIRE-5], and a
        receiver's landing buffer: its whole shard of the largest request it holds, which
        every sender's payload is copied straight into, its heads in their place
        [PAYLOAD-3] (kvspec falls back to fresh memory where it does not fit: chunks,
        streamed layer groups). Fresh memory per request
        instead faults on first touch, page by page, inside the transfer (profiled:
        the receiver's copy into fresh memory was its slowest step). With faults,
        frames are kept back or sent twice, so requests get their own memory."""
        config = self.config
        if (
            self.device.type != "cpu"
            or config.transfer != "push"
            or config.content != "kv"
            or config.faults.any
        ):
            return
        held = max((self.held(r) for r in self.workload.requests), default=0)
        need = self.request_bytes(held)
        if not need:
            return
        if self.who.stage < config.last_stage:
            self.gather_ring = StagingRing(STAGING_SLOTS, 0, pin=False)
            self.gather_ring.reserve(need)
        if self.who.stage > 0:
            self.landing = torch.zeros(need, dtype=torch.uint8)

    def _gather_out(self, held: int) -> tuple[torch.Tensor | None, Slot | None]:
        """Where to gather a request of ``held`` tokens: a slot of the gather ring (held
        until zmq lets its frames go) shaped as :func:`gather_request` wants, or fresh
        memory (None, None)."""
        ring = self.gather_ring
        if ring is None:
            return None, None
        need = self.request_bytes(held)
        slot = ring.acquire(need, wait=self.wait)
        shape = self.cache.shape
        dims = (self.cache.num_layers, shape.kv, held, shape.heads, shape.head_dim)
        return slot.view(need).view(torch_dtype(self.cache.dtype)).view(dims), slot

    # -- staging to and from a device -----------------------------------------------
    def staging_slot(self, nbytes: int) -> Slot:  # pragma: no cover - needs a GPU
        """A slot of the pinned staging ring, waiting (serving the sockets) while the
        next one is in flight [sim.cache.staging]."""
        assert self.staging is not None
        return self.staging.acquire(nbytes, wait=self.wait)

    def host(self, payload: Payload) -> tuple[Payload, Slot | None]:
        """The payload in host memory, and the staging slot holding it (None on the CPU).

        From a device cache each tensor is copied once into a slot of the rank's pinned
        staging ring [sim.cache.staging], on the side stream after the compute stream's work,
        fenced by an event; the wire then sends that memory without another copy
        [WIRE-5]. The slot stays in flight until the socket is done with it.
        """
        if self.device.type == "cpu":
            return payload, None
        assert self.staging is not None  # pragma: no cover - needs a GPU
        return self._stage_out(payload)  # pragma: no cover

    def _stage_out(self, payload: Payload) -> tuple[Payload, Slot]:  # pragma: no cover - GPU
        assert self.staging is not None
        align = 64
        sizes = [(-(-t.nbytes // align)) * align for _, _, t in payload.tensors()]
        slot = self.staging_slot(sum(sizes))
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        at = 0
        staged: dict[tuple[str, int], torch.Tensor] = {}
        with torch.cuda.stream(self.copy_stream):
            for (name, layer, tensor), size in zip(payload.tensors(), sizes, strict=True):
                host = slot.view(at + tensor.nbytes)[at:].view(tensor.dtype).view(tensor.shape)
                host.copy_(tensor, non_blocking=True)
                staged[(name, layer)] = host
                at += size
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        event.synchronize()  # the frames must hold the bytes before they go on the wire
        slot.hold(event)

        @overload
        def swap(name: str, values: Layers) -> Layers: ...
        @overload
        def swap(name: str, values: Layers | None) -> Layers | None: ...
        def swap(name: str, values: Layers | None) -> Layers | None:
            if values is None:
                return None
            return tuple(
                None if t is None else staged[(name, layer)] for layer, t in enumerate(values)
            )

        return replace(
            payload,
            key_cache=swap("key_cache", payload.key_cache),
            value_cache=swap("value_cache", payload.value_cache),
            key_scale=swap("key_scale", payload.key_scale),
            value_scale=swap("value_scale", payload.value_scale),
        ), slot

    def to_device(self, kv: Any) -> Any:
        """A received request's KV on this rank's device: on the CPU as it is; on a GPU
        copied from a pinned staging slot (not from the pageable frames), on the side
        stream, the compute stream waiting for its event."""
        if self.device.type == "cpu":
            return kv
        return self._stage_in(kv)  # pragma: no cover - needs a GPU

    def _stage_in(self, kv: Any) -> Any:  # pragma: no cover - needs a GPU
        assert self.staging is not None
        tensors = [kv.data.contiguous()] + ([] if kv.scales is None else [kv.scales.contiguous()])
        sizes = [(-(-t.nbytes // 64)) * 64 for t in tensors]
        slot = self.staging_slot(sum(sizes))
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        at, moved = 0, []
        with torch.cuda.stream(self.copy_stream):
            for tensor, size in zip(tensors, sizes, strict=True):
                host = slot.view(at + tensor.nbytes)[at:].view(tensor.dtype).view(tensor.shape)
                host.copy_(tensor)  # pageable frame -> pinned slot, on the CPU
                moved.append(host.to(self.device, non_blocking=True))
                at += size
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        torch.cuda.current_stream(self.device).wait_event(event)
        for t in moved:
            t.record_stream(torch.cuda.current_stream(self.device))
        slot.hold(event)
        return replace(kv, data=moved[0], scales=moved[1] if len(moved) > 1 else None)
