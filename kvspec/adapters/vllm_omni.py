"""vLLM-Omni's KV-transfer helpers, through kvspec: ``kvspec conform vllm-omni``.

Checks the installed ``vllm_omni`` package (pinned in field/requirements/vllm-omni.txt;
vllm-omni 0.30.0 with vllm 0.30.0), nothing copied: routing, keys and ports from
``vllm_omni/distributed/omni_connectors/utils/kv_utils.py`` and
``.../utils/initialization.py``; what a sender puts on each key and what a receiver
assembles from ``OmniKVTransferManager`` (``.../kv_transfer_manager.py``), run unchanged
with an in-memory object standing for its connector's ``put``/``get``; cache reading and
layout guessing from ``normalize_layer_kv``.

The functions above the adapter class translate between kvspec's objects and vLLM-Omni's
(data in, data out) and need no engine; tests/test_field_adapters.py tests them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from kvspec.adapters._engine import import_engine
from kvspec.conformance.adapter import Adapter
from kvspec.conformance.domain import Domain
from kvspec.strategies import TransferCase
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES, dtype_name
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.tensors.slicing import HeadSlice
from kvspec.transport.payload import CACHE_FIELDS, Payload

NAME = "vllm-omni"
INSTALL = "vllm-omni 0.30.0 and vllm 0.30.0 (field/requirements/vllm-omni.txt)"
FROM_STAGE, TO_STAGE, REQUEST = "0", "1", "req-1"
READ_LAYOUTS = ("flash_attn", "flashinfer", "kv_tuple")
"""The layouts ``normalize_layer_kv``'s docstring names (its packed layout has no kvspec
name yet, issue 13); reading another named layout is outside its domain."""

DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    layouts=READ_LAYOUTS,
    repeated_deliveries=False,
)
"""vLLM-Omni's domain [PLAN-1]: ``KVTPTopology`` has TP sizes and a rank only, so there is
no pipeline parallelism; its payload (``KVCacheTransferData``) has no field for fp8 scales;
``normalize_layer_kv`` reads the layouts of :data:`READ_LAYOUTS`. Replicated heads and MLA
are inside: the same API is used for them, and nothing refuses them. A repeated delivery
cannot happen: the receiver gets payloads by key from its connector, where a repeat is the
same entry [RESHARD-3]."""


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
    meta = dict(data.get("metadata") or {})
    blocks = data.get("layer_blocks") or {}
    return Payload(
        request_id=data.get("request_id"),
        key_cache=tuple(blocks.get("key_cache", ())),
        value_cache=tuple(blocks.get("value_cache", ())),
        block_ids=tuple(data.get("block_ids", ())),
        block_size=meta.get("block_size"),
        dtype=meta.get("dtype"),
        seq_len=meta.get("seq_len"),
        head_slice=head_slice,
    )


def merged_marker(case: TransferCase, dst: int) -> HeadSlice:
    """kvspec's marker of a receiver's assembled shard: its whole heads [PAYLOAD-3]."""
    return HeadSlice(dst, case.source.tp, case.target.tp, 0, 1, applied=True, side="receiver")


def read_as(cache: Any, key: torch.Tensor) -> str | None:
    """Which kvspec layout ``normalize_layer_kv`` read ``cache`` as, from the K it returned.

    vLLM-Omni returns views: K is ``cache[0]`` for a dim-0 stack (kvspec's ``flash_attn``),
    ``cache[:, 0]`` for a dim-1 stack (``flashinfer``), the first tensor of a tuple
    (``kv_tuple``); None for anything else (its packed layout has no kvspec name).
    """
    if isinstance(cache, tuple):
        return "kv_tuple" if len(cache) == 2 and key is cache[0] else None
    same = key.data_ptr() == cache.data_ptr()
    if same and tuple(key.shape) == tuple(cache.shape[1:]) and key.stride() == cache.stride()[1:]:
        return "flash_attn"
    if same and cache.dim() >= 3 and tuple(key.shape) == (cache.shape[0], *cache.shape[2:]):
        return "flashinfer"
    return None


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

    def put(self, from_stage: str, to_stage: str, put_key: str, data: Any):
        self.stored[put_key] = data
        return True, len(data) if isinstance(data, (bytes, bytearray)) else 0, None

    def get(self, from_stage: str, to_stage: str, get_key: str, metadata: Any = None):
        if get_key not in self.stored:
            return None
        data = self.stored[get_key]
        return data, len(data) if isinstance(data, (bytes, bytearray)) else 0


class VllmOmniAdapter(Adapter):
    """vLLM-Omni (``vllm_omni``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = ()  # rank ratios, no replica choice: neither 'lowest' nor 'balanced' [PLAN-4]
    slicing_modes = ("sender", "receiver")

    def __init__(self) -> None:
        kv = import_engine(
            "vllm_omni.distributed.omni_connectors.utils.kv_utils", adapter=NAME, install=INSTALL
        )
        self.kv = kv
        self.init = import_engine(
            "vllm_omni.distributed.omni_connectors.utils.initialization",
            adapter=NAME,
            install=INSTALL,
        )
        self.manager = import_engine(
            "vllm_omni.distributed.omni_connectors.kv_transfer_manager",
            adapter=NAME,
            install=INSTALL,
        )
        import vllm_omni

        self.version = f"vllm-omni {vllm_omni.__version__}"

    def _topology(self, case: TransferCase, rank: int) -> Any:
        return self.kv.KVTPTopology(case.source.tp, case.target.tp, rank)

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return self.kv.get_kv_source_ranks(self._topology(case, dst))

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        return self.kv.get_kv_target_ranks(self._topology(case, src))

    # sender and receiver, through OmniKVTransferManager [SLICE-1, RESHARD-2] -------------
    def _manager(self, case: TransferCase, rank: int, connector: MemoryConnector, **config):
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

    def _send_keys(self, case: TransferCase, src: int, hook: Any = None) -> list[tuple[str, int]]:
        topo = self._topology(case, src)
        keys = self.kv.build_rank_aware_send_keys(REQUEST, FROM_STAGE, TO_STAGE, topo, hook=hook)
        # _transfer_kv_cache pairs keys with get_kv_target_ranks in this order.
        return list(zip(keys, self.kv.get_kv_target_ranks(topo), strict=False))

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        connector = MemoryConnector()
        manager = self._manager(case, src, connector)
        if slicing == "receiver":
            # With a key-builder hook installed vLLM-Omni sends the whole shard and the
            # receiver slices (kv_transfer_manager.py, sender_slice_active).
            topo = self._topology(case, src)
            manager.kv_send_key_builder = lambda rid, fs, ts: self.kv.build_rank_aware_send_keys(
                rid, fs, ts, topo
            )
        data = self.manager.KVCacheTransferData(**transfer_fields(shard, marker=None))
        manager._transfer_kv_cache(data, REQUEST)
        out = {}
        for key, dst in self._send_keys(case, src):
            if key not in connector.stored:
                raise RuntimeError(f"vLLM-Omni put nothing under its key {key!r}")
            received = self.manager.KVCacheTransferData.from_bytes(connector.stored[key])
            out[dst] = request_kv_of(received["layer_blocks"], num_layers=len(shard.data))
        return out

    def _receive(self, case: TransferCase, dst: int, stored: dict[str, Any]) -> dict:
        manager = self._manager(case, dst, MemoryConnector(stored), need_recv_cache=True)
        manager.config.recv_timeout = 0.0  # everything is already there: do not wait
        data, _ = manager.receive_kv_cache_for_request(REQUEST)
        if data is None:
            expected = self.kv.build_rank_aware_recv_keys(
                REQUEST, FROM_STAGE, TO_STAGE, self._topology(case, dst)
            )
            raise RuntimeError(
                f"vLLM-Omni received no KV for target rank {dst}: it waits for keys "
                f"{[k for k, _ in expected]}, was given {sorted(stored)}"
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

    def merge(self, case: TransferCase, dst: int, received: Sequence[tuple[int, Payload]]):
        stored = {}
        for src, payload in received:
            data = self.manager.KVCacheTransferData(**payload_fields(payload))
            stored[self._key(case, src, dst)] = data.to_bytes()
        return payload_of(self._receive(case, dst, stored), head_slice=merged_marker(case, dst))

    # the slice marker [SLICE-3] ----------------------------------------------------------
    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        sliced = self.kv.slice_received_rank_shard(
            shipment_payload(shipment), self._topology(case, dst)
        )
        return shipment_of(shipment, sliced)

    # topology refusals [PLAN-1, STAGE-1]; it has no model facts to validate ------------
    def validate_sizes(self, config: dict[str, Any]) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        topo = self.kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], rank)
        self.kv.validate_kv_tp_topology(topo)

    def validate_topology(self, config: dict[str, Any]) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        topo = self.kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], rank)
        self.kv.validate_kv_tp_topology(topo)
        self.kv.get_kv_target_ranks(topo)
        self.kv.get_kv_source_ranks(topo)

    # layouts [LAYOUT-1, LAYOUT-2, LAYOUT-4] ------------------------------------------------
    def read_layer(self, cache: Any, layout: str) -> tuple[Any, ...]:
        pair = self.kv.normalize_layer_kv(cache)
        if pair is None:
            raise ValueError(f"vLLM-Omni could not read a {layout} cache (returned None)")
        return tuple(pair)

    def detect_layout(self, cache: Any, **known: int | None) -> str:
        pair = self.kv.normalize_layer_kv(cache, block_size=known.get("block_size"))
        if pair is None:
            raise ValueError("vLLM-Omni recognises no layout in this cache (returned None)")
        name = read_as(cache, pair[0])
        if name is None:
            raise ValueError("vLLM-Omni read this cache as its packed layout (no kvspec name)")
        return name

    # keys and ports [KEY-1..4, PORT-1..3] ------------------------------------------------
    def rank_aware_key(
        self, request_id: str, from_stage: int, chunk_id: int, from_rank: int, to_rank: int
    ) -> str:
        return self.kv.get_kv_connector_key(request_id, from_stage, chunk_id, from_rank, to_rank)

    def legacy_key(self, request_id: str, from_stage: int, to_stage: int) -> str:
        topo = self.kv.KVTPTopology(1, 1, 0)
        (key,) = self.kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)
        return key

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):
        topo = self._topology(case, src)
        keys = self.kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)
        return list(zip(keys, self.kv.get_kv_target_ranks(topo), strict=True))

    def recv_keys(self, case, request_id, dst, *, from_stage, to_stage):
        topo = self._topology(case, dst)
        return recv_sources(
            self.kv.build_rank_aware_recv_keys(request_id, from_stage, to_stage, topo)
        )

    def kv_port(self, base: int, stage: int, rank: int, replica: int) -> int:
        return self.kv.kv_zmq_port(base, stage, rank, replica_id=replica)
