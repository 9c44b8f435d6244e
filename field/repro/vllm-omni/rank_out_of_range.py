"""vLLM-Omni 0.30.0: a rank outside the stage is accepted and routed to ranks that do not exist.

`KVTPTopology` refuses a negative `local_rank` but not one >= its TP size, and the routing
functions follow it: TP2 -> TP2 with local rank 5 sends to decode rank 5. The rank comes
from `get_local_tp_rank()`, which falls back to the `LOCAL_RANK` environment variable (a
node-local process index, not a TP rank; vllm-omni #5650). kvspec: STAGE-1.

Serving (re-triaged for issue 28): not reachable, a hardening note. The manager takes its
rank from `get_local_tp_rank()` when it is built, and both the AR worker and
`DiffusionWorker` (diffusion/worker/diffusion_worker.py: `__init__` runs `init_device`,
which runs `initialize_model_parallel`, before it builds the model runner) have set up
vLLM's TP group by then, so the rank is the TP-group rank; the LOCAL_RANK fallback is only
taken before that.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

from vllm_omni.distributed.omni_connectors.utils.kv_utils import (
    KVTPTopology,
    get_kv_target_ranks,
)

try:
    targets = get_kv_target_ranks(KVTPTopology(2, 2, local_rank=5))
except ValueError as error:
    print(f"refused: {error}")
    sys.exit(0)
print(f"TP2 -> TP2, local rank 5 (of 2) sends to decode ranks {targets}")
sys.exit(1)
