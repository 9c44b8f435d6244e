"""SGLang 0.5.23: under pipeline parallelism, KV layers land in the wrong decode buffers.

A plain-MHA pool publishes no layer ids, so `get_mha_kv_ptrs_with_pp`
(sglang/srt/disaggregation/common/conn.py) pairs a prefill stage's K/V buffers with the
decode's by position and a heuristic. Under SGLang's *default* split (`get_pp_indices`,
sglang/srt/distributed/utils.py, SGLANG_PP_LAYER_PARTITION unset: the extra layers go to
the last stages), ordinary deployments go wrong:

1. Prefill PP3 of a 32-layer model (Llama-3.1-8B: [0..9] | [10..20] | [21..31]) into a
   decode with PP 1: a stage whose layer count does not match takes the branch meant
   for "decode has draft KV", and its V buffers are written to the wrong decode buffers
   (the impact sweep, field/impact/sglang_pp_pairing.py, counts them over real models).
2. Prefill PP2 of a 3-layer model ([0] | [1, 2]) into a decode with PP 1: the smallest
   case of the same branch.
3. Equal PP sizes with different partitions, one side given an explicit
   SGLANG_PP_LAYER_PARTITION (prefill [0] | [1, 2, 3], decode default [0, 1] | [2, 3]):
   decode PP rank p reads prefill PP rank p only and pairs by position.

Upstream: sgl-project/sglang#27740 (open: the draft-KV heuristic misfires for uneven PP
splits; fixes proposed in #28229 and #33497, unmerged). kvspec: PLAN-2, RESHARD-2,
SLICE-1, PLAN-5, MODEL-2, DTYPE-2. Layer ids stand in for the buffer addresses the method
pairs. Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import os
import sys
from types import SimpleNamespace

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from _mapping import resolve
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.distributed.utils import get_pp_indices

V = 1000  # the V buffer of layer l is V + l; the K buffer is l


def name(ptr: int) -> str:
    return f"V{ptr - V}" if ptr >= V else f"K{ptr}"


def writes(prefill: list[list[int]], decode: list[list[int]]) -> dict[str, list[str]]:
    """Decode buffer -> the prefill buffers SGLang writes into it."""
    got: dict[str, list[str]] = {}
    for pp_rank, decode_layers in enumerate(decode):
        info = resolve(
            prefill_tp=1,
            decode_tp=1,
            prefill_pp=len(prefill),
            decode_pp=len(decode),
            decode_pp_rank=pp_rank,
        )
        for src_pp in info.target_pp_ranks:
            layers = prefill[src_pp]
            stage = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=layers[0]))
            src_k, src_v, dst_k, dst_v, _ = CommonKVManager.get_mha_kv_ptrs_with_pp(
                stage,
                [*layers, *(V + lay for lay in layers)],
                [*decode_layers, *(V + lay for lay in decode_layers)],
            )
            for s, d in [*zip(src_k, dst_k, strict=False), *zip(src_v, dst_v, strict=False)]:
                got.setdefault(name(d), []).append(name(s))
    return got


def default_split(num_layers: int, pp: int) -> list[list[int]]:
    """Each stage's layers by SGLang's own default rule (the partition variable unset)."""
    os.environ.pop("SGLANG_PP_LAYER_PARTITION", None)
    return [list(range(*get_pp_indices(num_layers, rank, pp))) for rank in range(pp)]


failed = False
for title, prefill, decode in (
    (
        "32 layers: prefill PP3 (default split) -> decode PP1",
        default_split(32, 3),
        [list(range(32))],
    ),
    ("3 layers: prefill PP2 (default split) -> decode PP1", default_split(3, 2), [[0, 1, 2]]),
    (
        "4 layers: prefill PP2 [0] | [1, 2, 3] (SGLANG_PP_LAYER_PARTITION=1,3) -> decode PP2 "
        "(default split)",
        [[0], [1, 2, 3]],
        default_split(4, 2),
    ),
):
    got = writes(prefill, decode)
    layers = sorted({layer for stage in decode for layer in stage})
    wanted = {f"{kind}{layer}": [f"{kind}{layer}"] for layer in layers for kind in "KV"}
    wrong = {buf: src for buf, src in got.items() if wanted.get(buf) != src}
    missing = sorted(buf for buf in wanted if buf not in got)
    print(
        f"{title}: {len(wrong)} buffers written wrong {dict(list(wrong.items())[:4])}...; "
        f"never written {missing[:8]}{'...' if len(missing) > 8 else ''} ({len(missing)})"
    )
    failed |= bool(wrong or missing)
sys.exit(1 if failed else 0)
