"""vLLM-Omni 0.30.0: the layout of a vLLM 0.30 cache is guessed from its shape, and a
kernel-split cache is read from the wrong axes.

What serving runs (re-triaged for issue 28). vLLM 0.30 hands a KV connector per-layer views
it makes itself: `create_kv_cache_views` (vllm/v1/kv_cache_interface.py) views one int8
buffer as logical [num_blocks, heads, kernel_block_size, 2 * head_size] per layer. The AR
runner passes them to `OmniKVTransferManager._extract_kv_cache` with the *cache config's*
block size (worker/gpu_ar_model_runner.py: `block_size=self.cache_config.block_size`), and
`normalize_layer_kv` (vllm_omni/distributed/omni_connectors/utils/kv_utils.py) takes the
packed layout only when `shape[2] == block_size`; otherwise it guesses a stack from
`shape[0] == 2` or `shape[1] == 2`.

When the attention backend's kernel block is smaller than the cache block, vLLM splits
each block (`prepare_kernel_block_sizes` -> `select_common_block_size`, vllm/v1/worker/
utils.py): FlashInfer off SM100 advertises kernel blocks [16, 32, 64]
(`FlashInferBackend.get_supported_kernel_block_sizes`), so `--block-size 128` gives views
[2 * num_blocks, heads, 64, 2 * head_size]. With 2 KV heads per rank, `shape[1] == 2`:
vLLM-Omni returns head 0's [K | V] as "K" and head 1's as "V", silently; with another
head count it returns None for every layer and no KV is sent at all.

The old repro (a 5-D FlashInfer cache of exactly 2 blocks) used a layout vLLM 0.30 never
allocates; its claim is withdrawn (field/retriage-vllm-omni.md). This one builds the view
with vLLM's own function. `flashinfer` itself cannot be imported on CPU, so the kernel
block size is handed to `select_common_block_size` through an object advertising what
FlashInferBackend advertises off SM100 (flashinfer.py, 0.30.0); on a GPU the runner gets
it from FlashInferBackend itself.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import select_common_block_size
from vllm_omni.distributed.omni_connectors.utils.kv_utils import normalize_layer_kv


class FlashInferOffSm100:
    """FlashInferBackend.get_supported_kernel_block_sizes() off SM100 (flashinfer.py)."""

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16, 32, 64]


BLOCK_SIZE, KV_HEADS_PER_RANK, HEAD_SIZE, NUM_BLOCKS = 128, 2, 8, 3
kernel_block = select_common_block_size(BLOCK_SIZE, [FlashInferOffSm100])
spec = FullAttentionSpec(
    block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS_PER_RANK, head_size=HEAD_SIZE, dtype=torch.float32
)
page = spec.page_size_bytes
raw = torch.zeros(page * NUM_BLOCKS, dtype=torch.int8)
tensor = KVCacheTensor(
    size=page * NUM_BLOCKS, layers=["layer.0"], layer_stride=page * NUM_BLOCKS, block_stride=page
)
(view,) = create_kv_cache_views(
    raw, spec, NUM_BLOCKS, KVCacheLayout.LBNHC, tensor, kernel_block_size=kernel_block
)
view.copy_(torch.randn(view.shape))
true_k, true_v = view.transpose(1, 2).split(HEAD_SIZE, dim=-1)  # FlashAttentionImpl's unpack

pair = normalize_layer_kv(view, block_size=BLOCK_SIZE)  # what _extract_kv_cache passes
print(f"vLLM: kernel block {kernel_block} under block size {BLOCK_SIZE}: view {list(view.shape)}")
if pair is None:
    print("vLLM-Omni read nothing (None): this layer's KV is not sent")
    sys.exit(1)
key, value = pair
right = key.shape == true_k.shape and torch.equal(key, true_k) and torch.equal(value, true_v)
print(
    f"vLLM-Omni read K {list(key.shape)}, V {list(value.shape)}; the cache's K is "
    f"{list(true_k.shape)}: {'right' if right else 'wrong axes (head 0 as K, head 1 as V)'}"
)
sys.exit(0 if right else 1)
