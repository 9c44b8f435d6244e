"""The field's replica rules as named kvspec policies [PLAN-4], each read at its source.

kvspec's own policies (``lowest``, ``balanced``) are one legitimate choice each; engines
make others. A rule here answers the planner's question — which replica (source TP rank)
sends head ``c.head`` to receiver ``c.receiver_tp_rank`` — the way the cited engine
does, so an adapter can declare its engine's rule (``Adapter.policy_rules``) and be
judged against it rather than against kvspec's choice.

All of them are *window* rules: a receiver at attention-TP rank ``d`` of ``D`` reads the
source ranks of a window of the ``P`` source ranks, ``[d*P/D, (d+1)*P/D)`` when ``P > D``
(a fan-in) and the one rank ``d*P/D`` when ``P <= D``. On every pair that divides, the
windows are the same; they part where the sizes do not divide (vLLM refuses such
pairs at the handshake, SGLang does not). Where the engine reads several replicas of
one head in a window (SGLang, ``Adapter.replicas_write = "every"``), the rule names the
first of them, the one kvspec's single-sender plan [PLAN-2] keeps.

A window holding no replica of the head (a pair that does not divide, or a rule
misapplied) has no engine answer; the rule then falls back on kvspec's ``lowest``, so the
plan stays defined and a routing check shows the engine's missing sender against it.
Pure and stdlib-only; no engine is imported here (the adapters check the engines against
these rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvspec.topology.plan import ReplicaChoice, ReplicaRule

SGLANG = "sglang-rank-ratio"
VLLM_NIXL = "vllm-nixl-read"
VLLM_MOONCAKE = "vllm-mooncake-write"
VLLM_MORIIO = "vllm-moriio-write"
TRTLLM_MLA = "trtllm-mla-first-of-domain"


def _sizes(c: ReplicaChoice) -> tuple[int, int, int, int]:
    """(P, D, d, base): the two attention-TP sizes, the receiver's attention-TP rank and
    the first source TP rank of the request's group (attention DP and CP)."""
    if c.source_attn_tp < 1 or c.target_attn_tp < 1:
        raise ValueError(
            f"a field rule needs both stages' attention-TP sizes, got source_attn_tp="
            f"{c.source_attn_tp}, target_attn_tp={c.target_attn_tp} [PLAN-4]"
        )
    p, d_size = c.source_attn_tp, c.target_attn_tp
    base = c.replicas.start - c.replicas.start % p
    return p, d_size, c.receiver_tp_rank % d_size, base


def _first_in(c: ReplicaChoice, window: range, base: int) -> int:
    """The first replica of the head inside ``window`` (attention-TP positions), else
    kvspec's lowest replica (see the module docstring)."""
    for rank in c.replicas:
        if rank - base in window:
            return rank
    return c.replicas[0]


def sglang_rank_ratio(c: ReplicaChoice) -> int:
    """SGLang 0.5.23, ``sglang/srt/disaggregation/common/conn.py``
    ``CommonKVManager._resolve_rank_mapping`` (decode side; the prefill side sends to
    whoever registers): equal TP reads ``engine_rank % attn_tp_size``; a larger decode
    TP reads ``target_tp_rank = rank // (attn_tp_size // info.attn_tp_size)`` — the
    ``rank // ratio`` rule; a smaller one reads every prefill rank of
    ``range(rank * (P // D), (rank + 1) * (P // D))`` (for MLA the first is the real
    sender, ``target_tp_rank = target_tp_ranks[0]``, the rest send dummies). Integer
    division by the ratio: on pairs that do not divide the window can miss the head."""
    p, d_size, d, base = _sizes(c)
    if d_size >= p:
        window = range(d // (d_size // p), d // (d_size // p) + 1)
    else:
        window = range(d * (p // d_size), (d + 1) * (p // d_size))
    return _first_in(c, window, base)


def vllm_nixl_read(c: ReplicaChoice) -> int:
    """vLLM 0.33.0, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py``
    ``compute_tp_mapping`` (decode pulls): MLA, or a decode TP at least the prefill's,
    reads ``[tp_rank * remote_tp_size // tp_size]``; a smaller decode TP reads the window
    ``tp_rank * abs_tp .. + abs_tp`` (``abs_tp = remote_tp_size // tp_size``), keeping
    "only the first rank per unique head" (``np.unique(..., return_index=True)``), so one
    replica per head: ``Adapter.replicas_write = "one"``."""
    return _vllm_window_first(c)


def _vllm_window_first(c: ReplicaChoice) -> int:
    """vLLM's window: the one rank ``d * P // D`` when ``D >= P``, else ``d * (P // D) ..
    (d + 1) * (P // D) - 1``, its first replica of the head sending."""
    p, d_size, d, base = _sizes(c)
    if d_size >= p:
        window = range(d * p // d_size, d * p // d_size + 1)
    else:
        window = range(d * (p // d_size), (d + 1) * (p // d_size))
    return _first_in(c, window, base)


def vllm_mooncake_write(c: ReplicaChoice) -> int:
    """vLLM 0.33.0, ``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
    mooncake_connector.py`` (prefill writes): a decode rank pairs with the prefill ranks
    ``TransferTopology.handshake_target_ranks`` gives it (``kv_connector/utils.py``: the one
    rank ``tp_rank // (D // P)``, or ``tp_rank * (P // D) + i`` for ``i < P // D``), and
    ``_compute_sender_transfer_plan`` lets a replicated prefill rank write only when
    ``local_tp_rank % local_replica_count == 0`` (decode not replicated, the vllm#52516
    branch) or ``local_tp_rank % tp_ratio == 0`` (both replicated, or MLA): the first
    replica of the head in the window. The same window as :func:`vllm_nixl_read`; one
    writer per head, ``Adapter.replicas_write = "one"``."""
    return _vllm_window_first(c)


def vllm_moriio_write(c: ReplicaChoice) -> int:
    """vLLM 0.33.0, ``vllm/distributed/kv_transfer/kv_connector/v1/moriio/
    moriio_tp_mapping.py`` ``compute_write_tp_mapping`` (prefill writes): a larger decode TP
    is fed by prefill rank ``d // (D // P)`` (``tp_rank = producer_tp_rank * ratio + j``); a
    smaller one by the group ``d * r .. d * r + r - 1`` (``r = P // D``), where "the first
    producer holding a head writes it; the others hold an identical copy and skip"
    (``first_holder``). The same window as :func:`vllm_nixl_read`; one writer per head."""
    return _vllm_window_first(c)


def trtllm_mla_first_of_domain(c: ReplicaChoice) -> int:
    """TensorRT-LLM (NVIDIA/TensorRT-LLM, read at commits 040855b8 and a2b02652), for
    MLA: ``cpp/tensorrt_llm/batch_manager/mlaCacheFormatter.cpp``
    ``MLACacheFormatter::needSendCache`` — without attention DP, a context rank sends
    iff ``selfTPNum <= destTPNum`` or ``selfTpRank % (selfTPNum / destTPNum) == 0``; a
    generation rank's domain is ``cpp/tensorrt_llm/executor/cache_transmission/
    cacheSplitConcat.cu`` ``TargetRanksInfoForDP``: ``[d * (P/D), (d+1) * (P/D))`` when
    ``D <= P``, the one rank ``d / (D/P)`` otherwise. So the first rank of each target's
    TP domain sends. Stated for MLA (one latent, held by every rank); with attention DP
    on the generation side the sender is ``destDPRank % dupHeadFactor`` instead, which
    this rule does not model. Not confirmed for MHA (cacheFormatter.cpp)."""
    p, d_size, d, base = _sizes(c)
    if d_size <= p:
        window = range(d * (p // d_size), (d + 1) * (p // d_size))
    else:
        first = d // (d_size // p)
        window = range(first, first + 1)
    return _first_in(c, window, base)


FIELD_RULES: Mapping[str, ReplicaRule] = MappingProxyType(
    {
        SGLANG: sglang_rank_ratio,
        VLLM_NIXL: vllm_nixl_read,
        VLLM_MOONCAKE: vllm_mooncake_write,
        VLLM_MORIIO: vllm_moriio_write,
        TRTLLM_MLA: trtllm_mla_first_of_domain,
    }
)
"""The field's replica rules by policy name, for ``Adapter.policy_rules``."""
