"""vLLM-Omni 0.30.0: a FlashInfer cache with exactly 2 blocks is read as a FlashAttention one.

`normalize_layer_kv` (vllm_omni/distributed/omni_connectors/utils/kv_utils.py) takes the
layout from the shape: `shape[0] == 2` means K/V on dim 0. A FlashInfer cache
[num_blocks, 2, block_size, heads, head_dim] with num_blocks == 2 has shape[0] == 2 too, so
block 0 (its K and V) is returned as "K" and block 1 as "V". kvspec: LAYOUT-1, LAYOUT-4.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm_omni.distributed.omni_connectors.utils.kv_utils import normalize_layer_kv

flashinfer = torch.randn(2, 2, 4, 2, 3)  # [num_blocks=2, K/V, block_size, heads, head_dim]
key, value = normalize_layer_kv(flashinfer)
right = torch.equal(key, flashinfer[:, 0]) and torch.equal(value, flashinfer[:, 1])
print(
    f"K read as a tensor of shape {list(key.shape)}; it is "
    f"{'K of both blocks' if right else 'block 0 (K and V), not K'}"
)
sys.exit(0 if right else 1)
