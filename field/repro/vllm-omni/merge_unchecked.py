"""vLLM-Omni 0.30.0: shards of two different requests are merged without a word.

`merge_received_rank_shards` (kv_utils.py) concatenates the payloads' tensors and keeps
the first payload's request id; it never compares request ids (nor seq_len, dtype, layer
counts; a layer missing on one shard is skipped). kvspec: PAYLOAD-3.

Serving (re-triaged for issue 28): not reachable, a hardening note. The receiver only ever
merges payloads fetched under its own request's keys (the request id is in the key), cut
by the same `_extract_kv_cache` on each sender rank from one scheduler output: request id,
seq_len, dtype, block size and layer count agree by construction.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm_omni.distributed.omni_connectors.utils.kv_utils import merge_received_rank_shards


def shard(request_id: str) -> dict:
    k = torch.randn(3, 2, 4)
    return {"request_id": request_id, "layer_blocks": {"key_cache": [k], "value_cache": [k]}}


try:
    merged = merge_received_rank_shards([shard("req-1"), shard("another-request")])
except Exception as error:
    print(f"refused: {error!r}")
    sys.exit(0)
print(
    f"merged shards of 'req-1' and 'another-request' into one of request "
    f"{merged['request_id']!r} with {merged['layer_blocks']['key_cache'][0].shape[1]} heads"
)
sys.exit(1)
