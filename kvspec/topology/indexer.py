"""The sparse indexer cache of an MLA group: DeepSeek-V3.2's lightning indexer [INDEX-1].

DeepSeek-V3.2 picks the tokens each query attends to with a "lightning indexer" that
keeps a per-token key cache of its own beside the MLA latent: ``index_head_dim`` 128
(DeepSeek-V3.2-Exp ``inference/model.py`` ``ModelArgs``; transformers 5.24.0
``DeepseekV32Config``; field/research/hybrids.md §1d). vLLM stores it in fp8 with one
float32 scale per ``quant_block_size`` = 128 values: ``DeepseekV32IndexerCache``
(``vllm/model_executor/models/deepseek_v2.py``) registers an ``MLAAttentionSpec`` of
one head of ``index_head_dim + index_head_dim // 128 * 4`` bytes per token (132 for
DeepSeek-V3.2), uint8, so like the latent it has no head axis and every TP rank keeps
all of it. kvspec keeps the two parts apart: ``index`` (float8_e4m3fn values) and
``index_scale`` (float32 scales), in that order per token.
"""

from __future__ import annotations

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import itemsize
from kvspec.core.require import require_int

INDEX_BLOCK = 128
"""Indexer values per float32 scale (vLLM ``quant_block_size``)."""

INDEX_PARTS: tuple[tuple[str, str], ...] = (("index", "float8_e4m3fn"), ("index_scale", "float32"))
"""The indexer's parts, in order, with their dtypes [INDEX-1]."""

CLAUSES = (
    Clause(
        "INDEX-1",
        "An MLA group's sparse indexer cache moves with its latent, whole",
        "An MLA group may keep a sparse indexer cache (DeepSeek-V3.2's lightning indexer) "
        "of index_head_dim values per token and layer, a positive multiple of 128: "
        "index_head_dim float8_e4m3fn values and one float32 scale per 128 of them, "
        "index_head_dim + 4 x index_head_dim / 128 bytes [vLLM DeepseekV32IndexerCache]. An "
        "edge of such a group moves, beyond the latent's bytes [GROUP-3], l x T x that entry "
        "for its l layers and T tokens. Like the latent it has no head axis: every receiver "
        "rank gets each token's whole entry, from the one sender its latent comes from. An "
        "indexer on a group that is not MLA, or an index_head_dim that is not a positive "
        "multiple of 128, is refused.",
        obligations=(
            must(
                "an edge of an MLA group with an indexer moves l x T x (index_head_dim + "
                "4 x index_head_dim / 128) bytes beyond its latent's"
            ),
            must("every receiver rank gets each token's whole indexer entry, never a TP share"),
            refuses(
                "an indexer on a group that is not MLA, or an index_head_dim not a multiple of 128"
            ),
        ),
    ),
)


def check_indexer(index_head_dim: int | None, attention: str) -> None:
    """Refuse an indexer that is not on an MLA group or not whole 128-value blocks [INDEX-1]."""
    if index_head_dim is None:
        return
    require_int("index_head_dim", index_head_dim, minimum=INDEX_BLOCK)
    if index_head_dim % INDEX_BLOCK:
        raise ValueError(
            f"index_head_dim must be a multiple of {INDEX_BLOCK} (one float32 scale per "
            f"{INDEX_BLOCK} fp8 values), got {index_head_dim} [INDEX-1]"
        )
    if attention != "mla":
        raise ValueError(
            f"a sparse indexer cache belongs to an MLA group; this group's attention is "
            f"{attention!r} [INDEX-1]"
        )


def index_widths(index_head_dim: int) -> dict[str, int]:
    """Elements per token and layer of each indexer part [INDEX-1].

    >>> index_widths(128)
    {'index': 128, 'index_scale': 1}
    """
    return {"index": index_head_dim, "index_scale": index_head_dim // INDEX_BLOCK}


def index_entry_bytes(index_head_dim: int) -> int:
    """Bytes of one token's indexer entry in one layer [INDEX-1].

    >>> index_entry_bytes(128)
    132
    """
    widths = index_widths(index_head_dim)
    return sum(widths[name] * itemsize(dtype) for name, dtype in INDEX_PARTS)
