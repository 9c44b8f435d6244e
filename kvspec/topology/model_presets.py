"""Named hybrid model shapes from published configurations: shapes only, each cited
[GROUP-1, GROUP-2].

Every value comes from field/research/hybrids.md §1, which says where it was read;
layer types are derived by the rule the model's config class states, never stored by
hand. Values marked UNCONFIRMED there are left out: Qwen3-Next's MTP layer count
(hybrids.md UNCONFIRMED 2) and DeepSeek-V3.2's (UNCONFIRMED 3) are not in these presets.
Llama 4's chunked local attention has no preset: its attention_chunk_size 8192 and
no_rope_layers pattern were seen only as transformers defaults and third-party copies,
never in meta-llama/Llama-4-Scout-17B-16E's own config.json.
"""

from __future__ import annotations

from collections.abc import Callable

from kvspec.topology.groups import (
    DraftAttention,
    GdnState,
    Mamba1State,
    Mamba2State,
    NoCache,
    SlidingWindow,
)
from kvspec.topology.model import ModelShape


def qwen3_next_80b_a3b() -> ModelShape:
    """Qwen3-Next-80B-A3B: 48 layers, full attention at (i+1) % 4 == 0, Gated DeltaNet on
    the rest. transformers 5.24.0 ``Qwen3NextConfig`` defaults (checkpoint
    Qwen/Qwen3-Next-80B-A3B-Instruct): 16 attention heads, 2 KV heads, head_dim 256;
    linear 16 key / 32 value heads of 128, conv kernel 4 (hybrids.md §1a)."""
    layers = tuple(0 if (i + 1) % 4 == 0 else 1 for i in range(48))
    gdn = GdnState(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4)
    return ModelShape(48, 2, 256, groups=(gdn,), layers=layers)


def jamba_v0_1() -> ModelShape:
    """ai21labs/Jamba-v0.1 config.json (hybrids.md §1b): 32 layers, attention at
    i % 8 == 4 (attn_layer_period 8, offset 4), 8 KV heads; Mamba-1 with d_state 16,
    d_conv 4 and intermediate = mamba_expand 2 x hidden 4096 = 8192 (hybrids.md §2).
    head_dim = hidden 4096 / 32 attention heads = 128 (derived; the config has no head_dim)."""
    layers = tuple(0 if i % 8 == 4 else 1 for i in range(32))
    mamba = Mamba1State(intermediate_size=8192, d_state=16, conv_kernel=4)
    return ModelShape(32, 8, 128, groups=(mamba,), layers=layers)


NEMOTRON_H_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
"""vLLM's NemotronH-v0.1 default ``hybrid_override_pattern`` (M Mamba-2, * attention,
- MLP; hybrids.md §1c)."""


def nemotron_h_like() -> ModelShape:
    """Nemotron-H-like (a mix of defaults, not one published model; hybrids.md §1c): the
    52-layer vLLM NemotronH-v0.1 pattern; attention 8 KV heads x 128; Mamba-2 of 128
    heads x 64, 8 groups, d_state 128, conv kernel 4, float32 SSM state (transformers
    5.24.0 ``NemotronHConfig`` defaults). MLP layers keep no cache."""
    kinds = {"*": 0, "M": 1, "-": 2}
    layers = tuple(kinds[c] for c in NEMOTRON_H_PATTERN)
    mamba = Mamba2State(
        num_heads=128, head_dim=64, n_groups=8, d_state=128, conv_kernel=4, ssm_dtype="float32"
    )
    return ModelShape(len(layers), 8, 128, groups=(mamba, NoCache()), layers=layers)


def gpt_oss_120b() -> ModelShape:
    """gpt-oss-120b: 36 layers, sliding window 128 at even i, full attention at odd i, 8 KV
    heads x 64 (transformers 5.24.0 ``GptOssConfig`` defaults, which match 120b;
    hybrids.md §1e)."""
    sliding = SlidingWindow(8, 64, window=128)
    layers = tuple(1 if i % 2 == 0 else 0 for i in range(36))
    return ModelShape(36, 8, 64, groups=(sliding,), layers=layers)


def deepseek_v3_mtp() -> ModelShape:
    """DeepSeek-V3 with its MTP draft layer: 61 MLA layers of latent kv_lora_rank 512 +
    qk_rope_head_dim 64 = 576, and num_nextn_predict_layers 1 draft layer at index 61, an
    MLA layer like the target's (V3-architecture config copies and vLLM docs; vLLM 0.33.0
    ``deepseek_mtp.py`` lines 106, 151; hybrids.md §1f)."""
    draft = DraftAttention(1, 576, "mla")
    return ModelShape(62, 1, 576, "mla", groups=(draft,), layers=(0,) * 61 + (1,))


def deepseek_v3_2_like() -> ModelShape:
    """DeepSeek-V3.2-like: 61 MLA layers of latent kv_lora_rank 512 + qk_rope_head_dim 64 =
    576, each with a lightning-indexer cache of index_head_dim 128 [INDEX-1]. transformers
    5.24.0 ``DeepseekV32Config`` defaults (61 layers, kv_lora_rank 512, qk_rope_head_dim 64,
    index_head_dim 128, index_n_heads 64, index_topk 2048) and DeepSeek-V3.2-Exp
    ``inference/model.py`` ``ModelArgs`` (index_head_dim 128); the entry is 128 fp8 values
    and one float32 scale, 132 bytes (vLLM ``DeepseekV32IndexerCache``, ``deepseek_v2.py``;
    hybrids.md §1d). "-like": the published config.json was not read, and its MTP layer
    count is UNCONFIRMED (hybrids.md UNCONFIRMED 3), so no draft layer. index_n_heads and
    index_topk shape the indexer's queries and selection, not its cache, so they are not
    facts here."""
    return ModelShape(61, 1, 576, "mla", index_head_dim=128)


PRESETS: dict[str, Callable[[], ModelShape]] = {
    "qwen3-next-80b-a3b": qwen3_next_80b_a3b,
    "jamba-v0.1": jamba_v0_1,
    "nemotron-h-like": nemotron_h_like,
    "gpt-oss-120b": gpt_oss_120b,
    "deepseek-v3-mtp": deepseek_v3_mtp,
    "deepseek-v3.2-like": deepseek_v3_2_like,
}
"""Preset name -> its model shape, as ``kvspec plan --model NAME`` takes it."""


def model_preset(name: str) -> ModelShape:
    """The named preset; an unknown name is refused with the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()
