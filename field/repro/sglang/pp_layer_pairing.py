"""SGLang 0.5.23: under pipeline parallelism, KV layers land in the wrong decode buffers.

A plain-MHA pool publishes no layer ids, so `get_mha_kv_ptrs_with_pp`
(sglang/srt/disaggregation/common/conn.py) pairs a prefill stage's K/V buffers with the
decode's by position and a heuristic. Two ordinary deployments go wrong:

1. Prefill PP2 with an uneven split (3 layers: [0, 1] | [2]) into a decode with PP 1.
   For stage 0, `3 % 2 != 0` takes the branch meant for "decode has draft KV": its V
   buffers are written to decode K of layer 2 and V of layer 0. (Any layer count that
   PP does not divide evenly: 61 layers on PP2, 32 on PP3, ...)
2. Equal PP sizes with different partitions (prefill [0] | [1, 2, 3], decode
   [0, 1, 2] | [3], e.g. a different SGLANG_PP_LAYER_PARTITION): decode PP rank p reads
   prefill PP rank p only and pairs by position, so decode layers 1..3 miss their K and
   prefill layer 1's K lands in decode layer 3's V buffer.

Upstream: sgl-project/sglang#27740 (open: the draft-KV heuristic misfires for uneven PP
splits; fixes proposed in #28229 and #33497, unmerged). kvspec: PLAN-2, RESHARD-2,
SLICE-1, PLAN-5, MODEL-2, DTYPE-2. Layer ids stand in for the buffer addresses the method
pairs. Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import sys
from types import SimpleNamespace

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from sglang.srt.disaggregation.common.conn import CommonKVManager, PrefillServerInfo

V = 1000  # the V buffer of layer l is V + l; the K buffer is l


def name(ptr: int) -> str:
    return f"V{ptr - V}" if ptr >= V else f"K{ptr}"


def writes(prefill: list[list[int]], decode: list[list[int]]) -> dict[str, list[str]]:
    """Decode buffer -> the prefill buffers SGLang writes into it."""
    got: dict[str, list[str]] = {}
    for pp_rank, decode_layers in enumerate(decode):
        me = SimpleNamespace(
            is_mla_backend=False,
            is_hybrid_mla_backend=False,
            attn_tp_size=1,
            kv_args=SimpleNamespace(engine_rank=0),
            attn_cp_size=1,
            attn_cp_rank=0,
            enable_all_cp_ranks_for_transfer=False,
            pp_size=len(decode),
            pp_rank=pp_rank,
        )
        info = PrefillServerInfo(
            attn_tp_size=1,
            attn_cp_size=1,
            dp_size=1,
            pp_size=len(prefill),
            page_size=16,
            kv_cache_dtype="auto",
            follow_bootstrap_room=True,
        )
        CommonKVManager._resolve_rank_mapping(me, info)
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


failed = False
for title, prefill, decode in (
    ("prefill PP2 [0, 1] | [2] -> decode PP1", [[0, 1], [2]], [[0, 1, 2]]),
    (
        "prefill PP2 [0] | [1, 2, 3] -> decode PP2 [0, 1, 2] | [3]",
        [[0], [1, 2, 3]],
        [[0, 1, 2], [3]],
    ),
):
    got = writes(prefill, decode)
    layers = sorted({layer for stage in decode for layer in stage})
    wanted = {f"{kind}{layer}": [f"{kind}{layer}"] for layer in layers for kind in "KV"}
    wrong = {buf: src for buf, src in got.items() if wanted.get(buf) != src}
    missing = sorted(buf for buf in wanted if buf not in got)
    print(f"{title}: written wrong {wrong}; never written {missing}")
    failed |= bool(wrong or missing)
sys.exit(1 if failed else 0)
