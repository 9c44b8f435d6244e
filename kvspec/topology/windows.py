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

Sender and receiver may use different block sizes (a hybrid's changes with TP [BLOCK-1]);
:func:`receiver_tokens` aligns to the receiver's and refuses tokens the sender, aligned to
its own, has evicted [WINDOW-2].
"""

from __future__ import annotations

from typing import cast

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int
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
    Clause(
        "WINDOW-2",
        "Sender and receiver block sizes of a window or chunk",
        "Each stage has its own block size, the sender's Bs and the receiver's Br (one B "
        "for both unless given apart; a hybrid's differs with TP [BLOCK-1]). A receiver of "
        "a sliding-window or chunked group needs the tokens of WINDOW-1 and LOCAL-1 with "
        "B = Br, since it allocates and fills whole blocks of its own size, and an edge "
        "carries exactly those (its token set's share of them). The sender still holds the "
        "same tokens with B = Bs, its own window aligned to its own blocks; it has evicted "
        "every older token of the group. When the receiver needs a token the sender has "
        "evicted (its first needed token lies before the sender's first held one, as when "
        "Br does not divide Bs) the plan is refused, naming both block sizes and the "
        "evicted token range, never sent with those rows missing or wrong [SGLang refuses "
        "different TP sizes for sliding-window hybrids: truncating silently misaligns rows "
        "and corrupts KV]. A plan whose receiver needs only held tokens is planned, "
        "whatever the two block sizes. Full-attention, draft and state groups do not depend "
        "on either block size.",
        obligations=(
            must(
                "a window or chunk edge carries the needed tokens aligned to the receiver's "
                "block size, not the sender's"
            ),
            must(
                "the sender holds its window aligned to its own block size: a plan whose "
                "receiver needs only those tokens is planned, even when the block sizes differ"
            ),
            refuses(
                "a receiver's needed tokens that the sender has evicted, naming both block "
                "sizes and the evicted token range"
            ),
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


def receiver_tokens(
    group: FullAttention, seq_len: int, *, source_block_size: int, target_block_size: int
) -> Tokens | None:
    """The tokens a receiver of ``group`` with blocks of ``target_block_size`` needs, which
    a sender with blocks of ``source_block_size`` must still hold; None for every token
    [WINDOW-2].

    The receiver's window is aligned to its own blocks; the sender kept its own window
    aligned to its blocks and evicted the rest. Receiver blocks that divide the sender's
    always fit; larger ones may reach into evicted tokens, which is refused:

    >>> from kvspec.topology.groups import SlidingWindow
    >>> w = SlidingWindow(8, 64, window=128)
    >>> receiver_tokens(w, 1000, source_block_size=544, target_block_size=272).describe()
    '816-999'
    >>> receiver_tokens(w, 1000, source_block_size=272, target_block_size=544)
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the receiver's blocks of 544 tokens need tokens 544-999 ... 544-815 are evicted; ...
    """
    require_int("source_block_size", source_block_size, minimum=1)
    require_int("target_block_size", target_block_size, minimum=1)
    needed = needed_tokens(group, seq_len, target_block_size)
    if needed is None or not len(needed):
        return needed
    held = needed_tokens(group, seq_len, source_block_size)
    assert held is not None
    first_needed = needed.ranges[0].start
    first_held = held.ranges[0].start if len(held) else seq_len
    if first_needed < first_held:
        what = (
            f"window({group.window})"
            if isinstance(group, SlidingWindow)
            else f"chunk({cast(ChunkedLocal, group).chunk})"  # needed: a window or a chunk
        )
        held_text = held.describe() if len(held) else "nothing"
        raise ValueError(
            f"the receiver's blocks of {target_block_size} tokens need tokens "
            f"{needed.describe()} of {what}, but the sender's blocks of {source_block_size} "
            f"tokens hold only {held_text}: tokens {first_needed}-{first_held - 1} are "
            "evicted; refusing to send them missing or wrong [WINDOW-2]"
        )
    return needed
