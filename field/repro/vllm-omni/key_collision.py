"""vLLM-Omni 0.30.0: two different transfers get the same connector key.

`get_kv_connector_key` joins fields with '_' (kv_utils.py); the legacy TP1 key is
`omni_{from}_to_{to}_kv_cache_{request_id}`. Request ids may contain '_', so the
rank-aware key of request "omni_0_to_1_kv_cache_5" equals the legacy key of request
"5_0_0_0_0": one request can read the other's KV. kvspec: KEY-3.

Serving (re-triaged for issue 28): not reachable, a hardening note. The two keys come from
two schemes no deployment mixes: `build_rank_aware_send_keys` uses the legacy key only when
both stages are TP1 and the rank-aware one otherwise, and a deployment's TP sizes are
fixed; within the rank-aware scheme a key ends in four integer fields (stage ids are the
stage config's integers, chunk 0, TP ranks), so two requests never share one. Request ids
are the engine's: AsyncOmni.generate sends `f"{external}-{uuid8}"`, never empty
(entrypoints/async_omni.py, async_omni_base.py `_get_unique_request_id`). This script
shows the functions' collision only.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

from vllm_omni.distributed.omni_connectors.utils.kv_utils import (
    KVTPTopology,
    build_rank_aware_send_keys,
    get_kv_connector_key,
)

rank_aware = get_kv_connector_key("omni_0_to_1_kv_cache_5", 0, 0, 0, 0)
(legacy,) = build_rank_aware_send_keys("5_0_0_0_0", 0, 1, KVTPTopology(1, 1, 0))
print(f"rank-aware key {rank_aware!r}, legacy key {legacy!r}")
sys.exit(1 if rank_aware == legacy else 0)
