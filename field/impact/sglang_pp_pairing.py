"""Impact sweep: SGLang's PP layer pairing over real deployments, under SGLang's default split.

For each real model (layer count, KV heads and attention kind from its Hugging Face
``config.json``, sources below) x prefill PP in (2, 3, 4, 8) x decode PP (1, and equal to
the prefill's) at TP8 on both sides, this asks SGLang's own code, through kvspec's
adapter (kvspec/adapters/sglang.py, sglang 0.5.23):

- whether SGLang starts with the deployment (``SglangAdapter.serving_accepts``: each
  side's ``ServerArgs`` resolution and ``check_server_args``, the model-load checks, the
  decode's ``_resolve_rank_mapping``);
- where each prefill K and V layer buffer is written on the decode side
  (``CommonKVManager.get_mha_kv_ptrs_with_pp`` / ``get_mla_kv_ptrs_with_pp``, layer ids in
  place of addresses), each stage's layers given by ``get_pp_indices`` with
  ``SGLANG_PP_LAYER_PARTITION`` unset (SGLang's default: extra layers on the last stages).

Counted per decode TP rank (every TP rank pairs layers the same way): K and V writes that
land in another buffer than their own (another layer, or K<->V), and decode buffers that
end with nothing from their own prefill buffer. Upstream: sgl-project/sglang#27740.

Run: PYTHONPATH=.venv-field/engines/sglang .venv-field/bin/python field/impact/sglang_pp_pairing.py
Writes field/impact/sglang_pp_pairing.json next to this file and prints a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvspec.adapters.sglang import SglangAdapter
from kvspec.strategies import TransferCase
from kvspec.topology.field_policies import SGLANG
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

MODELS: tuple[tuple[str, int, int, str, str], ...] = (
    # name, num_hidden_layers, num_key_value_heads, attention, where the config was read
    ("Llama-3.1-8B", 32, 8, "mha", "config.json copy: citsjtu2020/LLM-Prof sglang/Model_Config.md"),
    ("Llama-3.1-70B", 80, 8, "mha", "oumi configs/recipes/llama3_1/README.md (80 layers, 8 KV)"),
    ("Qwen2.5-72B", 80, 8, "mha", "Qwen2ForCausalLM config.json copy (hidden 8192, 29568)"),
    ("Mixtral-8x7B", 32, 8, "mha", "MixtralForCausalLM config.json copy (32 layers, 8 KV)"),
    ("gpt-oss-120b", 36, 8, "mha", "GptOssConfig 120b values (36 layers, 8 KV); second-hand"),
    ("Qwen2.5-32B", 64, 8, "mha", "Qwen/Qwen2.5-32B model card: 64 layers, 8 KV heads"),
    ("Qwen3-235B-A22B", 94, 4, "mha", "Qwen/Qwen3-235B-A22B model card: 94 layers, 4 KV"),
    ("DeepSeek-V3", 61, 1, "mla", "DeepSeek-V3 config.json: num_hidden_layers 61, MLA"),
    # not a real model: DeepSeek-V3's layer count on a plain-MHA pool, to test that claim
    ("61-layer MHA (synthetic)", 61, 8, "mha", "none: a layer-count check, not a real model"),
)
PREFILL_PP = (2, 3, 4, 8)
TP = 8
OUT = Path(__file__).with_suffix(".json")


def stage(adapter: SglangAdapter, tp: int, pp: int, num_layers: int) -> StageLayout:
    split = adapter.layer_partition(num_layers, pp) if pp > 1 else None
    return StageLayout(tp, pp, layer_partition=tuple(split) if split else None)


def sweep_one(adapter: SglangAdapter, model: tuple, prefill_pp: int, decode_pp: int) -> dict:
    name, layers, kv_heads, attention, source = model
    shape = ModelShape.mla(layers, 2) if attention == "mla" else ModelShape(layers, kv_heads, 2)
    case = TransferCase(
        stage(adapter, TP, prefill_pp, layers),
        stage(adapter, TP, decode_pp, layers),
        shape,
        SGLANG,
    )
    row = {
        "model": name,
        "num_layers": layers,
        "num_kv_heads": kv_heads,
        "attention": attention,
        "config_source": source,
        "prefill": {
            "tp": TP,
            "pp": prefill_pp,
            "split": adapter.layer_partition(layers, prefill_pp),
        },
        "decode": {"tp": TP, "pp": decode_pp, "split": adapter.layer_partition(layers, decode_pp)},
    }
    verdict = adapter.serving_accepts(case.to_dict())
    row["sglang_starts"] = verdict.accepted
    row["start_evidence"] = verdict.evidence
    kinds = "KV" if shape.kv_tensors == 2 else "L"  # an MLA latent is one buffer per layer
    wrong = dict.fromkeys(kinds, 0)
    total = dict.fromkeys(kinds, 0)
    never = clobbered = 0
    for dst_pp in range(decode_pp):
        dst = dst_pp * TP  # decode TP rank 0 of each decode stage
        written: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for writes in adapter.layer_writes(case, dst).values():
            for (src_kv, src_layer), (dst_kv, dst_layer) in writes:
                kind = kinds[src_kv]
                total[kind] += 1
                if (src_kv, src_layer) != (dst_kv, dst_layer):
                    wrong[kind] += 1
                written.setdefault((dst_kv, dst_layer), []).append((src_kv, src_layer))
        for layer in adapter._layers(case.target, layers, dst_pp):
            for kv in range(len(kinds)):
                got = written.get((kv, layer), [])
                never += (kv, layer) not in got
                clobbered += any(w != (kv, layer) for w in got) and (kv, layer) in got
    row["writes"] = total
    row["misrouted_writes"] = wrong
    row["decode_buffers_without_their_layer"] = never
    row["decode_buffers_also_written_by_another"] = clobbered
    row["hit"] = bool(sum(wrong.values()) or never or clobbered)
    return row


def main() -> int:
    adapter = SglangAdapter()
    rows = [
        sweep_one(adapter, model, pp, decode_pp)
        for model in MODELS
        for pp in PREFILL_PP
        for decode_pp in sorted({1, pp})
    ]
    OUT.write_text(
        json.dumps(
            {
                "engine": adapter.version,
                "split": "SGLang default (get_pp_indices, SGLANG_PP_LAYER_PARTITION unset)",
                "tp": TP,
                "upstream": "sgl-project/sglang#27740",
                "deployments": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"{'model':24} {'layers':>6} {'P->D PP':>8} {'split':24} {'starts':>6} "
        f"{'K wrong':>8} {'V wrong':>8} {'unwritten':>9} {'clobbered':>9}"
    )
    for r in rows:
        wrong = r["misrouted_writes"]
        split = ",".join(map(str, r["prefill"]["split"]))
        print(
            f"{r['model']:24} {r['num_layers']:>6} {r['prefill']['pp']:>3}->{r['decode']['pp']:<3} "
            f"{split:24} {'yes' if r['sglang_starts'] else 'no':>6} "
            f"{wrong.get('K', wrong.get('L', 0)):>8} {wrong.get('V', '-'):>8} "
            f"{r['decode_buffers_without_their_layer']:>9} "
            f"{r['decode_buffers_also_written_by_another']:>9}"
        )
    hits = [r for r in rows if r["hit"] and r["sglang_starts"]]
    print(f"{len(hits)} of {len(rows)} deployments SGLang starts with misroute KV; see {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
