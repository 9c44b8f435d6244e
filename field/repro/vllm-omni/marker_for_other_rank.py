"""vLLM-Omni 0.30.0: a payload sliced for another receiver is used, with only a warning.

`slice_received_rank_shard` (vllm_omni/distributed/omni_connectors/utils/kv_utils.py)
sees `tp_head_slice.applied` with `target_rank` 1 at receiver rank 0, logs "Received
pre-sliced KV payload for unexpected target rank" and returns the payload: rank 0 runs on
rank 1's heads. (On fan-in the marker is not looked at at all.) kvspec: SLICE-3.

Serving (re-triaged for issue 28): not reachable, a hardening note. The DiT receiver (no
hooks) reads only keys `{request}_{stage}_0_{src}_{its own rank}`
(`build_rank_aware_recv_keys`), and a sender writes the marker's `target_rank` for the key
it puts the payload under (`_transfer_kv_cache` zips the send keys with
`get_kv_target_ranks`): a payload sliced for another rank never reaches this one. On
fan-in no sender slices, so there is no marker to look at.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

import torch
from vllm_omni.distributed.omni_connectors.utils.kv_utils import (
    KVTPTopology,
    slice_received_rank_shard,
)

k = torch.randn(3, 4, 8)  # heads 4..7 of the model: rank 1's slice of a TP2 -> TP4 transfer
marker = {
    "applied": True,
    "side": "sender",
    "target_rank": 1,
    "from_tp": 2,
    "to_tp": 4,
    "offset_in_shard": 1,
    "num_slices": 2,
}
payload = {
    "request_id": "r",
    "layer_blocks": {"key_cache": [k], "value_cache": [k]},
    "metadata": {"tp_head_slice": marker},
}
try:
    got = slice_received_rank_shard(payload, KVTPTopology(2, 4, local_rank=0))
except Exception as error:
    print(f"refused: {error!r}")
    sys.exit(0)
print(
    f"receiver rank 0 accepted a payload sliced for rank {marker['target_rank']} "
    f"({'unchanged' if got is payload else 'changed'})"
)
sys.exit(1)
