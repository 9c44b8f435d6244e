"""vLLM-Omni 0.30.0: sender-side slicing fails when the receivers replicate heads.

Prefill TP2 -> decode TP8 with 4 KV heads: each prefill rank holds 2 heads and feeds 4
decode ranks, two per head (decode rank r holds head r * 4 // 8). vLLM-Omni's sender
(`OmniKVTransferManager._slice_transfer_data_for_target`, kv_transfer_manager.py) cuts its
shard into `target_tp // source_tp` = 4 equal slices, which 2 heads cannot give:
`slice_kv_tensor_heads` raises and nothing is sent. The same happens for an MLA latent
(one "head") at any fan-out. kvspec: SLICE-1, SLICE-2, PLAN-5, MODEL-2.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm_omni.distributed.omni_connectors.kv_transfer_manager import (
    KVCacheTransferData,
    OmniKVCacheConfig,
    OmniKVTransferManager,
)
from vllm_omni.distributed.omni_connectors.utils.kv_utils import KVTPTopology

manager = OmniKVTransferManager(OmniKVCacheConfig(from_stage="0", to_stage="1", from_tp=2, to_tp=8))
manager._tp_topo = KVTPTopology(2, 8, local_rank=0)  # prefill rank 0
shard = torch.randn(3, 2, 4)  # [seq, 2 heads, head_dim]
data = KVCacheTransferData("r", {"key_cache": [shard], "value_cache": [shard]}, [], {})
try:
    sliced = manager._slice_transfer_data_for_target(data, target_rank=1)
except ValueError as error:
    print(f"prefill rank 0 cannot send to decode rank 1: {error}")
    sys.exit(1)
print("sliced:", sliced.layer_blocks["key_cache"][0].shape)
sys.exit(0)
