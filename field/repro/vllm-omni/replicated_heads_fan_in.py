"""vLLM-Omni 0.30.0: a receiver merges replicas of one KV head as if they were distinct heads.

Prefill TP4 -> decode TP2 with 2 KV heads (GQA). Under vLLM's head rule each prefill rank
holds head `rank * 2 // 4`, so ranks 0 and 1 both hold head 0. `get_kv_source_ranks`
(vllm_omni/distributed/omni_connectors/utils/kv_utils.py) is a pure rank ratio: decode
rank 0 receives from ranks [0, 1], and `merge_received_rank_shards` concatenates the two
shards on the head axis: decode rank 0 ends up with 2 heads where its model has 1 (the
second a copy of the first). Nothing raises. kvspec: PLAN-2, RESHARD-1/2/3.

Serving (re-triaged for issue 28): this is what the DiT receiver runs — `DiffusionModelRunner`
calls `init_omni_connectors(..., synchronous=True)`, which installs no merger, so
`receive_kv_cache_for_request` merges with this default `merge_received_rank_shards`.
(The mixin's merger, installed only on AR-stage managers, concatenates the same way on
dim -2.) It needs an AR stage TP above the KV head count and a DiT TP below the AR's;
vLLM accepts such a deployment whenever the attention heads divide by the AR TP.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm_omni.distributed.omni_connectors.utils.kv_utils import (
    KVTPTopology,
    get_kv_source_ranks,
    merge_received_rank_shards,
)

SOURCE_TP, TARGET_TP, KV_HEADS, SEQ, HEAD_DIM = 4, 2, 2, 3, 4
full = torch.randn(SEQ, KV_HEADS, HEAD_DIM)  # one layer's K of one request


def prefill_shard(rank: int) -> dict:
    head = rank * KV_HEADS // SOURCE_TP  # replicated: TP > KV heads
    k = full[:, head : head + 1].clone()
    return {"request_id": "r", "layer_blocks": {"key_cache": [k], "value_cache": [k]}}


sources = get_kv_source_ranks(KVTPTopology(SOURCE_TP, TARGET_TP, local_rank=0))
merged = merge_received_rank_shards([prefill_shard(s) for s in sources])
heads = merged["layer_blocks"]["key_cache"][0].shape[1]
expected = max(1, KV_HEADS // TARGET_TP)
print(
    f"decode rank 0 receives from prefill ranks {sources} and assembles {heads} head(s); "
    f"its model shard has {expected}"
)
sys.exit(1 if heads != expected else 0)
