"""vLLM-Omni's KV-transfer helpers, through kvspec: ``kvspec conform vllm-omni``.

Checks the installed ``vllm_omni`` package (pinned in field/requirements/vllm-omni.txt;
vllm-omni 0.30.0 with vllm 0.30.0), nothing copied: routing, keys and ports from
``vllm_omni/distributed/omni_connectors/utils/kv_utils.py`` and
``.../utils/initialization.py``; what a sender puts on each key and what a receiver
assembles from ``OmniKVTransferManager`` (``.../kv_transfer_manager.py``), run unchanged
with an in-memory object standing for its connector's ``put``/``get``; cache reading
from ``normalize_layer_kv`` on the per-layer views vLLM 0.30 makes. The
serving path's hooks are installed where serving installs them, and the engine's contract
(what it refuses with, the inputs it generates itself, what it starts with) is data on
the adapter, each fact cited; field/retriage-vllm-omni.md judges the failures by it.

The functions above the adapter class translate between kvspec's objects and vLLM-Omni's
(data in, data out) and need no engine; tests/suite/test_field_adapters.py tests them, and
tests/suite/test_field_omni.py tests the adapter against the installed engine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from kvspec.adapters._engine import import_engine
from kvspec.conformance.adapter import Acceptance, Adapter
from kvspec.conformance.adapter.protocols import (
    EdgeKeysProtocol,
    KeysProtocol,
    LayoutsProtocol,
    MarkerProtocol,
    PayloadProtocol,
    PortsProtocol,
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    SizesProtocol,
    TopologyProtocol,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.memory.cache_layout import describe_cache
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES, dtype_name
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.case import TransferCase
from kvspec.transport.payload import CACHE_FIELDS, Payload

NAME = "vllm-omni"
INSTALL = "vllm-omni 0.30.0 and vllm 0.30.0 (field/requirements/vllm-omni.txt)"
FROM_STAGE, TO_STAGE, REQUEST = "0", "1", "req-1"
OMNI = "vllm_omni/distributed/omni_connectors"
"""Where the connector code lives in the vllm-omni 0.30.0 wheel (every citation below)."""

VLLM_LAYOUTS: Mapping[str, str] = MappingProxyType(
    {"vllm_packed_nhd": "LBNHC", "vllm_packed_hnd": "LBHNC"}
)
"""The per-layer caches vLLM 0.30.0 hands a KV connector, by kvspec name -> vLLM's
``KVCacheLayout`` member. vLLM 0.30 has no per-backend ``get_kv_cache_shape`` for
FlashAttention or FlashInfer any more: the GPU model runner allocates one int8 buffer and
views it per layer with ``create_kv_cache_views`` (vllm/v1/kv_cache_interface.py, called
from vllm/v1/worker/utils.py), always as the logical ``[num_blocks, heads, block_size,
2 * head_size]`` (``compute_layer_kv_cache_shape_bytes``: ``(B, H, N, C)``), with the
physical order a stride permutation: ``LBNHC`` (NHD, first in
``_DEFAULT_LAYOUT_PREFERENCE``, vllm/v1/attention/backends/utils.py) or ``LBHNC`` (HND,
what FlashInfer requires on SM100, ``FlashInferBackend.supported_kv_cache_layouts``).
FlashAttention unpacks it as ``kv_cache.transpose(1, 2).split(head_size, dim=-1)``
(``FlashAttentionImpl.forward``). The 5-D ``[2, B, N, H, D]`` / ``[B, 2, N, H, D]`` stacks
``normalize_layer_kv`` also reads are what vLLM <= 0.22 allocated: vLLM 0.30 never hands
them over, so they are outside this adapter's domain."""

DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    attention=("mha",),
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    layouts=tuple(VLLM_LAYOUTS),
    repeated_deliveries=False,
)
"""vLLM-Omni's domain [PLAN-1], what vllm-omni 0.30.0 really does:

- no pipeline parallelism: ``KVTPTopology`` (``utils/kv_utils.py``) has TP sizes and a rank;
- no MLA: ``normalize_layer_kv`` has no latent branch. vLLM <= 0.10's 3-D MLA cache
  ``[num_blocks, block_size, latent]`` comes back ``None`` (no K at all, so
  ``OmniKVTransferManager._extract_kv_cache`` returns None and nothing is sent), and vLLM
  0.30's 4-D MLA view ``[num_blocks, 1, block_size, latent]`` (``MLAAttentionSpec``:
  one head slot) is read as the packed layout, its latent split in two halves called K
  and V. The only pipelines of 0.30.0 that transfer KV (``need_send_cache``: BAGEL,
  ``model_executor/models/bagel/pipeline.py``, and HunyuanImage-3.0,
  ``deploy/hunyuan_image_3_moe.yaml``) are GQA models;
- no fp8 scales: ``KVCacheTransferData`` has no field for them;
- the layouts of :data:`VLLM_LAYOUTS`, the ones vLLM 0.30 allocates;
- no repeated delivery: the receiver gets payloads by key from its connector, where a
  repeat is the same entry [RESHARD-3]."""

REFUSAL_TYPES: tuple[type[BaseException], ...] = (ValueError,)
"""What vLLM-Omni refuses with: ``ValueError`` throughout ``utils/kv_utils.py``
(``KVTPTopology.__post_init__``, ``validate_kv_tp_topology``, ``slice_kv_tensor_heads``)
and ``utils/initialization.py`` (``compute_connector_zmq_port``). Its receiver never
raises: ``receive_kv_cache_for_request`` logs whatever went wrong and returns
``(None, 0)``, and the request runs without the KV; the adapter turns that into a
``ValueError`` carrying the message vLLM-Omni logged."""

_REQUEST_IDS = (
    "request ids are the engine's: AsyncOmni.generate gives every request "
    "_get_unique_request_id(external) = f'{external}-{uuid8}', never empty "
    "(vllm_omni/entrypoints/async_omni.py, async_omni_base.py), and the KV is sent under "
    "that id (GPUARModelRunner._resolve_global_request_id)"
)
_KEYS = (
    f"keys embed the request id and both ranks ({OMNI}/utils/kv_utils.py "
    "get_kv_connector_key: f'{req_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}'), and a "
    "receiver asks its connector only for the keys of its own request from its own sources "
    "(build_rank_aware_recv_keys: get_kv_source_ranks, to_rank = its TP rank)"
)
_ONE_EXTRACTION = (
    "every shard of a request is cut by the same _extract_kv_cache on the sender's TP ranks "
    "from one scheduler output (same request, seq_len, block ids, block_size, dtype and "
    "layer count on every rank; chunk id always 0 in build_rank_aware_send_keys)"
)
SERVING_NEVER_PRODUCES: Mapping[str, str] = MappingProxyType(
    {
        "STAGE-1.2": (
            "the rank is the worker's TP rank: get_local_tp_rank() returns vLLM's "
            "get_tensor_model_parallel_rank() (utils/kv_utils.py), and both the AR worker "
            "and DiffusionWorker (vllm_omni/diffusion/worker/diffusion_worker.py, __init__ "
            "calls init_device, which runs initialize_model_parallel, before the model "
            "runner builds its OmniKVTransferManager) initialise the TP group first; the "
            "LOCAL_RANK fallback is only taken before that"
        ),
        "KEY-3.1": _REQUEST_IDS,
        "KEY-3.2": (
            "stage ids are the stage config's integers (StagePipelineConfig.stage_id), the "
            "chunk id is always 0 (build_rank_aware_send_keys) and ranks come from the TP "
            "group: no negative, boolean, float or '0_5' value reaches get_kv_connector_key"
        ),
        "KEY-3.3": (
            "the legacy key omni_{from}_to_{to}_kv_cache_{id} is used only when both stages "
            "are TP1 and the rank-aware one only otherwise (build_rank_aware_send_keys); a "
            "deployment's TP sizes are fixed, so its keys all come from one scheme, and "
            "within the rank-aware one a key ends in four integer fields, so two requests "
            f"never share one; {_REQUEST_IDS}"
        ),
        "KEY-3.4": (
            "the collisions need a stage id holding '_' or keys of both schemes in one "
            "deployment: stage ids are integers and a deployment uses one scheme "
            "(build_rank_aware_send_keys: legacy only for TP1 -> TP1)"
        ),
        "PORT-2.2": (
            "rank * 16 + stage >= 1024 needs a TP rank >= 64 (stage < 16 is refused by "
            "compute_connector_zmq_port): vLLM 0.30 does not cap TP (ParallelConfig accepts "
            "tensor_parallel_size=128), but a TP group of 65+ ranks needs 65+ accelerators "
            "and attention heads divisible by it, and the only KV-transferring pipelines "
            "(BAGEL-7B-MoT, HunyuanImage-3.0) have nowhere near that many"
        ),
        "SLICE-3.3": (
            "the marker's target_rank is written by the sender for the key it puts the "
            "payload under (OmniKVTransferManager._transfer_kv_cache zips send keys with "
            f"get_kv_target_ranks), and {_KEYS}: a payload sliced for another receiver is "
            "never under this receiver's key"
        ),
        **{f"PAYLOAD-3.{i}": _ONE_EXTRACTION + "; " + _KEYS for i in range(2, 9)},
        "RESHARD-3.2": (
            "a sender writes only to its get_kv_target_ranks and a receiver reads only from "
            "its get_kv_source_ranks, the inverse of it (utils/kv_utils.py): " + _KEYS
        ),
        "RESHARD-3.4": _KEYS,
        "RESHARD-3.5": _ONE_EXTRACTION,
        "RESHARD-3.6": (
            "every sender rank of one deployment runs the same model at the same TP, so its "
            "shard has the heads and layers its edge implies; " + _ONE_EXTRACTION
        ),
        "LAYOUT-1.3": (
            "vLLM builds every per-layer cache itself from the layer's KVCacheSpec "
            "(create_kv_cache_views, vllm/v1/kv_cache_interface.py 0.30.0): a cache of "
            "another rank or shape than its layout's is never handed to the connector"
        ),
    }
)
"""Obligation id -> why vLLM-Omni's serving path never hands its transfer code the input
that obligation's refusal probe builds; each names the engine code that decides it."""

# -- translation: kvspec <-> vLLM-Omni (pure) ----------------------------------------------


def layer_blocks_of(kv: RequestKV) -> dict[str, list[torch.Tensor | None]]:
    """kvspec's ``[layers, kv, seq, heads, dim]`` as vLLM-Omni's per-layer lists.

    vLLM-Omni's ``KVCacheTransferData.layer_blocks`` holds ``key_cache`` and
    ``value_cache``, one ``[seq, heads, dim]`` tensor (or None) per layer; an MLA latent
    has no V, so its ``value_cache`` entries are None [MODEL-2].
    """
    data = kv.data
    return {
        name: [
            data[layer, i].contiguous() if i < data.shape[1] else None for layer in range(len(data))
        ]
        for i, name in enumerate(CACHE_FIELDS)
    }


def request_kv_of(layer_blocks: Mapping[str, Sequence[Any]], *, num_layers: int) -> RequestKV:
    """vLLM-Omni's per-layer lists back as kvspec's ``[layers, kv, seq, heads, dim]``.

    Refuses what cannot be one shard: a layer without K, a V on some layers only,
    tensors of different shapes, or a layer count other than ``num_layers``.
    """
    keys = list(layer_blocks.get("key_cache", []))
    values = list(layer_blocks.get("value_cache", []))
    if len(keys) != num_layers:
        raise ValueError(f"vLLM-Omni returned {len(keys)} layers of K, expected {num_layers}")
    if any(k is None for k in keys):
        missing = [i for i, k in enumerate(keys) if k is None]
        raise ValueError(f"vLLM-Omni returned no K for layers {missing}")
    values = values + [None] * (num_layers - len(values))
    has_v = [v is not None for v in values]
    if any(has_v) and not all(has_v):
        raise ValueError(f"vLLM-Omni returned V for some layers only: {has_v}")
    shapes = {tuple(t.shape) for t in keys + [v for v in values if v is not None]}
    if len(shapes) != 1:
        raise ValueError(f"vLLM-Omni returned tensors of different shapes {sorted(shapes)}")
    per_layer = [
        torch.stack([k, v]) if v is not None else k.unsqueeze(0)
        for k, v in zip(keys, values, strict=True)
    ]
    return RequestKV(torch.stack(per_layer))


def marker_dict(marker: HeadSlice) -> dict[str, Any]:
    """kvspec's marker as vLLM-Omni's ``metadata['tp_head_slice']`` (same keys) [SLICE-3]."""
    return marker.to_dict()


def transfer_fields(kv: RequestKV, *, marker: HeadSlice | None, block_size: int = 16) -> dict:
    """The fields of a vLLM-Omni ``KVCacheTransferData`` carrying ``kv`` for one edge.

    ``metadata`` holds what vLLM-Omni's ``_extract_kv_cache`` writes (block_size,
    num_layers, dtype, seq_len) and, when given, the slice marker.
    """
    metadata: dict[str, Any] = {
        "block_size": block_size,
        "num_layers": kv.data.shape[0],
        "dtype": dtype_name(kv.data.dtype),
        "seq_len": kv.seq_len,
    }
    if marker is not None:
        metadata["tp_head_slice"] = marker_dict(marker)
    return {
        "request_id": REQUEST,
        "layer_blocks": layer_blocks_of(kv),
        "block_ids": [],
        "metadata": metadata,
    }


def payload_fields(payload: Payload) -> dict[str, Any]:
    """A kvspec payload as a vLLM-Omni payload dict: the compatible form is the same
    (``request_id``, ``layer_blocks``, ``block_ids``, ``metadata``) [PAYLOAD-1]."""
    return payload.to_dict()


def payload_of(data: Mapping[str, Any], *, head_slice: HeadSlice) -> Payload:
    """vLLM-Omni's merged payload dict as a kvspec payload.

    The merged result is the receiver's whole shard, which kvspec marks with
    ``head_slice`` (slice 0 of 1, applied); vLLM-Omni's own marker (or its ``source_rank``)
    is not part of kvspec's payload and is dropped.
    """
    # The engine's dict, untyped (Any): its values go to the Payload as they are.
    raw: Any = data
    meta: Any = dict(raw.get("metadata") or {})
    blocks = raw.get("layer_blocks") or {}
    return Payload(
        request_id=raw.get("request_id"),
        key_cache=tuple(blocks.get("key_cache", ())),
        value_cache=tuple(blocks.get("value_cache", ())),
        block_ids=tuple(raw.get("block_ids", ())),
        block_size=meta.get("block_size"),
        dtype=meta.get("dtype"),
        seq_len=meta.get("seq_len"),
        head_slice=head_slice,
    )


def merged_marker(case: TransferCase, dst: int) -> HeadSlice:
    """kvspec's marker of a receiver's assembled shard: its whole heads [PAYLOAD-3]."""
    return HeadSlice(dst, case.source.tp, case.target.tp, 0, 1, applied=True, side="receiver")


def recv_sources(pairs: Sequence[tuple[str, int | None]]) -> list[tuple[str, int]]:
    """``(key, source rank)`` from vLLM-Omni's receive keys: ``None`` marks its single
    sender of a TP1 -> TP1 transfer, rank 0 [KEY-4]."""
    return [(key, 0 if src is None else src) for key, src in pairs]


def shipment_payload(shipment: Shipment) -> dict[str, Any]:
    """One shipment as the payload dict ``slice_received_rank_shard`` takes."""
    return transfer_fields(shipment.kv, marker=shipment.marker)


def shipment_of(shipment: Shipment, data: Mapping[str, Any]) -> Shipment:
    """``shipment`` with the KV and the marker of vLLM-Omni's returned payload dict.

    vLLM-Omni's marker keys are kvspec's plus, on a sender's marker, ``source_rank``
    (dropped); a payload without a marker keeps the shipment's.
    """
    meta = data.get("metadata") or {}
    marker = meta.get("tp_head_slice")
    if isinstance(marker, Mapping):
        fields = HeadSlice.__dataclass_fields__
        marker = HeadSlice.from_dict({k: v for k, v in marker.items() if k in fields})
    else:
        marker = shipment.marker
    kv = request_kv_of(data["layer_blocks"], num_layers=shipment.kv.data.shape[0])
    return replace(shipment, marker=marker, kv=kv)


# -- the adapter ---------------------------------------------------------------------------


class MemoryConnector:
    """Stands for a vLLM-Omni connector: ``put`` stores bytes by key, ``get`` returns them.

    The signatures are ``OmniConnectorBase.put/get``'s (connectors/base.py); no transport
    logic is involved, so what is checked is vLLM-Omni's own key, slice, serialise and
    merge code around it.
    """

    def __init__(self, stored: dict[str, Any] | None = None) -> None:
        self.stored: dict[str, Any] = dict(stored or {})

    def put(
        self, from_stage: str, to_stage: str, put_key: str, data: Any
    ) -> tuple[bool, int, None]:
        self.stored[put_key] = data
        return True, len(data) if isinstance(data, (bytes, bytearray)) else 0, None

    def get(
        self, from_stage: str, to_stage: str, get_key: str, metadata: Any = None
    ) -> tuple[Any, int] | None:
        if get_key not in self.stored:
            return None
        data = self.stored[get_key]
        return data, len(data) if isinstance(data, (bytes, bytearray)) else 0


@contextmanager
def logged_errors(logger_name: str = "vllm_omni") -> Iterator[list[str]]:
    """Collect what vLLM-Omni logs at WARNING and above while the block runs: its
    receiver reports failures only there (and returns None)."""
    records: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f": {record.exc_info[1]!r}"
            records.append(message)

    handler = _Collect(logging.WARNING)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


class VllmOmniAdapter(
    Adapter,
    SizesProtocol,
    RoutingProtocol,
    TopologyProtocol,
    SenderProtocol,
    ReceiverProtocol,
    MarkerProtocol,
    LayoutsProtocol,
    KeysProtocol,
    EdgeKeysProtocol,
    PortsProtocol,
    PayloadProtocol,
):
    """vLLM-Omni (``vllm_omni``) through kvspec, as its serving path runs it.

    Sender: the AR stage's ``OmniKVTransferManager`` (``worker/gpu_ar_model_runner.py``
    builds it ``from_vllm_config``). Two serving paths, the two slicing modes:

    - ``receiver``: vLLM's model runner v1 (``GPUARModelRunner``) calls
      ``init_omni_connectors(model_config, kv_transfer_manager=...)`` on a stage with a
      connector role (a producer gets ``role: sender``, ``engine/stage_init_utils.py
      get_stage_connector_spec``), which installs the mixin's key builders, merger and
      slicer on the manager (``model_runner/omni_connector_runtime.py``,
      ``init_omni_connectors``). With a send-key builder installed
      ``_transfer_kv_cache`` does not slice (``sender_slice_active`` needs
      ``not callable(self.kv_send_key_builder)``): every target gets the whole shard.
      The adapter calls that same ``init_omni_connectors`` on the engine's own mixin.
    - ``sender``: model runner v2 (``use_v2_model_runner``: ``OmniARModelRunner``,
      ``worker_v2/``) builds its manager without handing it to ``init_omni_connectors``
      (``worker_v2/omni_data_plane.py``), so no hook is installed and the sender cuts
      one slice per target (``_slice_transfer_data_for_target``).

    Receiver: the DiT stage. ``DiffusionModelRunner`` (``diffusion/worker/
    diffusion_model_runner.py``) calls ``init_omni_connectors(od_config, manager,
    synchronous=True)``, which leaves the manager's hooks unset, so its receive path runs
    ``utils/kv_utils.py``'s own ``merge_received_rank_shards`` and
    ``slice_received_rank_shard``. No AR runner receives KV in 0.30.0 (they only call
    ``handle_finished_requests_kv_transfer``); the mixin's merger and slicer therefore never
    run in serving: :class:`VllmOmniMixinReceiverAdapter` checks them anyway.
    """

    name = NAME
    domain = DOMAIN
    policies = ()  # rank ratios, no replica choice: neither 'lowest' nor 'balanced' [PLAN-4]
    slicing_modes = ("sender", "receiver")
    refusal_types = REFUSAL_TYPES
    replicas_write = "one"
    """The receiver concatenates whatever its sources send on the head axis
    (``merge_received_rank_shards``: ``torch.cat(layer_tensors, dim=1)``) and counts
    nothing: a replicated head from two senders is two heads, not one head counted twice,
    so kvspec's one-writer rule is the one its result can be judged by [PLAN-2]."""
    serving_never_produces = SERVING_NEVER_PRODUCES
    receiver_hooks = False
    """Whether the receiver's manager has the mixin's merger and slicer installed; in
    serving it has not (see the class docstring)."""

    def __init__(self) -> None:
        package = OMNI.replace("/", ".")
        self.kv = import_engine(f"{package}.utils.kv_utils", adapter=NAME, install=INSTALL)
        self.init = import_engine(f"{package}.utils.initialization", adapter=NAME, install=INSTALL)
        self.manager = import_engine(
            f"{package}.kv_transfer_manager", adapter=NAME, install=INSTALL
        )
        self.mixin = import_engine(
            "vllm_omni.worker.omni_connector_model_runner_mixin", adapter=NAME, install=INSTALL
        )
        self.layouts = import_engine("vllm.v1.kv_cache_layout", adapter=NAME, install=INSTALL)
        import vllm_omni

        self.version = f"vllm-omni {vllm_omni.__version__}"

    def _topology(self, case: TransferCase, rank: int) -> Any:
        return self.kv.KVTPTopology(case.source.tp, case.target.tp, rank)

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return self.kv.get_kv_source_ranks(self._topology(case, dst))

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        return self.kv.get_kv_target_ranks(self._topology(case, src))

    # the managers serving builds ---------------------------------------------------------
    def _manager(
        self, case: TransferCase, rank: int, connector: MemoryConnector, **config: Any
    ) -> Any:
        m = self.manager
        cfg = m.OmniKVCacheConfig(
            from_stage=FROM_STAGE,
            to_stage=TO_STAGE,
            stage_id=int(TO_STAGE),
            from_tp=case.source.tp,
            to_tp=case.target.tp,
            **config,
        )
        manager = m.OmniKVTransferManager(cfg)
        manager._tp_topo = self._topology(case, rank)  # what get_local_tp_rank() would give
        manager._connector = connector
        return manager

    def _install_hooks(self, manager: Any) -> Any:
        """Install the mixin's hooks on ``manager`` as ``GPUARModelRunner.__init__`` does:
        ``init_omni_connectors(model_config, kv_transfer_manager=manager)`` on the engine's
        own ``OmniConnectorModelRunnerMixin``. The model config names no connector, so no
        connector and no thread is made; the mixin takes its TP sizes and rank from the
        manager's ``tp_topology``, as in serving."""

        mixin: Any = self.mixin.OmniConnectorModelRunnerMixin  # the engine's class

        class _Runner(mixin):
            pass

        runner = _Runner()
        stage = SimpleNamespace(stage_id=int(FROM_STAGE), async_chunk=False)
        runner.init_omni_connectors(model_config=stage, kv_transfer_manager=manager)
        return runner

    # sender and receiver, through OmniKVTransferManager [SLICE-1, RESHARD-2] -------------
    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        connector = MemoryConnector()
        manager = self._manager(case, src, connector)
        if slicing == "receiver":
            self._install_hooks(manager)  # model runner v1: the whole shard to every target
        data = self.manager.KVCacheTransferData(**transfer_fields(shard, marker=None))
        manager._transfer_kv_cache(data, REQUEST)
        out = {}
        for key, dst in self._send_keys(case, src):
            if key not in connector.stored:
                raise ValueError(
                    f"vLLM-Omni put nothing under its key {key!r} "
                    f"(it put {sorted(connector.stored)})"
                )
            received = self.manager.KVCacheTransferData.from_bytes(connector.stored[key])
            out[dst] = request_kv_of(received["layer_blocks"], num_layers=len(shard.data))
        return out

    def _send_keys(self, case: TransferCase, src: int) -> list[tuple[str, int]]:
        topo = self._topology(case, src)
        keys = self.kv.build_rank_aware_send_keys(REQUEST, FROM_STAGE, TO_STAGE, topo)
        # _transfer_kv_cache pairs keys with get_kv_target_ranks in this order.
        return list(zip(keys, self.kv.get_kv_target_ranks(topo), strict=False))

    def _receive(self, case: TransferCase, dst: int, stored: dict[str, Any]) -> dict:
        manager = self._manager(case, dst, MemoryConnector(stored), need_recv_cache=True)
        if self.receiver_hooks:
            self._install_hooks(manager)
        manager.config.recv_timeout = 0.0  # everything is already there: do not wait
        with logged_errors() as errors:
            data, _ = manager.receive_kv_cache_for_request(REQUEST)
        if data is None:
            expected = self.kv.build_rank_aware_recv_keys(
                REQUEST, FROM_STAGE, TO_STAGE, self._topology(case, dst)
            )
            raise ValueError(
                f"vLLM-Omni received no KV for target rank {dst} (it waits for keys "
                f"{[k for k, _ in expected]}, was given {sorted(stored)}); it logged: "
                f"{' | '.join(errors) or 'nothing'}"
            )
        return data

    def _key(self, case: TransferCase, src: int, dst: int) -> str:
        for key, rank in recv_sources(
            self.kv.build_rank_aware_recv_keys(
                REQUEST, FROM_STAGE, TO_STAGE, self._topology(case, dst)
            )
        ):
            if rank == src:
                return key
        # A sender the receiver does not expect: the key it would send under.
        return self.kv.get_kv_connector_key(REQUEST, FROM_STAGE, 0, src, dst)

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        stored = {}
        for s in shipments:
            data = self.manager.KVCacheTransferData(**transfer_fields(s.kv, marker=s.marker))
            stored[self._key(case, s.edge.src, dst)] = data.to_bytes()
        data = self._receive(case, dst, stored)
        return request_kv_of(data["layer_blocks"], num_layers=case.model.num_layers)

    def merge(
        self, case: TransferCase, dst: int, received: Sequence[tuple[int, Payload]]
    ) -> Payload:
        stored = {}
        for src, payload in received:
            data = self.manager.KVCacheTransferData(**payload_fields(payload))
            stored[self._key(case, src, dst)] = data.to_bytes()
        return payload_of(self._receive(case, dst, stored), head_slice=merged_marker(case, dst))

    # the slice marker [SLICE-3] ----------------------------------------------------------
    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        payload = shipment_payload(shipment)
        if self.receiver_hooks:
            manager = self._manager(case, dst, MemoryConnector())
            slicer = self._install_hooks(manager)._slice_rank_sharded_kv_payload
        else:
            slicer = None
        topo = self._topology(case, dst)
        return shipment_of(shipment, self.kv.slice_received_rank_shard(payload, topo, slicer))

    # topology refusals [PLAN-1, STAGE-1]; it has no model facts to validate ------------
    def validate_sizes(self, config: TransferConfig) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        topo = self.kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], rank)
        self.kv.validate_kv_tp_topology(topo)

    def validate_topology(self, config: TransferConfig) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        topo = self.kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], rank)
        self.kv.validate_kv_tp_topology(topo)
        self.kv.get_kv_target_ranks(topo)
        self.kv.get_kv_source_ranks(topo)

    # what serving starts with --------------------------------------------------------------
    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """vLLM's and vLLM-Omni's own checks of this deployment, run here on CPU.

        For each stage: vLLM's ``ParallelConfig(tensor_parallel_size, pipeline_parallel_size)``
        (pydantic validation), ``ModelConfig.verify_with_parallel_config`` (attention heads
        divisible by TP; vllm/config/model.py) and the KV-head rule ``QKVParallelLinear``
        applies when the attention layers are built (vllm/model_executor/layers/linear.py:
        ``divide(tp, kv_heads)`` when TP >= KV heads, else ``divide(kv_heads, tp)``), both
        through vLLM's own functions; then vLLM-Omni's ``KVTPTopology`` and
        ``validate_kv_tp_topology`` for the pair (it raises on every transfer of a
        non-dividing pair). Not run: building a ``ModelConfig`` (it needs the model's HF
        config), the diffusion stage's own parallel set-up, vLLM-Omni's stage-config
        loading. The kvspec model has no query-head count: the attention-head check is
        run with ``num_kv_heads * tp`` query heads (a GQA group as large as TP), the most
        permissive model of those KV heads, so a refusal is the KV heads' alone. Models
        other than GQA/MHA and pipeline parallelism are outside the adapter's domain:
        ``None`` (cannot tell)."""
        from vllm.config import ParallelConfig
        from vllm.config.model import ModelConfig
        from vllm.distributed.utils import divide

        model = config.get("model", {})
        if model.get("attention", "mha") != "mha":
            return None
        kv_heads = int(model.get("num_kv_heads", 0))
        ran = []
        for side in ("source", "target"):
            stage = config[side]
            tp, pp = int(stage.get("tp", 1)), int(stage.get("pp", 1) or 1)
            if pp != 1:
                return None
            try:
                parallel = ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp)
                stub = SimpleNamespace(
                    model_arch_config=SimpleNamespace(total_num_attention_heads=kv_heads * tp),
                    use_mla=False,
                    multimodal_config=None,
                )
                ModelConfig.verify_with_parallel_config(stub, parallel)
                if tp >= kv_heads:
                    divide(tp, kv_heads)
                else:
                    divide(kv_heads, tp)
            except (ValueError, AssertionError) as error:  # pydantic's, ours and divide's
                return Acceptance(
                    False,
                    f"vLLM 0.30.0 refuses the {side} stage (TP{tp}, {kv_heads} KV heads): "
                    f"{error!r}",
                )
            ran.append(f"{side} TP{tp}")
        try:
            topo = self.kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], 0)
            self.kv.validate_kv_tp_topology(topo)
        except ValueError as error:
            return Acceptance(
                False, f"vLLM-Omni 0.30.0 refuses every transfer of this pair: {error}"
            )
        return Acceptance(
            True,
            f"vLLM 0.30.0 accepts {' and '.join(ran)} with {kv_heads} KV heads "
            "(ParallelConfig, ModelConfig.verify_with_parallel_config, QKVParallelLinear's "
            "divide) and vLLM-Omni accepts the pair (validate_kv_tp_topology); the pipelines "
            "of 0.30.0 that transfer KV are BAGEL and HunyuanImage-3.0 (AR -> DiT)",
        )

    # layouts [LAYOUT-1, LAYOUT-2] ------------------------------------------------------------
    def vllm_view(self, cache: Any, layout: str) -> torch.Tensor:
        """``cache`` (kvspec's tensor, in physical order) as the per-layer view vLLM 0.30
        hands the connector: logical ``[B, H, N, C]`` with the layout's strides, through
        vLLM's own ``KVCacheLayout.layer_view_order`` (vllm/v1/kv_cache_layout.py)."""
        if layout not in VLLM_LAYOUTS:
            raise ValueError(
                f"vLLM 0.30 hands a connector no {layout!r} cache; its per-layer caches are "
                f"{sorted(VLLM_LAYOUTS)} (KVCacheLayout {sorted(VLLM_LAYOUTS.values())})"
            )
        if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
            raise ValueError(
                f"a {layout!r} cache {describe_cache(cache)} is not 4-D: vLLM 0.30's "
                "per-layer views are [num_blocks, heads, block_size, 2 * head_size]"
            )
        order = self.layouts.KVCacheLayout[VLLM_LAYOUTS[layout]].layer_view_order
        # physical axis i holds logical axis order[i]: the logical view inverts it
        return cache.permute(*[order.index(axis) for axis in range(len(order))])

    def read_layer(self, cache: Any, layout: str) -> tuple[Any, ...]:  # type: ignore[override]  # no page_size: so the suite asks it for no token pool
        """K and V as ``OmniKVTransferManager._extract_kv_cache`` reads them: vLLM's view
        of the layer, through ``normalize_layer_kv(view, block_size=...)`` with the cache
        config's block size (``GPUARModelRunner`` passes ``cache_config.block_size``;
        here the view's, no kernel-block splitting)."""
        view = self.vllm_view(cache, layout)
        block_size = view.shape[2] if view.dim() == 4 else None
        with logged_errors() as errors:
            pair = self.kv.normalize_layer_kv(view, block_size=block_size)
        if pair is None:
            raise ValueError(
                f"vLLM-Omni could not read a {layout} cache of shape {list(view.shape)}: "
                f"{' | '.join(errors) or 'normalize_layer_kv returned None'}"
            )
        return tuple(pair)

    # keys and ports [KEY-1..4, PORT-1..3] ------------------------------------------------
    def rank_aware_key(
        self, request_id: str, from_stage: int, chunk_id: int, from_rank: int, to_rank: int
    ) -> str:
        return self.kv.get_kv_connector_key(request_id, from_stage, chunk_id, from_rank, to_rank)

    def legacy_key(self, request_id: str, from_stage: int, to_stage: int) -> str:
        topo = self.kv.KVTPTopology(1, 1, 0)
        (key,) = self.kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)
        return key

    def send_keys(
        self, case: TransferCase, request_id: str, src: int, *, from_stage: int, to_stage: int
    ) -> list[tuple[str, int]]:
        topo = self._topology(case, src)
        keys = self.kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)
        return list(zip(keys, self.kv.get_kv_target_ranks(topo), strict=True))

    def recv_keys(
        self, case: TransferCase, request_id: str, dst: int, *, from_stage: int, to_stage: int
    ) -> list[tuple[str, int]]:
        topo = self._topology(case, dst)
        return recv_sources(
            self.kv.build_rank_aware_recv_keys(request_id, from_stage, to_stage, topo)
        )

    def kv_port(self, base: int, stage: int, rank: int, replica: int) -> int:
        return self.kv.kv_zmq_port(base, stage, rank, replica_id=replica)


class VllmOmniMixinReceiverAdapter(VllmOmniAdapter):
    """vLLM-Omni with the mixin's merger and slicer on the receiver too:
    ``kvspec conform kvspec.adapters.vllm_omni:VllmOmniMixinReceiverAdapter``.

    The mixin's slicer (``_OmniConnectorRuntimeMixin._slice_rank_sharded_kv_payload``,
    ``model_runner/omni_connector_runtime.py``) passes a tensor whose head count the TP
    ratio does not divide through whole (``if head_dim % tp_ratio != 0:
    sliced.append(tensor)``), where ``utils/kv_utils.py``'s ``slice_kv_tensor_heads``
    raises; its merger concatenates on ``dim=-2`` as the default does on ``dim=1``. In
    0.30.0 no stage receives KV through a manager with those hooks (see
    :class:`VllmOmniAdapter`), so :meth:`serving_accepts` says serving never reaches this
    configuration: what it finds is latent, for the release that lets an AR stage receive.
    """

    name = f"{NAME} (mixin receiver)"
    receiver_hooks = True

    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        return Acceptance(
            False,
            "no vllm-omni 0.30.0 stage receives KV through a manager with the mixin's hooks: "
            "they are installed only by the AR runners' init_omni_connectors "
            "(worker/gpu_ar_model_runner.py, platforms/npu/worker/npu_ar_model_runner.py), "
            "which only send (handle_finished_requests_kv_transfer), while the receiving DiT "
            "stage calls init_omni_connectors(..., synchronous=True), which installs none "
            "(diffusion/worker/diffusion_model_runner.py)",
        )
