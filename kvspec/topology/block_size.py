"""The attention block size a stage of a hybrid (attention + state) model uses, which
depends on its TP [BLOCK-1].

An engine that keeps attention KV and per-request states in one pool of equal pages
must make an attention page (one block of tokens) at least as large as a state page.
vLLM 0.11.0 does this in ``HybridAttentionMambaModelConfig.verify_and_update_config``
(``vllm/model_executor/models/config.py``): it takes one token's attention page of a
rank (``FullAttentionSpec(block_size=1, num_kv_heads=get_num_kv_heads(parallel_config))``,
the rank's KV heads) and a rank's Mamba page (``MambaSpec`` of the model class's state
shapes, which are per rank), sets the attention block size to 16 x cdiv(mamba page,
16 x attention page of one token) when the user set none or a smaller one, and pads the
Mamba page to the attention page. Later vLLM moved the same rule to
``Platform._align_hybrid_block_size`` with the 16 made a kernel alignment
(field/research/hybrids.md §2). Both sides of the ratio are per rank, and a rank's KV
heads stop shrinking at one replicated head while its state keeps shrinking, so the block
size changes with TP: Qwen3-Next is 544 tokens at TP1 and TP2 and 272 at TP4
(vllm#41037 reports the same for Nemotron-Nano). A P/D transfer between two TPs of one
hybrid model therefore has sender and receiver block sizes that differ by construction
[WINDOW-2].
"""

from __future__ import annotations

from typing import cast

from kvspec.core.clause import Clause, must
from kvspec.core.dtype_names import check_dtype, itemsize
from kvspec.core.require import require_int
from kvspec.topology.groups import FullAttention
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import owned_heads
from kvspec.topology.state import part_itemsize

CLAUSES = (
    Clause(
        "BLOCK-1",
        "A hybrid's attention block size is derived per TP",
        "For a model with state groups, a stage of attention TP t uses the block size "
        "B(t) = A x ceil(S(t) / (A x P(t))), A the kernel alignment (16 tokens in vLLM "
        "0.11.0), S(t) the largest state page of one rank at TP t in bytes (each part's "
        "units that rank 0 holds, the temporal part in its ssm_dtype, the rest in the "
        "model's dtype) and P(t) the bytes of one token of one layer of the model's own "
        "attention on one rank (its KV tensors x the rank's KV heads, at least one "
        "replicated head, x head_dim x the KV cache dtype's size) "
        "[vLLM HybridAttentionMambaModelConfig.verify_and_update_config]. A block size the "
        "user gives is kept when it is at least B(t) and raised to B(t) otherwise. A model "
        "without state keeps the user's block size (16 when none is given).",
        obligations=(
            must(
                "the block size is the aligned ceiling of the rank's largest state page over "
                "one token's attention page of that rank, both at the stage's TP"
            ),
            must(
                "a user block size of at least B(t) is kept and a smaller one raised to B(t); "
                "a model without state keeps the user's"
            ),
        ),
    ),
)

DEFAULT_BLOCK_SIZE = 16
"""The block size when neither the user nor a state page sets one."""


def state_page_bytes(model: ModelShape, attn_tp: int) -> int:
    """The largest state page of one rank at attention TP ``attn_tp``, in bytes: every
    part's units rank 0 holds (the most any rank holds) at its own itemsize; 0 for a
    model without state [BLOCK-1].

    >>> from kvspec.topology.model_presets import model_preset
    >>> [state_page_bytes(model_preset("qwen3-next-80b-a3b"), t) for t in (1, 4)]
    [1097728, 274432]
    """
    require_int("attn_tp", attn_tp, minimum=1)
    pages = [0]
    for group in model.layer_groups:
        if isinstance(group, FullAttention):
            continue
        pages.append(
            sum(
                len(owned_heads(p.units, attn_tp, 0))
                * p.unit_elements
                * part_itemsize(group, p.name, model)
                for p in group.parts()
            )
        )
    return max(pages)


def attention_token_bytes(
    model: ModelShape, attn_tp: int, kv_cache_dtype: str | None = None
) -> int:
    """One token's bytes of one layer of the model's own attention on one rank at attention
    TP ``attn_tp``: at least one (replicated) KV head [BLOCK-1, HEAD-2].

    >>> from kvspec.topology.model_presets import model_preset
    >>> [attention_token_bytes(model_preset("qwen3-next-80b-a3b"), t) for t in (1, 2, 4)]
    [2048, 1024, 1024]
    """
    require_int("attn_tp", attn_tp, minimum=1)
    dtype = model.dtype if kv_cache_dtype is None else check_dtype(kv_cache_dtype)
    own = cast(FullAttention, model.layer_groups[0])  # group 0 is the model's own [GROUP-1]
    heads = len(owned_heads(own.num_kv_heads, attn_tp, 0))
    return own.kv_tensors * heads * own.head_dim * itemsize(dtype)


def hybrid_block_size(
    model: ModelShape,
    attn_tp: int,
    *,
    block_size: int | None = None,
    alignment: int = DEFAULT_BLOCK_SIZE,
    kv_cache_dtype: str | None = None,
) -> int:
    """The attention block size a stage of attention TP ``attn_tp`` uses for ``model``
    [BLOCK-1]: ``block_size`` (the user's; 16 when None) for a model without state,
    otherwise the smallest multiple of ``alignment`` whose attention page of one rank holds
    the rank's largest state page, or the user's when that is larger.

    Qwen3-Next's state page quarters from TP1 to TP4 while its attention page only halves
    (2 KV heads: one per rank at TP2, one replicated at TP4), so the block size halves:

    >>> from kvspec.topology.model_presets import model_preset
    >>> qwen = model_preset("qwen3-next-80b-a3b")
    >>> [hybrid_block_size(qwen, t) for t in (1, 2, 4)]
    [544, 544, 272]
    >>> hybrid_block_size(qwen, 4, block_size=1024), hybrid_block_size(qwen, 4, block_size=32)
    (1024, 272)
    >>> hybrid_block_size(model_preset("gpt-oss-120b"), 4, block_size=32)
    32
    """
    require_int("alignment", alignment, minimum=1)
    if block_size is not None:
        require_int("block_size", block_size, minimum=1)
    state = state_page_bytes(model, attn_tp)
    if state == 0:
        return DEFAULT_BLOCK_SIZE if block_size is None else block_size
    token = attention_token_bytes(model, attn_tp, kv_cache_dtype)
    derived = alignment * -(-state // (alignment * token))
    return derived if block_size is None or block_size < derived else block_size
