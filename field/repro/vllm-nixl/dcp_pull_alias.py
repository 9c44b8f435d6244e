"""vLLM 0.33.0 NIXL: "NixlPullConnector", the same class as "NixlConnector", skips every
NIXL DCP check of start-up, and its DCP ranks then attend other tokens' KV.

`nixl/connector.py` 431-432 has `NixlConnector = NixlPullConnector`; `kv_connector/
factory.py` 177-192 registers "NixlConnector", "NixlPullConnector" and "NixlPushConnector".
`VllmConfig` keys its NIXL-DCP steps on the literal name, through
`KVTransferConfig.has_connector("NixlConnector")` (`config/kv_transfer.py` 141-148, a
name comparison): `__post_init__` (`config/vllm.py` 1572-1590: DCP must be 1 or the
transfer TP, and "PD with decode_context_parallel_size > 1 is only supported for MLA
models") and `adjust_dcp_kv_cache_interleave_size` (3339-3388: the interleave becomes the
block size, called by the engine core, `v1/engine/core.py` 292-296). Under
"NixlPullConnector" neither runs, the interleave stays at its default 1, and the worker
still pairs whole blocks as if it were the block size (`_apply_dcp_prefix_caching`,
`nixl/base_worker.py` 3637-3694, run by `pull_worker.py` 278-297 whenever DCP is active).

Cases (block size 16, a prompt of 40 tokens, the first decode step writes token 40):
  A  GQA (8 query heads, 2 KV heads): decode TP4 DCP2 <- prefill TP2 DCP1
  A' MQA (8 query heads, 1 KV head): decode TP4 DCP4 <- prefill TP4 DCP1, the GQA shape
     that passes the DCP-size check and meets the MLA-only one
  B  MLA (a DeepSeek-V2-shaped config): decode TP4 DCP4 <- prefill TP4 DCP1, the pairing
     vLLM supports under the name "NixlConnector"; also run under that name with an
     explicit `--cp-kv-cache-interleave-size 1`, which turns the resolution off
  C  GQA: decode TP4 DCP1 <- prefill TP4 DCP2

For each, the DCP side's config is built with `EngineArgs.create_engine_config()` (on
CPU, `VLLM_TARGET_DEVICE=cpu`) under both names, with the engine core's interleave step
run on it; the decode's reads come from vLLM's `TransferTopology`, `compute_tp_mapping`
and `_apply_dcp_prefix_caching`; each read copies whole blocks (`rank_offset_factor` 0,
one head, or the MLA latent, per block on both sides). The token a slot must hold is
kvspec's CP-1 rule `interleave:I` (token t on DCP rank (t // I) % n, stored in ascending
order, as the slot mapping of `v1/worker/block_table.py` 351-375 places it), and the
number of slots attention reads is vLLM's `get_dcp_local_seq_lens`
(`v1/attention/backends/utils.py` 1166-1211). Since the DCP ranks' partial attentions
are merged, the harm is judged per KV head over its DCP group: the tokens attended, as a
multiset, against 0..40 once each.

Run with vllm==0.33.0 importable (field/run.sh: PYTHONPATH=.venv-field/engines/vllm-nixl);
exits 1 while the defect is there.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
    NixlBaseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import (
    compute_tp_mapping,
)
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens
from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
)

from kvspec.topology.tokens import CPRule

BLOCK, PROMPT = 16, 40
LLAMA = {  # GQA: 8 query heads, 2 KV heads
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}
DEEPSEEK = {  # MLA: DeepSeek-V2-shaped, dense layers only
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}


@dataclass(frozen=True)
class Case:
    name: str
    model: dict
    kv_heads: int  # as the NIXL worker counts them (MLA: 1, base_worker.py 1491)
    decode_tp: int
    decode_dcp: int
    prefill_tp: int
    prefill_dcp: int

    @property
    def mla(self) -> bool:
        return "kv_lora_rank" in self.model

    def spec(self) -> FullAttentionSpec:
        if self.mla:
            return MLAAttentionSpec(
                block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
            )
        return FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
        )


MQA = {**LLAMA, "num_key_value_heads": 1}

CASES = (
    Case("A (GQA, decode DCP2)", LLAMA, 2, 4, 2, 2, 1),
    Case("A' (MQA, decode DCP4)", MQA, 1, 4, 4, 4, 1),
    Case("B (MLA, decode DCP4)", DEEPSEEK, 1, 4, 4, 4, 1),
    Case("C (GQA, prefill DCP2)", LLAMA, 2, 4, 1, 4, 2),
)


def start(
    case: Case, directory: str, connector: str, explicit: int | None = None
) -> tuple[str, int | None]:
    """Build the DCP side's config as serving does (``explicit``: the user's
    ``--cp-kv-cache-interleave-size``), then run the engine core's interleave step on it;
    returns (what happened, the interleave its workers get)."""
    decode = case.decode_dcp > 1
    args = EngineArgs(
        model=directory,
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="bfloat16",
        tensor_parallel_size=case.decode_tp if decode else case.prefill_tp,
        decode_context_parallel_size=case.decode_dcp if decode else case.prefill_dcp,
        block_size=BLOCK,
        enforce_eager=True,
        max_model_len=1024,
        cp_kv_cache_interleave_size=explicit,
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_role="kv_consumer" if decode else "kv_producer",
            engine_id="decode" if decode else "prefill",
        ),
    )
    try:
        config = args.create_engine_config()
    except Exception as error:
        message = " ".join(str(error).split())
        return f"refused: {type(error).__name__}: {message[:200]}", None
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
    config.adjust_dcp_kv_cache_interleave_size([KVCacheGroupSpec(layers, case.spec())])
    parallel = config.parallel_config
    return (
        f"accepted (TP{parallel.tensor_parallel_size} DCP{parallel.decode_context_parallel_size}"
        f", use_mla={config.model_config.use_mla})",
        parallel.cp_kv_cache_interleave_size,
    )


def reads(case: Case) -> tuple[dict[int, list[tuple[int, int, int]]], dict[int, int]]:
    """Per decode rank its whole-block reads (local block, prefill rank, prefill block),
    indices into the request's block lists; and per prefill rank the notifications it
    waits for against the decode ranks that read it."""
    spec = case.spec()
    # A block holds block_size * dcp tokens of the request (v1/core/kv_cache_utils.py).
    local_count = -(-PROMPT // resolve_dcp_kv_block_size(spec, case.decode_dcp))
    remote_count = -(-PROMPT // resolve_dcp_kv_block_size(spec, case.prefill_dcp))
    local_ids, remote_ids = (
        list(range(100, 100 + local_count)),
        list(range(200, 200 + remote_count)),
    )
    plan: dict[int, list[tuple[int, int, int]]] = {}
    waits: dict[int, int] = {}
    readers: Counter[int] = Counter()
    for rank in range(case.decode_tp):
        topology = TransferTopology(
            tp_rank=rank,
            tp_size=case.decode_tp,
            block_size=BLOCK,
            engine_id="decode",
            is_mla=case.mla,
            is_mamba=False,
            total_num_kv_heads=case.kv_heads,
            attn_backends=[],
            dcp_size=case.decode_dcp,
        )
        mapping = compute_tp_mapping(
            topology, case.prefill_tp, (type(spec),), remote_dcp_size=case.prefill_dcp
        )
        # Whole blocks: no head offset, and one head (or the latent) per block both sides.
        assert mapping.rank_offset_factor == 0 and topology.local_physical_heads == 1
        assert max(1, case.kv_heads // case.prefill_tp) == 1
        pairs = []
        for source in mapping.all_source_ranks:
            readers[source] += 1
            waits[source] = mapping.local_consumers
            local, remote = NixlBaseConnectorWorker._apply_dcp_prefix_caching(
                None,  # reads nothing of the worker
                local_ids,
                remote_ids,
                remote_rank=source,
                local_dcp_size=case.decode_dcp,
                local_dcp_rank=topology.dcp_rank,
                remote_dcp_size=case.prefill_dcp,
                local_num_computed_blocks=0,
            )
            pairs += [
                (local_ids.index(a), source, remote_ids.index(b))
                for a, b in zip(local, remote, strict=True)
            ]
        plan[rank] = pairs
        print(
            f"    decode rank {rank}: reads prefill {list(mapping.all_source_ranks)}, "
            "(local block, prefill rank, prefill block): "
            + ", ".join(f"({a}, {q}, {b})" for a, q, b in pairs)
        )
    return plan, {q: waits[q] - readers[q] for q in waits}


def short(tokens: list[int], limit: int = 8) -> str:
    """A token list, cut after ``limit`` with the count."""
    if len(tokens) <= limit:
        return str(tokens)
    return f"[{', '.join(map(str, tokens[:limit]))}, ... ({len(tokens)} tokens)]"


def attended(
    case: Case, plan: dict[int, list[tuple[int, int, int]]], decode_i: int, prefill_i: int
) -> list[str]:
    """Per KV head, over its DCP group: what the first decode step attends, against
    tokens 0..PROMPT once each. None marks a slot NIXL never wrote (stale memory).

    GQA with DCP (FlashAttention, `flash_attn.py` 877-888 and 1516-1640) reads the
    context, tokens 0..PROMPT-1, from the cache, as many local slots as
    `get_dcp_local_seq_lens` gives for the context, and the step's own token from its
    K/V. MLA, and any decode without DCP, read the whole sequence from the cache after
    the step's token is written at its slot (`gpu_model_runner.py` 2382-2392).
    """
    seq = PROMPT + 1
    context_only = case.decode_dcp > 1 and not case.mla
    decode_rule, prefill_rule = CPRule("interleave", decode_i), CPRule("interleave", prefill_i)
    problems = []
    for group in range(case.decode_tp // case.decode_dcp):
        seen: Counter[int | None] = Counter([PROMPT] if context_only else [])
        for dcp_rank in range(case.decode_dcp):
            rank = group * case.decode_dcp + dcp_rank
            held: dict[int, int | None] = {}
            for local_block, source, prefill_block in plan[rank]:
                shard = source % case.prefill_dcp
                source_tokens = prefill_rule.tokens(shard, case.prefill_dcp, PROMPT).tokens()
                for s in range(BLOCK):
                    k = prefill_block * BLOCK + s
                    if k < len(source_tokens):
                        held[local_block * BLOCK + s] = source_tokens[k]
            owned = decode_rule.tokens(dcp_rank, case.decode_dcp, seq).tokens()
            if not context_only and PROMPT in owned:  # the step's token, at its slot
                held[owned.index(PROMPT)] = PROMPT
            count = int(
                get_dcp_local_seq_lens(
                    torch.tensor([PROMPT if context_only else seq]),
                    case.decode_dcp,
                    dcp_rank,
                    cp_kv_cache_interleave_size=decode_i,
                )[0]
            )
            seen.update(held.get(slot) for slot in range(count))
        missing = sorted(set(range(seq)) - set(seen))
        twice = sorted(t for t, n in seen.items() if t is not None and n > 1)
        if missing or twice or seen[None]:
            ranks = f"{group * case.decode_dcp}..{(group + 1) * case.decode_dcp - 1}"
            problems.append(
                f"decode ranks {ranks}: tokens never attended {short(missing)}, attended twice "
                f"{short(twice)}, stale slots attended {seen[None]}"
            )
    return problems


def main() -> int:
    same = KVConnectorFactory.get_connector_class_by_name(
        "NixlPullConnector"
    ) is KVConnectorFactory.get_connector_class_by_name("NixlConnector")
    print(f"factory: NixlPullConnector is NixlConnector: {same}")
    defect = False
    for case in CASES:
        print(f"case {case.name}:")
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump(case.model, f)
            interleave: dict[str, int | None] = {}
            for connector in ("NixlConnector", "NixlPullConnector"):
                outcome, interleave[connector] = start(case, directory, connector)
                print(f"  {connector}: {outcome}; interleave {interleave[connector]}")
        engine = interleave["NixlPullConnector"]
        if engine is None:
            continue
        plan, unsent = reads(case)
        for source, missing in unsent.items():
            if missing:
                print(f"    prefill rank {source} waits for {missing} notifications no rank sends")
        other = BLOCK if engine != BLOCK else 1
        i_decode = engine if case.decode_dcp > 1 else 1
        i_prefill = engine if case.prefill_dcp > 1 else 1
        problems = attended(case, plan, i_decode, i_prefill)
        for line in problems:
            print(f"    under interleave {engine}: {line}")
        control = attended(
            case,
            plan,
            other if case.decode_dcp > 1 else 1,
            other if case.prefill_dcp > 1 else 1,
        )
        print(
            f"    under interleave {other} instead: "
            + ("; ".join(control) if control else "every token attended once (control)")
        )
        defect |= bool(problems)
        if case.mla:
            # The documented name with an explicit interleave: "Explicit settings take
            # priority" (config/parallel.py 435-437), and nothing checks it for NIXL.
            with tempfile.TemporaryDirectory() as directory:
                with open(os.path.join(directory, "config.json"), "w") as f:
                    json.dump(case.model, f)
                outcome, explicit = start(case, directory, "NixlConnector", explicit=1)
            flag = "--cp-kv-cache-interleave-size 1"
            print(f"  NixlConnector, {flag}: {outcome}; interleave {explicit}")
            if explicit is not None:
                for line in attended(case, plan, explicit, 1):
                    print(f"    under interleave {explicit}: {line}")
    if defect:
        print("DEFECT: under NixlPullConnector the DCP ranks attend other tokens' KV")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
