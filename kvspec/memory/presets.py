"""The named cache layouts: each a :class:`CacheLayout` value with the source it was read from.

Every preset was checked against the engine's own shape code, in the release named
in its :class:`Source` (wheels downloaded from PyPI and read, or the repository read
through a code search where no wheel exists); what was not confirmed there is said in
``unconfirmed``. Nothing here is engine code: each entry states, as data, the shape,
the stride order and the record an engine's function produces [LAYOUT-5].

Engines name layouts by stride order: NHD keeps a block's slots outside its heads
(``[.., block_size, heads, head_dim]``), HND the reverse. vLLM ≥ 0.33 states one
logical shape ``[L, B, H, N, C]`` (layers, blocks, heads, slots, content bytes) and a
stride permutation per layout (``vllm/v1/kv_cache_layout.py``); kvspec stores every
tensor in its physical order and keeps the engine's logical order beside it.

The presets are two tables, :data:`LAYOUT_PRESETS` and :data:`STATE_LAYOUT_PRESETS`, one
entry per preset built with keyword arguments; :data:`PRESETS` and :data:`STATE_PRESETS`
name them in the same order. Adding a preset is adding one entry.
"""

from __future__ import annotations

from kvspec.memory.layout_model import CacheLayout, Field, Source, StateCacheLayout

_VLLM_OLD = Source(
    "vllm",
    "vllm/v1/attention/backends/flash_attn.py: FlashAttentionBackend.get_kv_cache_shape, "
    "get_kv_cache_stride_order",
    "0.10.1 and 0.22.1",
    "shape (2, num_blocks, block_size, num_kv_heads, head_size); stride order identity for "
    "NHD, (0, 1, 3, 2, 4) for HND",
)
_FLASHINFER_OLD = Source(
    "vllm",
    "vllm/v1/attention/backends/flashinfer.py: FlashInferBackend.get_kv_cache_shape, "
    "get_kv_cache_stride_order",
    "0.10.1 and 0.22.1",
    "shape (num_blocks, 2, block_size, num_kv_heads, head_size); stride order identity for "
    "NHD, (0, 1, 3, 2, 4) for HND",
    "0.22.1's nvfp4 variant (packed fp4 data and fp8 block scales in the last axis) is not "
    "modelled",
)
_VLLM_PACKED = Source(
    "vllm",
    "vllm/v1/attention/backends/flash_attn.py: FlashAttentionImpl.forward; "
    "vllm/v1/kv_cache_layout.py: KVCacheLayout; vllm/v1/kv_cache_interface.py: "
    "AttentionSpec.state_content_size_bytes, compute_layout_strides, create_kv_cache_views",
    "0.33.0",
    "per-layer cache [num_blocks, num_kv_heads, block_size, 2 * head_size], K the first "
    "head_size of the last axis and V the second (split(head_size, dim=-1)); logical "
    "[L, B, H, N, C] with stride permutations LBHNC (HND), LBNHC (NHD), BLHNC and BLNHC "
    "(blocks outermost: one cross-layer tensor)",
    "the release that first packed K and V (FIELD.md says 0.23; 0.22.1 was still kv-first) "
    "was not checked; LHBNC and BHLNC are not presets; page padding and kernel-block "
    "splitting are not modelled",
)
_VLLM_PTH = Source(
    "vllm",
    "vllm/v1/attention/backends/triton_attn.py: TritonAttentionBackend.customize_spec, "
    "TritonAttentionImpl._ensure_scale_caches",
    "0.33.0",
    "per-token-head int8/fp8 modes widen each K and V half of the last axis by one float32 "
    "scale: [K (head_size) | K scale | V (head_size) | V scale] per (head, slot), 1-byte "
    "elements; vLLM asserts head_size bytes are a multiple of 4",
    "int8 data (kvspec's cache dtypes have no int8) and int4 (two values a byte) are not "
    "modelled; that backends other than Triton use the same record was not checked",
)
_FLASHMLA_FP8 = Source(
    "vllm",
    "vllm/v1/attention/backends/mla/flashmla_sparse.py (the fp8_ds_mla format note); "
    "vllm/model_executor/layers/attention/mla_attention.py: state_content_bytes",
    "0.33.0",
    "a 656-byte token record: 512 float8_e4m3 (NoPE), 4 float32 scales (one per 128), "
    "64 bfloat16 (RoPE); one KV head slot, so the cache is [num_blocks, 1, block_size, 656]",
    "the element type vLLM views the page as is kvspec's choice here (uint8); the DeepSeek "
    "V4 (584 B), V4.1 (528 B) and nvfp4 (352 B) records are not modelled",
)
_VLLM_MLA_OLD = Source(
    "vllm",
    "vllm/v1/attention/backends/mla/common.py: MLACommonBackend.get_kv_cache_shape",
    "0.10.1",
    "shape (num_blocks, block_size, head_size), head_size the latent width (num_kv_heads 1)",
)
_VLLM_MLA = Source(
    "vllm",
    "vllm/v1/kv_cache_interface.py: MLAAttentionSpec (num_kv_heads 1, head_size_v 0), "
    "create_kv_cache_views",
    "0.33.0",
    "per-layer view [num_blocks, 1, block_size, latent] in the dense (non-fp8_ds_mla) case",
)
_SGLANG_MHA = Source(
    "sglang",
    "sglang/srt/mem_cache/memory_pool.py: MHATokenToKVPool._kv_buffer_shapes, "
    "_create_buffers_normal",
    "0.5.23",
    "per layer a K and a V buffer [size + page_size, head_num, head_dim] (row = token slot; "
    "the first page is the padding page); under SGLANG_USE_HND_KVCACHE [num_pages, head_num, "
    "page_size, head_dim]",
    "the vectorized_5d layout is not modelled; when K and V shapes agree SGLang allocates "
    "them as the two halves of one [2, rows, ...] tensor, which a connector may register as "
    "one region: here each is its own region",
)
_SGLANG_MLA = Source(
    "sglang",
    "sglang/srt/mem_cache/memory_pool.py: MLATokenToKVPool._create_buffers",
    "0.5.23",
    "per layer [size + page_size, 1, kv_lora_rank + qk_rope_head_dim]",
    "the fp8 DSA record (override_kv_cache_dim) was not checked and is not a preset",
)
_TRTLLM = Source(
    "TensorRT-LLM",
    "tensorrt_llm/_torch/pyexecutor/resource_manager.py: KVCacheManager.get_buffers; "
    "cpp/tensorrt_llm/kernels/kvCacheUtils.h: KVBlockArray::getKVLocalIdx",
    "main branch as indexed in 2026 (read through code search; the PyPI package is a stub)",
    "primary pool [num_pages, num_layers, kv_factor, page_size * num_kv_heads * head_dim]; "
    "the C++ kernels address a block as head * tokens_per_block * dims + token * dims + "
    "channel (HND: tokens-per-block inside heads)",
    "no release was pinned; get_buffers also offers an NHD view of the same bytes, which "
    "some Python backends use; pools with per-layer head counts (VGQA) are not modelled",
)


# Axis orders and records several presets share.
_KV_FIRST = ("kv", "blocks", "slots", "heads", "dim")
_BLOCKS_FIRST = ("blocks", "kv", "slots", "heads", "dim")
_PACKED = ("blocks", "heads", "slots", "dim")  # vLLM's logical per-layer order
_PACKED_LAYERS = ("layers", "blocks", "heads", "slots", "dim")
_KV_PACKED = (Field("k"), Field("v"))
_PTH = (
    Field("k"),
    Field("k_scale", "float32", 1),
    Field("v"),
    Field("v_scale", "float32", 1),
)
_FLASHMLA = (
    Field("nope", "float8_e4m3fn", 512),
    Field("nope_scale", "float32", 4),
    Field("rope", "bfloat16", 64),
)

LAYOUT_PRESETS: tuple[CacheLayout, ...] = (
    # kvspec's first seven: the 2025 forms, kept by name.
    CacheLayout(
        name="flash_attn",
        shape="[2, num_blocks, block_size, heads, head_dim]",
        axes=_KV_FIRST,
        kv_tensors=2,
        tuple_form=False,
        source=_VLLM_OLD,
    ),
    CacheLayout(
        name="flash_attn_hnd",
        shape="[2, num_blocks, heads, block_size, head_dim]",
        axes=("kv", "blocks", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=False,
        logical=_KV_FIRST,
        source=_VLLM_OLD,
    ),
    CacheLayout(
        name="flashinfer",
        shape="[num_blocks, 2, block_size, heads, head_dim]",
        axes=_BLOCKS_FIRST,
        kv_tensors=2,
        tuple_form=False,
        source=_FLASHINFER_OLD,
    ),
    CacheLayout(
        name="flashinfer_hnd",
        shape="[num_blocks, 2, heads, block_size, head_dim]",
        axes=("blocks", "kv", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=False,
        logical=_BLOCKS_FIRST,
        source=_FLASHINFER_OLD,
    ),
    CacheLayout(
        name="kv_tuple",
        shape="(K, V), each [num_blocks, block_size, heads, head_dim]",
        axes=("blocks", "slots", "heads", "dim"),
        kv_tensors=2,
        tuple_form=True,
    ),
    CacheLayout(
        name="mla",
        shape="[num_blocks, block_size, latent]",
        axes=("blocks", "slots", "dim"),
        kv_tensors=1,
        tuple_form=False,
        source=_VLLM_MLA_OLD,
    ),
    CacheLayout(
        name="token_major",
        shape="(K, V), each [seq, heads, head_dim]; MLA: (latent,) as [seq, 1, latent]",
        axes=("blocks", "heads", "dim"),
        kv_tensors=None,
        tuple_form=True,
    ),
    # What engines run now.
    CacheLayout(
        name="vllm_packed_hnd",
        shape="[num_blocks, heads, block_size, 2*head_dim] (K | V in the last axis)",
        axes=_PACKED,
        kv_tensors=2,
        tuple_form=False,
        record=_KV_PACKED,
        source=_VLLM_PACKED,
    ),
    CacheLayout(
        name="vllm_packed_nhd",
        shape="[num_blocks, block_size, heads, 2*head_dim] (K | V in the last axis)",
        axes=("blocks", "slots", "heads", "dim"),
        kv_tensors=2,
        tuple_form=False,
        record=_KV_PACKED,
        logical=_PACKED,
        source=_VLLM_PACKED,
    ),
    CacheLayout(
        name="vllm_mla",
        shape="[num_blocks, 1, block_size, latent]",
        axes=("blocks", "heads", "slots", "dim"),
        kv_tensors=1,
        tuple_form=False,
        source=_VLLM_MLA,
    ),
    CacheLayout(
        name="sglang_mha",
        shape="(K, V), each [num_pages*page_size, heads, head_dim] (row = token slot)",
        axes=("tokens", "heads", "dim"),
        kv_tensors=2,
        tuple_form=True,
        source=_SGLANG_MHA,
    ),
    CacheLayout(
        name="sglang_mha_hnd",
        shape="(K, V), each [num_pages, heads, page_size, head_dim]",
        axes=("blocks", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=True,
        source=_SGLANG_MHA,
    ),
    CacheLayout(
        name="sglang_mla",
        shape="[num_pages*page_size, 1, latent] (row = token slot)",
        axes=("tokens", "heads", "dim"),
        kv_tensors=1,
        tuple_form=False,
        source=_SGLANG_MLA,
    ),
    # Inline scales and fixed-format records [LAYOUT-6].
    CacheLayout(
        name="vllm_pth_hnd",
        shape="[num_blocks, heads, block_size, 2*(head_dim+4)] bytes: K | K scale | V | V scale",
        axes=_PACKED,
        kv_tensors=2,
        tuple_form=False,
        record=_PTH,
        source=_VLLM_PTH,
        dtypes=("float8_e4m3fn",),
    ),
    CacheLayout(
        name="vllm_pth_nhd",
        shape="[num_blocks, block_size, heads, 2*(head_dim+4)] bytes: K | K scale | V | V scale",
        axes=("blocks", "slots", "heads", "dim"),
        kv_tensors=2,
        tuple_form=False,
        record=_PTH,
        logical=_PACKED,
        source=_VLLM_PTH,
        dtypes=("float8_e4m3fn",),
    ),
    CacheLayout(
        name="flashmla_fp8",
        shape="[num_blocks, 1, block_size, 656] bytes: 512 fp8 NoPE | 4 fp32 scales | 64 bf16 RoPE",
        axes=("blocks", "heads", "slots", "dim"),
        kv_tensors=1,
        tuple_form=False,
        record=_FLASHMLA,
        element="uint8",
        source=_FLASHMLA_FP8,
        dtypes=("float8_e4m3fn",),
        fixed_head_dim=576,
    ),
    # One tensor holds every layer [LAYOUT-5].
    CacheLayout(
        name="vllm_packed_hnd_layers",
        shape="[num_blocks, layers, heads, block_size, 2*head_dim] (BLHNC)",
        axes=("blocks", "layers", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=False,
        record=_KV_PACKED,
        logical=_PACKED_LAYERS,
        per_layer="vllm_packed_hnd",
        source=_VLLM_PACKED,
    ),
    CacheLayout(
        name="vllm_packed_nhd_layers",
        shape="[num_blocks, layers, block_size, heads, 2*head_dim] (BLNHC)",
        axes=("blocks", "layers", "slots", "heads", "dim"),
        kv_tensors=2,
        tuple_form=False,
        record=_KV_PACKED,
        logical=_PACKED_LAYERS,
        per_layer="vllm_packed_nhd",
        source=_VLLM_PACKED,
    ),
    CacheLayout(
        name="trtllm_pool",
        shape="[num_blocks, layers, 2, heads, block_size, head_dim]",
        axes=("blocks", "layers", "kv", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=False,
        per_layer="flashinfer_hnd",
        source=_TRTLLM,
    ),
)
"""The cache layout presets, one entry each, in the order candidates are listed: adding a
preset is adding an entry here, with the :class:`Source` it was confirmed in
[LAYOUT-1, LAYOUT-5, LAYOUT-6]."""

PRESETS: dict[str, CacheLayout] = {layout.name: layout for layout in LAYOUT_PRESETS}
"""Every named layout, in the order candidates are listed [LAYOUT-1, LAYOUT-5]."""


_VLLM_STATE = (
    "vllm/model_executor/layers/mamba/mamba_utils.py: get_conv_state_layout, "
    "is_conv_state_dim_first, MambaStateShapeCalculator._orient_conv_shape; "
    "vllm/v1/worker/gpu_model_runner.py: _reshape_kv_cache_tensors (MambaSpec branch); "
    "vllm/envs.py: VLLM_SSM_CONV_STATE_LAYOUT"
)
_VLLM_STATE_CONFIRMED = (
    "ConvStateLayoutType = Literal['SD', 'DS'], chosen by VLLM_SSM_CONV_STATE_LAYOUT, 'SD' when "
    "unset; _orient_conv_shape(dim, state_len) gives (dim, state_len) for DS and (state_len, dim) "
    "for SD, dim the rank's conv channels (x|B|C or Q|K|V), state_len conv_kernel - 1 + "
    "num_spec; the kernels index the conv state dim first (an SD state is transposed on the "
    "way in). Per layer one buffer of num_blocks pages: each state tensor is "
    "as_strided((num_blocks, *shape)) with block stride page_size_bytes / itemsize and a "
    "storage offset that is the bytes of the tensors before it (conv, then temporal)"
)


STATE_LAYOUT_PRESETS: tuple[StateCacheLayout, ...] = (
    StateCacheLayout(
        name="vllm_conv_sd",
        shape="per block: conv [state_len, dim] | temporal [units, width] (vLLM's default)",
        conv_axes=("blocks", "state_len", "dim"),
        source=Source(
            project="vllm",
            file=_VLLM_STATE,
            version="0.33.0 (field/research/hybrids.md §2; read through code search)",
            confirmed=_VLLM_STATE_CONFIRMED,
            unconfirmed="the page padding to the attention page (page_size_padded) is an input "
            "here, not derived; ReplaySSM's extra ring buffers and KDA are not modelled",
        ),
    ),
    StateCacheLayout(
        name="vllm_conv_ds",
        shape="per block: conv [dim, state_len] | temporal [units, width] "
        "(VLLM_SSM_CONV_STATE_LAYOUT=DS)",
        conv_axes=("blocks", "dim", "state_len"),
        source=Source(
            project="vllm",
            file=_VLLM_STATE
            + "; vllm/distributed/kv_transfer/kv_connector/v1/ssm_conv_transfer_utils.py",
            version="0.33.0 (field/research/hybrids.md §2-3; read through code search)",
            confirmed=_VLLM_STATE_CONFIRMED
            + "; the NIXL 3-read heterogeneous-TP conv transfer asserts DS: 'With DS conv "
            "state layout (dim, state_len), x/B/C sub-projections are contiguous in memory'",
            unconfirmed="the page padding to the attention page (page_size_padded) is an input "
            "here, not derived",
        ),
    ),
)
"""The state-cache layout presets, one entry each [SLAYOUT-1]."""

STATE_PRESETS: dict[str, StateCacheLayout] = {
    layout.name: layout for layout in STATE_LAYOUT_PRESETS
}
"""Every named state-cache layout [SLAYOUT-1]."""
