"""Which tokens of a sliding-window or chunked local-attention layer a receiver needs
[WINDOW-1, LOCAL-1].

After a prefill of L tokens, a layer of window W attends to at most its last W tokens,
so the decoder needs only those; engines keep and ship them in whole blocks. SGLang
0.5.23 (``disaggregation/prefill.py`` ``_swa_payload``) sends from
``window_start = max(prefix, L - W)`` floored to a page boundary; vLLM 0.33.0 frees
only whole blocks before the window (``SlidingWindowManager.remove_skipped_blocks``)
(field/research/hybrids.md §4, §5). kvspec takes SGLang's block-aligned set with no
decode-side prefix hit.

A chunked local-attention layer of chunk C (Llama 4's ``attention_chunk_size``) attends
only within its own chunk: vLLM's ``ChunkedLocalAttentionManager.get_num_skipped_tokens``
(``vllm/v1/core/single_type_kv_cache_manager.py``) skips ``(n // C) * C`` tokens, so
after L tokens only ``[floor(L / C) * C, L)`` is still needed — empty when L is a multiple
of C, the next token opening a new chunk (hybrids.md §5). Blocks are freed whole, so the
start moves back to a block boundary, as for a window.

:func:`needed_tokens` is the one rule the group plan and the receiver's region both use.
"""

from __future__ import annotations

from kvspec._checks import require_int
from kvspec.clause import Clause, must, refuses
from kvspec.topology.groups import ChunkedLocal, FullAttention, SlidingWindow
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "WINDOW-1",
        "A sliding-window receiver gets its window, block-aligned",
        "For a request of L tokens, a sliding-window group of window W moves exactly the "
        "tokens from floor(max(0, L - W) / B) * B to L, B the cache block size: the last W "
        "tokens, extended back to a block boundary [SGLang 0.5.23 prefill._swa_payload]. "
        "Older tokens of the group never move; with token shards, an edge carries its token "
        "set's share of the window. Full-attention and draft groups of the same model move "
        "every token.",
        obligations=(
            must("a sliding-window group's edges carry exactly the block-aligned last W tokens"),
            must("full-attention groups of the same model carry every token"),
        ),
    ),
    Clause(
        "LOCAL-1",
        "A chunked local-attention receiver gets its current chunk, block-aligned",
        "A 'chunked' group of chunk C attends only within its own chunk of C tokens, so for a "
        "request of L tokens it moves exactly the tokens from floor(floor(L / C) * C / B) * B "
        "to L, B the cache block size: the current chunk, extended back to a block boundary "
        "[vLLM ChunkedLocalAttentionManager.get_num_skipped_tokens]. It is not a window: it "
        "never reaches back past the chunk's start, however few tokens the chunk holds. When "
        "L is a multiple of C (0 included) the current chunk is empty and the group moves "
        "nothing. A chunk below 1 token is refused, never read as full attention.",
        obligations=(
            must(
                "a chunked group's edges carry exactly the tokens from the current chunk's "
                "start, floored to a block boundary, to L"
            ),
            must("a chunked group moves nothing when L is a multiple of C"),
            refuses("a chunk below 1 token (0 does not mean full attention)"),
        ),
    ),
)


def window_tokens(window: int, seq_len: int, block_size: int) -> Tokens:
    """The tokens of a ``seq_len``-token request a window-``window`` layer moves [WINDOW-1].

    >>> window_tokens(128, 1000, 16).describe()
    '864-999'
    >>> window_tokens(128, 100, 16).describe()
    '0-99'
    """
    require_int("window", window, minimum=1)
    require_int("seq_len", seq_len, minimum=0)
    require_int("block_size", block_size, minimum=1)
    start = max(0, seq_len - window) // block_size * block_size
    return Tokens.span(start, seq_len)


def chunk_tokens(chunk: int, seq_len: int, block_size: int) -> Tokens:
    """The tokens of a ``seq_len``-token request a chunk-``chunk`` local-attention layer
    moves: the current chunk, block-aligned, empty on a chunk boundary [LOCAL-1].

    >>> chunk_tokens(8192, 10000, 16).describe()
    '8192-9999'
    >>> chunk_tokens(10, 25, 4).describe()
    '20-24'
    >>> len(chunk_tokens(8, 16, 4))
    0
    """
    require_int("chunk", chunk, minimum=1)
    require_int("seq_len", seq_len, minimum=0)
    require_int("block_size", block_size, minimum=1)
    if seq_len % chunk == 0:
        # The next token opens a new chunk: nothing of this one is attended to again.
        return Tokens.span(seq_len, seq_len)
    start = seq_len // chunk * chunk // block_size * block_size
    return Tokens.span(start, seq_len)


def needed_tokens(group: FullAttention, seq_len: int, block_size: int) -> Tokens | None:
    """The tokens a receiver of per-token ``group`` needs of a ``seq_len``-token request:
    a sliding window's [WINDOW-1], a chunked layer's current chunk [LOCAL-1], or None
    (every token) for full attention and draft layers [WINDOW-1.2].

    The one rule both the group plan and the receiver's held region use.
    """
    if isinstance(group, SlidingWindow):
        return window_tokens(group.window, seq_len, block_size)
    if isinstance(group, ChunkedLocal):
        return chunk_tokens(group.chunk, seq_len, block_size)
    return None
