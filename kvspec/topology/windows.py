"""Which tokens of a sliding-window layer a receiver needs [WINDOW-1].

After a prefill of L tokens, a layer of window W attends to at most its last W tokens,
so the decoder needs only those; engines keep and ship them in whole blocks. SGLang
0.5.23 (``disaggregation/prefill.py`` ``_swa_payload``) sends from
``window_start = max(prefix, L - W)`` floored to a page boundary; vLLM 0.33.0 frees
only whole blocks before the window (``SlidingWindowManager.remove_skipped_blocks``)
(field/research/hybrids.md §4, §5). kvspec takes SGLang's block-aligned set with no
decode-side prefix hit.
"""

from __future__ import annotations

from kvspec._checks import require_int
from kvspec.clause import Clause, must
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
