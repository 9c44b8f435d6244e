"""Impact sweep: SGLang's PP layer pairing over real deployments, under SGLang's default split.

For each real model (layer count, KV heads, attention kind and, for sliding-window
hybrids, which layers are full attention, from its Hugging Face ``config.json``, sources
below) x every TP in (1, 2, 4, 8) its KV heads allow x prefill PP in (2, 3, 4, 8) x decode
PP (1, and equal to the prefill's), decode TP equal to the prefill's, this asks SGLang's
own code (sglang 0.5.23):

- whether SGLang starts with the deployment (kvspec's adapter,
  ``SglangAdapter.serving_accepts``: each side's ``ServerArgs`` resolution and
  ``check_server_args``, the model-load checks, the decode's ``_resolve_rank_mapping``);
- where each prefill K and V layer buffer is written on the decode side
  (``CommonKVManager.get_mha_kv_ptrs_with_pp`` / ``get_mla_kv_ptrs_with_pp``), each
  stage's layers given by ``get_pp_indices`` with ``SGLANG_PP_LAYER_PARTITION`` unset
  (SGLang's default: extra layers on the last stages).

Plain MHA and MLA models run through the adapter (a pool whose start layer is the stage's
first layer, layer ids in place of addresses). Sliding-window hybrids (gpt-oss) are served
on ``SWAKVPool`` (``mem_cache/swa_memory_pool.py``): here each stage's pool is built with
SGLang's own class on CPU, its layers from SGLang's ``get_hybrid_layer_ids``
(``configs/model_config.py``) restricted to the stage's layers as
``_resolve_local_hybrid_swa_layer_ids`` does (``model_runner_components/layer_setup.py``),
and the pairing is called with the pool's real buffer addresses and the start layer
serving passes: ``_transfer_start_layer`` (``disaggregation/prefill.py``) returns
``pool.start_layer`` for every pool but ``HybridLinearKVPool``, and ``SWAKVPool`` sets it
to 0 on every stage; ``build_kv_layer_ids`` (``disaggregation/utils.py``) publishes no
layer ids for it, so the transfer pairs by position (``mooncake/conn.py``
``_send_kvcache_generic``). The full-attention KV (``get_contiguous_buf_infos``) and the
sliding-window KV (``get_state_buf_infos``, sent through the same pairing as state) are
counted apart.

TP does not change the pairing (every TP rank pairs layers the same way; the sweep
checks that each TP gives the same writes), so deployments are counted per (model,
prefill PP, decode PP); the TPs each was started with are listed. Counted per decode TP
rank: K and V writes that land in another buffer than their own (another layer, or
K<->V), decode buffers that end with nothing from their own prefill buffer, and the
prefill stages with a misrouted write. A synthetic 61-layer MHA model (DeepSeek-V3's layer
count on a plain pool) is kept apart from the real models. Upstream:
sgl-project/sglang#27740, #33457.

Run: PYTHONPATH=.venv-field/engines/sglang .venv-field/bin/python field/impact/sglang_pp_pairing.py
Writes field/impact/sglang_pp_pairing.json next to this file and prints a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvspec.adapters.sglang import SglangAdapter
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import SGLANG
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

Model = tuple[str, int, int, str, str]
MODELS: tuple[Model, ...] = (
    # name, num_hidden_layers, num_key_value_heads, attention, where the config was read
    ("Llama-3.1-8B", 32, 8, "mha", "config.json copy: citsjtu2020/LLM-Prof sglang/Model_Config.md"),
    ("Llama-3.1-70B", 80, 8, "mha", "oumi configs/recipes/llama3_1/README.md (80 layers, 8 KV)"),
    ("Llama-3.1-405B", 126, 8, "mha", "meta-llama/Llama-3.1-405B config.json: 126 layers, 8 KV"),
    ("Qwen2.5-72B", 80, 8, "mha", "Qwen2ForCausalLM config.json copy (hidden 8192, 29568)"),
    ("Mixtral-8x7B", 32, 8, "mha", "MixtralForCausalLM config.json copy (32 layers, 8 KV)"),
    ("Qwen2.5-32B", 64, 8, "mha", "Qwen/Qwen2.5-32B model card: 64 layers, 8 KV heads"),
    ("Qwen3-235B-A22B", 94, 4, "mha", "Qwen/Qwen3-235B-A22B model card: 94 layers, 4 KV"),
    ("DeepSeek-V3", 61, 1, "mla", "DeepSeek-V3 config.json: num_hidden_layers 61, MLA"),
    # sliding-window hybrids, served on SWAKVPool: layer_types from transformers'
    # GptOssConfig (even layers sliding, odd layers full attention)
    ("gpt-oss-20b", 24, 8, "swa", "openai/gpt-oss-20b config.json: 24 layers, 8 KV, layer_types"),
    ("gpt-oss-120b", 36, 8, "swa", "GptOssConfig 120b values (36 layers, 8 KV); layer_types"),
)
SYNTHETIC: tuple[Model, ...] = (
    # not a real model: DeepSeek-V3's layer count on a plain-MHA pool, to test that claim
    ("61-layer MHA (synthetic)", 61, 8, "mha", "none: a layer-count check, not a real model"),
)
PREFILL_PP = (2, 3, 4, 8)
TPS = (1, 2, 4, 8)
OUT = Path(__file__).with_suffix(".json")


def stage(adapter: SglangAdapter, tp: int, pp: int, num_layers: int) -> StageLayout:
    split = adapter.layer_partition(num_layers, pp) if pp > 1 else None
    return StageLayout(tp, pp, layer_partition=tuple(split) if split else None)


def tps_for(model: Model) -> list[int]:
    """The TPs the model's KV heads allow (every TP for MLA, whose latent is replicated)."""
    _, _, kv_heads, attention, _ = model
    return [tp for tp in TPS if attention == "mla" or kv_heads % tp == 0 or tp % kv_heads == 0]


def case_of(adapter: SglangAdapter, model: Model, tp: int, prefill_pp: int, decode_pp: int):
    _, layers, kv_heads, attention, _ = model
    shape = ModelShape.mla(layers, 2) if attention == "mla" else ModelShape(layers, kv_heads, 2)
    return TransferCase(
        stage(adapter, tp, prefill_pp, layers),
        stage(adapter, tp, decode_pp, layers),
        shape,
        SGLANG,
    )


def adapter_writes(adapter: SglangAdapter, case: TransferCase, decode_pp: int) -> dict:
    """Decode stage -> prefill stage -> [((K/V or L, prefill layer), (K/V, decode layer))],
    through the adapter (plain MHA and MLA pools: start layer = the stage's first layer)."""
    tp = case.target.tp
    out: dict[int, dict[int, list]] = {}
    for dst_pp in range(decode_pp):
        for src, writes in adapter.layer_writes(case, dst_pp * tp).items():
            src_pp = src // case.source.tp
            out.setdefault(dst_pp, {}).setdefault(src_pp, []).extend(writes)
    return out


def swa_pools(layers: int, split: list[int]) -> list[Any]:
    """One SGLang ``SWAKVPool`` per stage on CPU (one slot, one head of one element), its
    layers as serving gives them: ``get_hybrid_layer_ids`` for GptOssForCausalLM, kept to
    the stage's own layers."""
    import torch
    from sglang.srt.configs.model_config import get_hybrid_layer_ids
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from transformers import GptOssConfig

    swa_ids, full_ids = get_hybrid_layer_ids(
        ["GptOssForCausalLM"], GptOssConfig(num_hidden_layers=layers)
    )
    pools, start = [], 0
    for count in split:
        owned = range(start, start + count)
        start += count
        pools.append(
            SWAKVPool(
                size=4,
                size_swa=4,
                page_size=1,
                dtype=torch.float32,
                head_num=1,
                head_dim=1,
                swa_attention_layer_ids=[i for i in swa_ids if i in owned],
                full_attention_layer_ids=[i for i in full_ids if i in owned],
                device="cpu",
            )
        )
    return pools


def labels(sub_pool: Any) -> dict[int, tuple[int, int]]:
    """Buffer address -> (0 for K or 1 for V, global layer) of one MHA sub-pool."""
    ids = sub_pool.model_layer_ids
    out = {b.data_ptr(): (0, ids[i]) for i, b in enumerate(sub_pool.k_buffer)}
    out |= {b.data_ptr(): (1, ids[i]) for i, b in enumerate(sub_pool.v_buffer)}
    return out


def swa_writes(model: Model, prefill_pp: int, decode_pp: int, adapter: SglangAdapter) -> dict:
    """Part ("full" / "swa") -> decode stage -> prefill stage -> writes, on SGLang's own
    SWAKVPool and ``get_mha_kv_ptrs_with_pp``, with the start layer serving passes
    (``pool.start_layer``: 0 on every stage)."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    _, layers, _, _, _ = model
    prefill = swa_pools(layers, adapter.layer_partition(layers, prefill_pp))
    decode = swa_pools(layers, adapter.layer_partition(layers, decode_pp))
    out: dict[str, dict[int, dict[int, list]]] = {"full": {}, "swa": {}}
    for part, sub, infos in (
        ("full", "full_kv_pool", "get_contiguous_buf_infos"),
        ("swa", "swa_kv_pool", "get_state_buf_infos"),
    ):
        for dst_pp, dst_pool in enumerate(decode):
            dst_ptrs = getattr(dst_pool, infos)()[0]
            dst_label = labels(getattr(dst_pool, sub))
            # decode PP1 reads every prefill stage; equal PP reads its own stage
            sources = range(prefill_pp) if decode_pp == 1 else [dst_pp]
            for src_pp in sources:
                src_pool = prefill[src_pp]
                src_ptrs = getattr(src_pool, infos)()[0]
                src_label = labels(getattr(src_pool, sub))
                manager = SimpleNamespace(
                    kv_args=SimpleNamespace(prefill_start_layer=src_pool.start_layer)
                )
                sk, sv, dk, dv, n = CommonKVManager.get_mha_kv_ptrs_with_pp(
                    manager, src_ptrs, dst_ptrs
                )
                out[part].setdefault(dst_pp, {})[src_pp] = [
                    (src_label[s], dst_label[d])
                    for s_list, d_list in ((sk, dk), (sv, dv))
                    for s, d in zip(s_list[:n], d_list[:n], strict=True)
                ]
    return out


def counts(writes: dict, decode_layers: dict[int, list[tuple[int, int]]], kinds: str) -> dict:
    """Misrouted writes by kind, decode buffers without their own layer, buffers also
    written by another, and the prefill stages with a misrouted write."""
    wrong = dict.fromkeys(kinds, 0)
    total = dict.fromkeys(kinds, 0)
    never = clobbered = 0
    stages_hit: set[int] = set()
    for dst_pp, by_src in writes.items():
        written: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for src_pp, pairs in by_src.items():
            for src, dst in pairs:
                total[kinds[src[0]]] += 1
                if src != dst:
                    wrong[kinds[src[0]]] += 1
                    stages_hit.add(src_pp)
                written.setdefault(dst, []).append(src)
        for buffer in decode_layers[dst_pp]:
            got = written.get(buffer, [])
            never += buffer not in got
            clobbered += buffer in got and any(w != buffer for w in got)
    return {
        "writes": total,
        "misrouted_writes": wrong,
        "decode_buffers_without_their_layer": never,
        "decode_buffers_also_written_by_another": clobbered,
        "prefill_stages_hit": len(stages_hit),
    }


def sweep_one(adapter: SglangAdapter, model: Model, prefill_pp: int, decode_pp: int) -> dict:
    name, layers, kv_heads, attention, source = model
    row: dict[str, Any] = {
        "model": name,
        "num_layers": layers,
        "num_kv_heads": kv_heads,
        "attention": attention,
        "config_source": source,
        "prefill": {"pp": prefill_pp, "split": adapter.layer_partition(layers, prefill_pp)},
        "decode": {"pp": decode_pp, "split": adapter.layer_partition(layers, decode_pp)},
    }
    started, evidence, seen = [], {}, set()
    for tp in tps_for(model):
        case = case_of(adapter, model, tp, prefill_pp, decode_pp)
        verdict = adapter.serving_accepts(case.to_dict())
        evidence[f"tp{tp}"] = verdict.evidence
        if not verdict.accepted:
            continue
        started.append(tp)
        if attention != "swa":  # the SWA pool's pairing does not depend on TP at all
            writes = adapter_writes(adapter, case, decode_pp)
            seen.add(json.dumps({k: v for k, v in sorted(writes.items())}, sort_keys=True))
    if len(seen) > 1:
        raise SystemExit(f"{name} PP{prefill_pp}->PP{decode_pp}: the TPs pair differently")
    row["tp_started"] = started
    row["sglang_starts"] = bool(started)
    row["start_evidence"] = evidence
    if not started:
        row["hit"] = False
        return row
    if attention == "swa":
        parts = swa_writes(model, prefill_pp, decode_pp, adapter)
        pools = swa_pools(layers, adapter.layer_partition(layers, decode_pp))
        for part, sub in (("full", "full_kv_pool"), ("swa", "swa_kv_pool")):
            decode_layers = {
                p: sorted(labels(getattr(pool, sub)).values()) for p, pool in enumerate(pools)
            }
            row[f"{part}_attention"] = counts(parts[part], decode_layers, "KV")
        row["pool"] = "SWAKVPool (start layer 0 on every stage, no layer ids)"
        row["hit"] = any(
            sum(row[f"{p}_attention"]["misrouted_writes"].values()) for p in ("full", "swa")
        )
        return row
    case = case_of(adapter, model, started[0], prefill_pp, decode_pp)
    kinds = "KV" if case.model.kv_tensors == 2 else "L"
    decode_layers = {
        p: [
            (kv, layer)
            for layer in adapter._layers(case.target, layers, p)
            for kv in range(len(kinds))
        ]
        for p in range(decode_pp)
    }
    row |= counts(adapter_writes(adapter, case, decode_pp), decode_layers, kinds)
    row["pool"] = "MLA pool" if attention == "mla" else "MHATokenToKVPool (no layer ids)"
    row["hit"] = bool(
        sum(row["misrouted_writes"].values()) or row["decode_buffers_without_their_layer"]
    )
    return row


def sweep(adapter: SglangAdapter, models: tuple[Model, ...]) -> list[dict]:
    return [
        sweep_one(adapter, model, pp, decode_pp)
        for model in models
        for pp in PREFILL_PP
        for decode_pp in sorted({1, pp})
    ]


def summary(rows: list[dict], synthetic: list[dict]) -> str:
    started = [r for r in rows if r["sglang_starts"]]
    hit = [r for r in started if r["hit"]]
    dense = sorted({r["model"] for r in hit if r["attention"] != "swa"})
    swa = sorted({r["model"] for r in hit if r["attention"] == "swa"})
    every = sorted(
        {
            f"{r['model']} PP{r['prefill']['pp']}"
            for r in hit
            if r["attention"] != "swa" and r["prefill_stages_hit"] == r["prefill"]["pp"]
        }
    )
    syn = [r for r in synthetic if r["sglang_starts"] and r["hit"]]
    return (
        f"{len(hit)} of {len(started)} real-model deployments SGLang starts hit it "
        f"(model x prefill PP x decode PP, any TP the heads allow): plain MHA "
        f"{', '.join(dense) or 'none'}, V only, decode PP1 only, every stage hit in "
        f"{', '.join(every) or 'none'}; sliding-window hybrids (SWAKVPool, K and V, even "
        f"splits too) {', '.join(swa) or 'none'}. Kept apart: a synthetic 61-layer MHA "
        f"model, {len(syn)} of {sum(r['sglang_starts'] for r in synthetic)}"
    )


def main() -> int:
    adapter = SglangAdapter()
    rows = sweep(adapter, MODELS)
    synthetic = sweep(adapter, SYNTHETIC)
    OUT.write_text(
        json.dumps(
            {
                "engine": adapter.version,
                "split": "SGLang default (get_pp_indices, SGLANG_PP_LAYER_PARTITION unset)",
                "tp": "every TP in 1, 2, 4, 8 the KV heads allow, decode TP = prefill TP",
                "upstream": "sgl-project/sglang#27740, sgl-project/sglang#33457",
                "summary": summary(rows, synthetic),
                "deployments": rows,
                "synthetic": synthetic,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"{'model':26} {'P->D PP':>8} {'split':24} {'TPs':>10} "
        f"{'K wrong':>8} {'V wrong':>8} {'stages':>6}"
    )
    for r in rows + synthetic:
        split = ",".join(map(str, r["prefill"]["split"]))
        for part in ("full_attention", "swa_attention") if r["attention"] == "swa" else (None,):
            got = r.get(part, r) if part else r
            wrong = got.get("misrouted_writes", {})
            label = r["model"] + (f" [{part.split('_')[0]}]" if part else "")
            print(
                f"{label:26} {r['prefill']['pp']:>3}->{r['decode']['pp']:<3} {split:24} "
                f"{','.join(map(str, r['tp_started'])) or 'no':>10} "
                f"{wrong.get('K', wrong.get('L', 0)):>8} {wrong.get('V', '-'):>8} "
                f"{got.get('prefill_stages_hit', '-'):>6}"
            )
    print(summary(rows, synthetic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
