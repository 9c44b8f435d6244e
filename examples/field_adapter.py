"""A kvspec adapter for examples/field_kv_utils.py, a module shaped like the field's API."""

from dataclasses import replace

import torch

from examples import field_kv_utils as kv
from kvspec.conformance import Adapter, Domain
from kvspec.conformance.adapter.protocols import (
    EdgeKeysProtocol,
    KeysProtocol,
    LayoutsProtocol,
    MarkerProtocol,
    PortsProtocol,
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    SizesProtocol,
    TopologyProtocol,
)
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.slicing import HeadSlice


def to_payload(request: RequestKV, marker: dict | None = None) -> dict:
    """kvspec's [layers, kv, seq, heads, dim] -> the field's per-layer [seq, heads, dim] lists."""
    data = request.data
    blocks = {
        name: [data[layer, i] if i < data.shape[1] else None for layer in range(data.shape[0])]
        for i, name in enumerate(("key_cache", "value_cache"))
    }
    return {"layer_blocks": blocks, "metadata": {"tp_head_slice": marker} if marker else {}}


def from_payload(payload: dict) -> RequestKV:
    keys, values = (payload["layer_blocks"][name] for name in ("key_cache", "value_cache"))
    tensors = [torch.stack(keys)] + ([torch.stack(values)] if values[0] is not None else [])
    return RequestKV(torch.stack(tensors, dim=1))


class FieldAdapter(
    Adapter,
    RoutingProtocol,
    SenderProtocol,
    MarkerProtocol,
    ReceiverProtocol,
    LayoutsProtocol,
    KeysProtocol,
    EdgeKeysProtocol,
    PortsProtocol,
    SizesProtocol,
    TopologyProtocol,
):
    name = "field_kv_utils"
    slicing_modes = ("sender", "receiver")
    # The API has no pipeline parallelism and carries no fp8 scales.
    domain = Domain(pp_sizes=(1,), dtypes=("float32", "float16", "bfloat16"))

    def topology(self, case, rank):
        return kv.KVTPTopology(case.source.tp, case.target.tp, rank)

    def sources(self, case, dst):
        return kv.get_kv_source_ranks(self.topology(case, dst))

    def targets(self, case, src):
        return kv.get_kv_target_ranks(self.topology(case, src))

    def sender_transform(self, case, src, shard, slicing):
        topo, out = self.topology(case, src), {}
        for dst in kv.get_kv_target_ranks(topo):
            payload = to_payload(shard)
            if slicing == "sender" and topo.target_tp_size > topo.source_tp_size:
                blocks = kv.slice_layer_blocks(
                    payload["layer_blocks"], dst % topo.ratio, topo.ratio
                )
                payload["layer_blocks"] = blocks
            out[dst] = from_payload(payload)
        return out

    def apply_marker(self, case, dst, shipment):
        payload = to_payload(shipment.kv, shipment.marker.to_dict())
        sliced = kv.slice_received_rank_shard(payload, self.topology(case, dst))
        marker = {**shipment.marker.to_dict(), **sliced["metadata"]["tp_head_slice"]}
        return replace(shipment, kv=from_payload(sliced), marker=HeadSlice(**marker))

    def receiver_combine(self, case, dst, shipments):
        topo = self.topology(case, dst)
        payloads = [to_payload(s.kv, s.marker.to_dict()) for s in shipments]
        sliced = [kv.slice_received_rank_shard(p, topo) for p in payloads]
        return from_payload(kv.merge_received_rank_shards(sliced))

    def read_layer(self, cache, layout):
        return kv.normalize_layer_kv(cache)  # the field reads by shape, ignoring the name

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        return kv.get_kv_connector_key(request_id, from_stage, chunk_id, from_rank, to_rank)

    def legacy_key(self, request_id, from_stage, to_stage):
        topo = kv.KVTPTopology(1, 1, 0)
        return kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)[0]

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):
        topo = self.topology(case, src)
        keys = kv.build_rank_aware_send_keys(request_id, from_stage, to_stage, topo)
        return list(zip(keys, kv.get_kv_target_ranks(topo), strict=True))

    def recv_keys(self, case, request_id, dst, *, from_stage, to_stage):
        topo = self.topology(case, dst)
        keys = kv.build_rank_aware_recv_keys(request_id, from_stage, to_stage, topo)
        return [(key, 0 if src is None else src) for key, src in keys]  # None: the only sender

    def kv_port(self, base, stage, rank, replica):
        return kv.kv_zmq_port(base, stage, rank)  # the formula has no replica term

    def validate_sizes(self, config):  # TP sizes and a rank: all KVTPTopology has
        if config["source"].get("pp", 1) != 1 or config["target"].get("pp", 1) != 1:
            raise ValueError("no pipeline parallelism in this API")
        rank = config.get("rank", {}).get("rank", 0)
        topo = kv.KVTPTopology(config["source"]["tp"], config["target"]["tp"], rank)
        kv.validate_kv_tp_topology(topo)

    validate_topology = validate_sizes  # the same call refuses a pair it cannot map


adapter = FieldAdapter()
