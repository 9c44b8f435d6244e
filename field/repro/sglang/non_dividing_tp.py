"""SGLang 0.5.23: TP sizes that do not divide are accepted, and heads are lost.

Prefill TP3 -> decode TP2 with 6 KV heads (2 per prefill rank, 3 per decode rank).
`_resolve_rank_mapping` (sglang/srt/disaggregation/common/conn.py) checks nothing about
the pair: `attn_tp_size // info.attn_tp_size`-style windows give decode rank 0 prefill
rank [0] and decode rank 1 prefill rank [1]; prefill rank 2 is never read, and
`compute_head_slice_params` sends 2 heads to each 3-head decode shard: decode rank 0's
head 2 is never written, decode rank 1's heads land at 2..3, one past the end of its
shard (in a real cache, the next token's slot). kvspec: PLAN-1, PLAN-2.

SGLang starts with this deployment (checked through kvspec's adapter,
`SglangAdapter.serving_accepts`, issue 28): `ServerArgs.resolve_once` and
`check_server_args` pass for TP3 prefill and TP2 decode, `LlamaAttention`'s head checks
pass on each side alone (6 % 3 == 0, 6 % 2 == 0), and the decode's
`_resolve_rank_mapping` asserts nothing about the pair. Nothing refuses it before
requests flow; `kvspec conform sglang` finds it (PLAN-2/exact-cover, non-dividing pairs
are in the adapter's domain).

Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import sys

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from _mapping import resolve
from sglang.srt.disaggregation.common.staging_buffer import compute_head_slice_params

PREFILL_TP, DECODE_TP, KV_HEADS = 3, 2, 6
written = {}
for dst in range(DECODE_TP):
    try:
        info = resolve(prefill_tp=PREFILL_TP, decode_tp=DECODE_TP, decode_rank=dst)
    except Exception as error:
        print(f"refused: {error!r}")
        sys.exit(0)
    heads = set()
    for src in info.target_tp_ranks:
        _, count, dst_head, _ = compute_head_slice_params(PREFILL_TP, DECODE_TP, src, dst, KV_HEADS)
        heads |= set(range(dst_head, dst_head + count))
    written[dst] = sorted(heads)
    print(
        f"decode rank {dst} reads prefill ranks {info.target_tp_ranks} and writes heads "
        f"{written[dst]} of its 0..{KV_HEADS // DECODE_TP - 1}"
    )
own = list(range(KV_HEADS // DECODE_TP))
sys.exit(1 if any(h != own for h in written.values()) else 0)
