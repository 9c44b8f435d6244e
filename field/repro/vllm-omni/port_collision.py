"""vLLM-Omni 0.30.0: TP rank 64 of replica 0 binds replica 1's rank-0 KV port.

`compute_connector_zmq_port` (vllm_omni/distributed/omni_connectors/utils/initialization.py)
adds replica * 1024 + rank * 16 + stage and checks the stage and the port range, not
rank * 16 + stage < 1024, so two senders get one port (EADDRINUSE at best). kvspec: PORT-2.

Serving (re-triaged for issue 28): not reachable with any KV-transferring pipeline, a
hardening note. TP rank 64 needs a TP group of 65+ ranks: vLLM 0.30 does not cap TP
(`ParallelConfig(tensor_parallel_size=128)` validates on CPU), but the attention heads must
divide by it (`ModelConfig.verify_with_parallel_config`), and the 0.30.0 pipelines that
transfer KV (BAGEL, HunyuanImage-3.0) have far fewer heads.

Run with vllm-omni==0.30.0 and vllm==0.30.0 importable; exits 1 while the defect is there.
"""

import sys

from vllm_omni.distributed.omni_connectors.utils.kv_utils import kv_zmq_port

a = kv_zmq_port(50000, 0, local_rank=64, replica_id=0)
b = kv_zmq_port(50000, 0, local_rank=0, replica_id=1)
print(f"replica 0 rank 64 -> port {a}; replica 1 rank 0 -> port {b}")
sys.exit(1 if a == b else 0)
