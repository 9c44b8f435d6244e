"""The decode side's rank mapping, as SGLang resolves it (repro helper).

`CommonKVManager._resolve_rank_mapping` (sglang/srt/disaggregation/common/conn.py) reads a
handful of the decode manager's attributes and the prefill's `PrefillServerInfo`, and
stores on the info which prefill TP and PP ranks the decode rank reads. Here it runs on a
stand-in that has exactly those attributes: an MHA model, no CP, one DP group.
"""

from types import SimpleNamespace

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from sglang.srt.disaggregation.common.conn import CommonKVManager, PrefillServerInfo


def resolve(
    *,
    prefill_tp: int,
    decode_tp: int,
    decode_rank: int = 0,
    prefill_pp: int = 1,
    decode_pp: int = 1,
    decode_pp_rank: int = 0,
) -> PrefillServerInfo:
    """The prefill's info after the decode rank resolved its mapping; its
    `target_tp_ranks` and `target_pp_ranks` say which prefill ranks it reads."""
    decode = SimpleNamespace(
        is_mla_backend=False,
        is_hybrid_mla_backend=False,
        attn_tp_size=decode_tp,
        kv_args=SimpleNamespace(engine_rank=decode_rank),
        attn_cp_size=1,
        attn_cp_rank=0,
        enable_all_cp_ranks_for_transfer=False,
        pp_size=decode_pp,
        pp_rank=decode_pp_rank,
    )
    info = PrefillServerInfo(
        attn_tp_size=prefill_tp,
        attn_cp_size=1,
        dp_size=1,
        pp_size=prefill_pp,
        page_size=16,
        kv_cache_dtype="auto",
        follow_bootstrap_room=True,
    )
    CommonKVManager._resolve_rank_mapping(decode, info)
    return info
