"""vLLM's MoRIIO WRITE mapping, through kvspec: ``kvspec conform vllm-moriio``.

Checks the installed ``vllm`` package (pinned in field/requirements/vllm-moriio.txt;
vllm 0.33.0), nothing copied, all in ``vllm/distributed/kv_transfer/kv_connector/v1/
moriio/`` of that wheel:

- ``moriio_tp_mapping.py`` ``compute_write_tp_mapping(producer_tp_rank,
  producer_tp_size, consumer_tp_size, total_num_kv_heads, is_mla, has_mamba)``: the
  decode ranks one prefill rank writes, for each the heads it copies
  (``local_head``, ``remote_head``, ``num_heads``; 0 heads: another prefill rank writes
  that identical copy) and how many prefill ranks write that decode rank
  (``num_writers``: the decode counts that many ``write_done`` notifications before its
  KV is ready, moriio_engine.py); ``validate_write_tp_topology`` refuses what it cannot
  map. The adapter runs the write path's own call: ``MoRIIOConnectorMetadata.add_new_req``
  (moriio_common.py) reads the decode's TP size from the request's ``kv_transfer_params``
  and ``MoRIIOConnectorWorker._write_tp_mapping`` (moriio_connector.py, on a bare worker
  holding what it reads) passes it on — the field of vllm#47764, where the size was read
  from a key the WRITE producer's request does not carry, defaulted to 1, and all 8
  prefill ranks wrote decode rank 0;
- ``moriio_layout.py`` ``get_layer_head_layout`` (where each head of a block lies, from
  the cache tensor's strides), ``compute_head_slice_offsets`` (the byte offsets of one
  write's heads, on both sides) and ``compute_block_transfer_offsets`` (a whole-block
  copy): :meth:`VllmMoriioAdapter.descriptors`. ``compute_mamba_slice_offsets`` moves
  recurrent state, which kvspec's transfer domain does not hold (not adapted).

MoRIIO's WRITE mode pushes: the prefill rank writes into the decode rank's blocks.
The engine's contract, read in the installed 0.33.0 package:

- replica rule: the first holder of a head in the decode rank's prefill group writes it
  (``first_holder``; kvspec/topology/field_policies.py ``vllm_moriio_write``,
  ``replicas_write = "one"``);
- refusals: ``ValueError`` (``validate_write_tp_topology``, the layout functions) and
  ``MoRIIOError`` (the connector, moriio_common.py), ``AssertionError`` (vLLM's start-up
  head checks);
- inputs serving never produces: :data:`SERVING_NEVER_PRODUCES`;
- start-up validation (:meth:`VllmMoriioAdapter.serving_accepts`): vLLM's head checks on
  each side, then ``validate_write_tp_topology`` for the pair (raised "before any write
  is queued", ``_write_blocks_for_req``).

A decode head no write reaches keeps its block's old bytes; a decode rank that hears
fewer ``write_done`` than its ``num_writers`` waits until the request times out, one
that hears more is ready before every write landed (which bytes it reads is a race):
both are raised here as ``MoRIIOError``, the connector's own error.

Older releases: vLLM before ``moriio_tp_mapping.py`` (0.32.0 has
``get_moriio_remote_tp_rank`` in moriio_connector.py instead) is refused when the
adapter is created, naming what is missing.

Domain: PP 1, no fp8 (no scale regions are registered), no recurrent state; layouts
``vllm_packed_hnd`` and ``vllm_packed_nhd`` (MoRIIO requests none: each side keeps its
backend's, and a head layout that differs from the peer's goes through the head-slice
path) and ``vllm_mla``; block size 1 for the descriptor checks (whole blocks are
written; see kvspec/adapters/vllm_mooncake.py for why one token a block is where
DESC-1's slot-by-slot judgement and a block copy agree).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from kvspec.adapters._engine import engine_message, import_engine
from kvspec.adapters._vllm import (
    bare_instance,
    both_sides_head_checks,
    call_accepting,
    vllm_version,
)
from kvspec.conformance.adapter import Acceptance, Adapter, AdapterError
from kvspec.conformance.adapter.protocols import (
    DescriptorsProtocol,
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    TopologyProtocol,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.memory.descriptors import Descriptor, RegisteredCache
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import VLLM_MORIIO, vllm_moriio_write
from kvspec.topology.model import ModelShape

NAME = "vllm-moriio"
INSTALL = "vllm 0.33.0 (field/requirements/vllm-moriio.txt)"
PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1.moriio"
LOGICAL_AXES = ("blocks", "heads", "slots", "dim")
"""vLLM's per-layer view ``[B, H, N, C]`` (``create_kv_cache_views``) in kvspec's axis
names: a cache of these four axes is that view under some stride order."""

DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    layouts=("vllm_packed_hnd", "vllm_packed_nhd", "vllm_mla"),
    block_sizes=(1,),
    repeated_deliveries=False,
)
"""vLLM MoRIIO's WRITE domain as data [PLAN-1]; see the module docstring."""

SERVING_NEVER_PRODUCES: Mapping[str, str] = MappingProxyType(
    {
        "DESC-2.2": (
            "a registered region shorter than the request's block ids need: MoRIIO "
            "registers each layer's KV tensor whole and checks every block id against "
            "num_blocks on both sides before it computes an offset "
            "(moriio_layout.py validate_transfer_block_ids, vllm 0.33.0)"
        ),
        "RESHARD-3.2": (
            "a write from a prefill rank the decode's plan does not list: a prefill rank "
            "writes only the decode ranks compute_write_tp_mapping lists for it "
            "(moriio_tp_mapping.py, vllm 0.33.0)"
        ),
    }
)


def place_writes(
    writes: Sequence[tuple[RequestKV, int]], *, heads: int, like: RequestKV
) -> RequestKV:
    """The decode block after the writes, each ``(kv, first local head)``, in order; a
    head no write reaches keeps the block's old bytes (zeros here) [RESHARD-2]."""
    shape = list(like.data.shape)
    shape[3] = heads
    out = torch.zeros(shape, dtype=like.data.dtype, device=like.data.device)
    for kv, first in writes:
        n = kv.data.shape[3]
        if first < 0 or first + n > heads:
            raise RuntimeError(f"a write of {n} head(s) at head {first} runs past {heads} head(s)")
        out[:, :, :, first : first + n] = kv.data
    return RequestKV(out)


def view_of(cache: RegisteredCache) -> torch.Tensor:
    """A tensor with the shape and strides of ``cache``'s per-layer view ``[B, H, N, C]``
    as vLLM hands it to the connector, C the cell's content (K | V, or the latent). The
    layout functions read only shapes and strides; the bytes are never touched."""
    spec = cache.spec
    if spec.tuple_form or spec.cross_layer or set(spec.axes) != set(LOGICAL_AXES):
        raise ValueError(
            f"a {cache.layout.name} cache is not vLLM's per-layer [B, H, N, C] view under a "
            "stride order [DESC-1]"
        )
    element = cache.element_size()
    strides = cache.strides()
    sizes = {
        "blocks": cache.num_blocks,
        "heads": cache.heads,
        "slots": cache.block_size,
        "dim": cache.tensor_bytes()
        // (cache.num_blocks * cache.heads * cache.block_size * element),
    }
    dtype = torch.float32 if element == 4 else torch.bfloat16 if element == 2 else torch.uint8
    return torch.empty_strided(
        [sizes[a] for a in LOGICAL_AXES],
        [strides[a] // element for a in LOGICAL_AXES],
        dtype=dtype,
    )


class VllmMoriioAdapter(
    Adapter,
    RoutingProtocol,
    TopologyProtocol,
    SenderProtocol,
    ReceiverProtocol,
    DescriptorsProtocol,
):
    """vLLM's MoRIIO WRITE mapping (``vllm``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = (VLLM_MORIIO,)
    policy_rules = MappingProxyType({VLLM_MORIIO: vllm_moriio_write})
    slicing_modes = ("sender",)
    serving_never_produces = SERVING_NEVER_PRODUCES

    def __init__(self) -> None:
        self.version = vllm_version(NAME, INSTALL)
        try:
            self.mapping = import_engine(
                f"{PACKAGE}.moriio_tp_mapping", adapter=NAME, install=INSTALL
            )
        except AdapterError as error:
            raise AdapterError(
                f"the {NAME!r} adapter calls vLLM's MoRIIO WRITE mapping, "
                f"{PACKAGE}.moriio_tp_mapping.compute_write_tp_mapping, which {self.version} "
                "does not have (vllm 0.33.0 does)"
            ) from error
        self.layout = import_engine(f"{PACKAGE}.moriio_layout", adapter=NAME, install=INSTALL)
        self.common = common = import_engine(
            f"{PACKAGE}.moriio_common", adapter=NAME, install=INSTALL
        )
        self.connector = import_engine(f"{PACKAGE}.moriio_connector", adapter=NAME, install=INSTALL)
        self.specs = import_engine("vllm.v1.kv_cache_interface", adapter=NAME, install=INSTALL)
        if not hasattr(self.connector.MoRIIOConnectorWorker, "_write_tp_mapping"):
            raise AdapterError(
                f"{self.version}: MoRIIOConnectorWorker has no _write_tp_mapping, the WRITE "
                "path's call of compute_write_tp_mapping the adapter runs"
            )
        self.error = common.MoRIIOError
        self.refusal_types = (ValueError, AssertionError, common.MoRIIOError)

    # engine calls ------------------------------------------------------------------------
    def _peer_tp_size(self, tp_d: int) -> int:
        """The decode TP size a prefill rank's write path sees: the request's
        ``kv_transfer_params`` as a WRITE producer gets them (the decode's TP under
        ``remote_tp_size``: "the old plain "tp_size" key (#46332) is absent on WRITE producer
        requests", moriio_common.py), through ``MoRIIOConnectorMetadata.add_new_req``,
        whose ``ReqMeta.tp_size`` ``_write_blocks_for_req`` hands ``_write_tp_mapping``."""
        metadata = self.common.MoRIIOConnectorMetadata()
        params = {
            "transfer_id": "transfer",
            "remote_engine_id": "decode",
            "remote_block_ids": [],
            "remote_host": "127.0.0.1",
            "remote_handshake_port": 1,
            "remote_notify_port": 2,
            "remote_tp_size": tp_d,
        }
        call_accepting(
            metadata.add_new_req,
            request_id="request",
            local_block_ids=[],
            kv_transfer_params=params,
            write_mode=True,
        )
        return int(metadata.reqs_to_save["request"].tp_size)

    @functools.lru_cache(maxsize=1024)  # noqa: B019  (the adapter lives for one run)
    def _mapping(self, model: ModelShape, p: int, tp_p: int, tp_d: int) -> Any:
        """``MoRIIOConnectorWorker._write_tp_mapping`` of prefill rank ``p`` (on a bare
        worker with the attributes it reads), for the decode TP the request names: it calls
        ``compute_write_tp_mapping`` with 1 KV head for MLA."""
        worker = bare_instance(self.connector.MoRIIOConnectorWorker)
        worker.tp_rank, worker.world_size = p, tp_p
        worker.use_mla, worker._has_mamba = model.attention == "mla", False
        worker.model_config = SimpleNamespace(get_total_num_kv_heads=lambda: model.num_kv_heads)
        return worker._write_tp_mapping(self._peer_tp_size(tp_d))

    def _writes_into(self, case: TransferCase, d: int) -> dict[int, Any]:
        """Prefill rank -> its ``WriteTarget`` for decode rank ``d`` (attention writes only)."""
        if case.policy != VLLM_MORIIO:
            raise ValueError(
                f"vLLM MoRIIO has one replica rule, {VLLM_MORIIO!r} (compute_write_tp_mapping); "
                f"policy {case.policy!r} cannot be configured [PLAN-4.4]"
            )
        out = {}
        for p in case.source.ranks():
            for target in self._mapping(case.model, p, case.source.tp, case.target.tp).targets:
                if target.tp_rank == d and target.num_heads > 0:
                    out[p] = target
        return out

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        if case.policy != VLLM_MORIIO:
            self._writes_into(case, 0)  # refuses the policy
        mapping = self._mapping(case.model, src, case.source.tp, case.target.tp)
        return sorted({t.tp_rank for t in mapping.targets if t.num_heads > 0})

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        # The prefill ranks whose mapping lists this decode rank (the decode only counts
        # their write_done notifications).
        return sorted(self._writes_into(case, dst))

    # what a write copies, where it lands [SLICE-1, RESHARD-2] -----------------------------
    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        return {dst: self._cut(case, src, dst, shard) for dst in self.targets(case, src)}

    def _cut(self, case: TransferCase, src: int, dst: int, shard: RequestKV) -> RequestKV:
        target = self._writes_into(case, dst)[src]
        stop = target.local_head + target.num_heads
        if target.local_head < 0 or stop > shard.data.shape[3]:
            raise RuntimeError(
                f"prefill rank {src}'s write of heads {target.local_head}..{stop - 1} runs past "
                f"its {shard.data.shape[3]} head(s)"
            )
        return shard.head_slice(target.local_head, stop)

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        writes = self._writes_into(case, dst)
        counts = {t.num_writers for t in writes.values()}
        if len(counts) > 1 or (counts and counts.pop() != len(writes)):
            raise self.error(
                f"decode rank {dst} is written by prefill ranks {sorted(writes)} but they "
                f"announce num_writers {sorted(t.num_writers for t in writes.values())}: it "
                "waits for write_done notifications that never come, or reads before every "
                "write landed"
            )
        by_source = {s.edge.src: s for s in shipments}
        missing = [src for src in writes if src not in by_source]
        if missing:
            raise self.error(f"decode rank {dst}: no write_done from prefill rank(s) {missing}")
        placed = []
        for src, target in writes.items():
            s = by_source[src]
            kv = s.kv if s.marker.applied else self._cut(case, src, dst, s.kv)
            placed.append((kv, target.remote_head))
        if not shipments:
            raise self.error(f"decode rank {dst}: no prefill rank writes it")
        mla = case.model.attention == "mla"
        heads = 1 if mla else max(1, case.model.num_kv_heads // case.target.tp)
        return place_writes(placed, heads=heads, like=shipments[0].kv)

    # the byte ranges MoRIIO writes [DESC-1, DESC-2] --------------------------------------
    def _spec(self, model: ModelShape, cache: RegisteredCache) -> Any:
        dtype = DTYPES[model.dtype]
        if model.attention == "mla":
            return self.specs.MLAAttentionSpec(
                block_size=cache.block_size, num_kv_heads=1, head_size=model.head_dim, dtype=dtype
            )
        return self.specs.FullAttentionSpec(
            block_size=cache.block_size,
            num_kv_heads=cache.heads,
            head_size=model.head_dim,
            dtype=dtype,
        )

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
        """The offsets ``MoRIIOWrapper``'s write plan computes for one request, layer by
        layer (moriio_engine.py): a whole-block copy (``compute_block_transfer_offsets``)
        where the write moves every head and both sides lay heads out alike
        (``copies_whole_block`` and ``_block_copy_matches_peer``: the local layout dense
        and equal to the peer's), else ``compute_head_slice_offsets`` over each side's
        ``get_layer_head_layout``; MLA has no head layout and copies whole blocks. Both
        sides' blocks from the range's first on."""
        write = self._writes_into(case, dst).get(src)
        if write is None:
            return []
        mapping = self._mapping(case.model, src, case.source.tp, case.target.tp)
        first = tokens.start // source.block_size
        local_ids, remote_ids = list(source_ids[first:]), list(target_ids[first:])
        local_view, remote_view = view_of(source), view_of(target)
        name = "model.layers.0.self_attn.attn"
        local_specs = {name: self._spec(case.model, source)}
        remote_specs = {name: self._spec(case.model, target)}
        layout = self.layout
        if case.model.attention == "mla":
            local_layout = remote_layout = None
        else:
            local_layout = layout.get_layer_head_layout(name, local_view, local_specs)
            remote_layout = layout.get_layer_head_layout(name, remote_view, remote_specs)
        whole = mapping.copies_whole_block(write) and (
            local_layout is None or (local_layout.is_dense and remote_layout == local_layout)
        )
        if whole:
            layout.validate_transfer_block_ids(
                local_ids, remote_ids, source.num_blocks, target.num_blocks
            )
            offsets = layout.compute_block_transfer_offsets(
                name, local_view, local_specs, local_ids, remote_ids, target.num_blocks
            )
        else:
            offsets = layout.compute_head_slice_offsets(
                local_layout,
                remote_layout,
                local_ids,
                remote_ids,
                write.local_head,
                write.remote_head,
                write.num_heads,
            )
        out = []
        for src_region, dst_region in zip(source.regions(), target.regions(), strict=True):
            for lo, ro, size in zip(*offsets, strict=True):
                out.append(Descriptor(src_region, lo, dst_region, ro, size))
        return out

    # refusals: the pair of stages [PLAN-1] -------------------------------------------------
    def validate_topology(self, config: TransferConfig) -> None:
        model = ModelShape.from_dict(config["model"])
        mla = model.attention == "mla"
        self.mapping.validate_write_tp_topology(
            int(config["source"]["tp"]),
            int(config["target"]["tp"]),
            1 if mla else model.num_kv_heads,
            mla,
        )

    # start-up validation [serving reachability] -------------------------------------------
    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """Whether vLLM runs a MoRIIO WRITE pair with ``config``, by its own code, on CPU:
        each side's head checks (``_vllm.vllm_head_checks``), then the pair's
        ``validate_write_tp_topology`` (``_write_blocks_for_req`` raises it before any
        write is queued: every request fails). Not run: a model directory, weights,
        the MoRI engine."""
        try:
            ran = both_sides_head_checks(config, adapter=NAME, install=INSTALL)
            self.validate_topology(config)
            ran.append("validate_write_tp_topology")
        except (AssertionError, ValueError) as error:
            return Acceptance(False, f"{self.version} refuses it: {engine_message(error)}")
        return Acceptance(True, f"{self.version} accepts it ({'; '.join(ran)})")
