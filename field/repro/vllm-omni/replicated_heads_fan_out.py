"""vLLM-Omni 0.30.0: no KV reaches a decode rank that replicates a head (fan-out).

Prefill (AR) TP2 -> DiT TP8 with 4 KV heads: each AR rank holds 2 heads and feeds 4 DiT
ranks, two per head (DiT rank r holds head r * 4 // 8). Both serving paths fail, loudly:

- model runner v2 (`use_v2_model_runner`, worker_v2/): no hook is installed on the AR
  stage's manager, so `OmniKVTransferManager._transfer_kv_cache` slices per target
  (`_slice_transfer_data_for_target`) into 4 equal slices of 2 heads, and
  `slice_kv_tensor_heads` (utils/kv_utils.py) raises: nothing is sent
  (`handle_finished_requests_kv_transfer` logs "Failed KV transfer").
- model runner v1 (`GPUARModelRunner`): `init_omni_connectors` installs the mixin's key
  builder, so the sender sends its whole shard to every target; the DiT receiver
  (`DiffusionModelRunner` calls `init_omni_connectors(..., synchronous=True)`: no hooks)
  slices with `slice_received_rank_shard`, which raises the same error inside
  `receive_kv_cache_for_request`; that logs it and returns None, and the DiT runs
  without the AR stage's KV.

Serving reaches it only with a receiver TP above the KV head count that vLLM accepts (its
attention heads divisible by that TP). kvspec: SLICE-1, SLICE-2, PLAN-5.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys
import types

import torch
from vllm_omni.distributed.omni_connectors.kv_transfer_manager import (
    KVCacheTransferData,
    OmniKVCacheConfig,
    OmniKVTransferManager,
)
from vllm_omni.distributed.omni_connectors.utils.kv_utils import KVTPTopology
from vllm_omni.worker.omni_connector_model_runner_mixin import OmniConnectorModelRunnerMixin


class Store:
    """The connector's put/get (connectors/base.py signatures), in memory."""

    def __init__(self):
        self.stored = {}

    def put(self, from_stage, to_stage, put_key, data):
        self.stored[put_key] = data
        return True, len(data), None

    def get(self, from_stage, to_stage, get_key, metadata=None):
        return (self.stored[get_key], len(self.stored[get_key])) if get_key in self.stored else None


def manager(rank: int, store: Store, **config) -> OmniKVTransferManager:
    cfg = OmniKVCacheConfig(from_stage="0", to_stage="1", stage_id=1, from_tp=2, to_tp=8, **config)
    m = OmniKVTransferManager(cfg)
    m._tp_topo = KVTPTopology(2, 8, local_rank=rank)  # what get_local_tp_rank() gives
    m._connector = store
    return m


def ar_shard() -> KVCacheTransferData:
    k = torch.randn(3, 2, 4)  # [seq, 2 heads, head_dim] on AR rank 0
    return KVCacheTransferData("r", {"key_cache": [k], "value_cache": [k.clone()]}, [], {})


failed = []
store = Store()
try:  # model runner v2: the sender slices
    manager(0, store)._transfer_kv_cache(ar_shard(), "r")
except ValueError as error:
    failed.append(f"v2 sender: {error}")

store = Store()
sender = manager(0, store)
OmniConnectorModelRunnerMixin().init_omni_connectors(
    types.SimpleNamespace(stage_id=0), kv_transfer_manager=sender
)  # model runner v1: the mixin's hooks, as GPUARModelRunner.__init__ installs them
sender._transfer_kv_cache(ar_shard(), "r")
receiver = manager(1, store, need_recv_cache=True)  # DiT rank 1: no hooks (synchronous=True)
receiver.config.recv_timeout = 0.0
data, _ = receiver.receive_kv_cache_for_request("r")
if data is None:
    failed.append("v1 sender -> DiT receiver rank 1: received None (the slice error is logged)")

for line in failed:
    print("no KV delivered:", line)
sys.exit(1 if failed else 0)
