"""SGLang 0.5.23: with equal PP sizes, layers are paired by position, not by layer id.

Prefill PP2 with layers [0] | [1, 2, 3], decode PP2 with layers [0, 1, 2] | [3] (4 layers;
e.g. different SGLANG_PP_LAYER_PARTITION on the two servers). `_resolve_rank_mapping`
(common/conn.py) sends decode PP rank p to prefill PP rank p only, and
`get_mha_kv_ptrs_with_pp` pairs the prefill stage's layer buffers with the decode's by
position: decode PP rank 1 (layer 3 only) gets prefill layer 1's K written into its
layer-3 V buffer, and decode layers 1, 2 and 3's K are never written.
Related upstream: sgl-project/sglang#27740 (open: get_mha_kv_ptrs_with_pp mishandles
uneven PP splits; fixes proposed in #28229 and #33497, unmerged). kvspec: PLAN-2, RESHARD-2.

Here layer ids stand in for the buffer addresses the method pairs.
Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import sys
from types import SimpleNamespace

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from sglang.srt.disaggregation.common.conn import CommonKVManager, PrefillServerInfo

PREFILL = [[0], [1, 2, 3]]
DECODE = [[0, 1, 2], [3]]
V = 1000  # V buffer of layer l is V + l
received = {}
for pp_rank, decode_layers in enumerate(DECODE):
    decode = SimpleNamespace(
        is_mla_backend=False,
        is_hybrid_mla_backend=False,
        attn_tp_size=1,
        kv_args=SimpleNamespace(engine_rank=0),
        attn_cp_size=1,
        attn_cp_rank=0,
        enable_all_cp_ranks_for_transfer=False,
        pp_size=2,
        pp_rank=pp_rank,
    )
    info = PrefillServerInfo(
        attn_tp_size=1,
        attn_cp_size=1,
        dp_size=1,
        pp_size=2,
        page_size=16,
        kv_cache_dtype="auto",
        follow_bootstrap_room=True,
    )
    CommonKVManager._resolve_rank_mapping(decode, info)
    for src_pp in info.target_pp_ranks:
        src_layers = PREFILL[src_pp]
        prefill = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=src_layers[0]))
        src_k, _, dst_k, _, _ = CommonKVManager.get_mha_kv_ptrs_with_pp(
            prefill,
            [*src_layers, *(V + lay for lay in src_layers)],
            [*decode_layers, *(V + lay for lay in decode_layers)],
        )
        for s, d in zip(src_k, dst_k, strict=False):
            received.setdefault(d, []).append(s)


def name(ptr: int) -> str:
    return f"V{ptr - V}" if ptr >= V else f"K{ptr}"


wrong = {name(d): [f"K{x}" for x in s] for d, s in received.items() if s != [d]}
missing = sorted(set(range(4)) - set(received))
print(
    f"decode K buffers never written: layers {missing}; "
    f"decode buffers written with another layer's K: {wrong}"
)
sys.exit(1 if missing or wrong else 0)
