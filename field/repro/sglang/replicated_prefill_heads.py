"""SGLang 0.5.23: every prefill replica of a KV head writes it to the decode rank.

Prefill TP4 -> decode TP2 with 2 KV heads: prefill ranks 0 and 1 both hold head 0.
`_resolve_rank_mapping` (sglang/srt/disaggregation/common/conn.py) gives decode rank 0
`target_tp_ranks` [0, 1], both real senders for non-MLA, and `compute_head_slice_params`
(common/staging_buffer.py) sends each one's head to decode head offset 0: the same bytes
are written twice, and the decode waits for both (`required_prefill_response_num` 2). The
result is right; the traffic for replicated heads is multiplied by the replication
factor and the decode depends on every replica. kvspec: PLAN-2 (each head from exactly
one sender).

Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import sys

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from _mapping import resolve
from sglang.srt.disaggregation.common.staging_buffer import compute_head_slice_params

PREFILL_TP, DECODE_TP, KV_HEADS = 4, 2, 2
info = resolve(prefill_tp=PREFILL_TP, decode_tp=DECODE_TP)
writes = {}
for src in info.target_tp_ranks:
    _, count, dst_head, _ = compute_head_slice_params(PREFILL_TP, DECODE_TP, src, 0, KV_HEADS)
    for head in range(dst_head, dst_head + count):
        writes.setdefault(head, []).append(src)
print(
    f"decode rank 0 takes KV from prefill ranks {info.target_tp_ranks}; "
    f"decode head -> writers: {writes}"
)
sys.exit(1 if any(len(w) > 1 for w in writes.values()) else 0)
