"""Mutants of block sizes per stage [BLOCK-1, WINDOW-2].

Each is the reference with one bug a field engineer writes from the rule text: a window
aligned to the wrong side's blocks, one block size for both sides, a refusal of any two
block sizes (as SGLang once refused any two TP sizes of a sliding-window hybrid), a
sender thought to evict token by token, and a block size derived from TP-stable pages
(vllm#45575 proposes those) or the model's total KV heads (vllm#41037).
"""

from __future__ import annotations

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import ChunkedLocal, SlidingWindow
from kvspec.topology.model import ModelShape
from kvspec.topology.windows import needed_tokens, receiver_tokens

Tokens = dict[tuple[int, int, int], list[tuple[int, int]]]


# WINDOW-2 ------------------------------------------------------------------------------------
@mutant("WINDOW-2.1")
class WindowAlignedToSenderBlocks(ReferenceAdapter):
    """Aligns the window it sends to the sender's blocks, not to the blocks the receiver
    allocates and fills."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        return super().window_tokens(case, seq_len, source_block_size, source_block_size)


@mutant("WINDOW-2.3")
class OneBlockSizeForBoth(ReferenceAdapter):
    """Takes the receiver's block size for the sender too, so it believes the sender holds
    whatever the receiver needs and sends evicted rows instead of refusing."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        return super().window_tokens(case, seq_len, target_block_size, target_block_size)


@mutant("WINDOW-2.2")
class RefusesAnyTwoBlockSizes(ReferenceAdapter):
    """Refuses every plan whose two block sizes differ, though a sender with larger blocks
    still holds all a receiver with smaller ones needs."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        if source_block_size != target_block_size:
            raise ValueError(
                f"sender blocks {source_block_size} != receiver blocks {target_block_size}"
            )
        return super().window_tokens(case, seq_len, source_block_size, target_block_size)


@mutant("WINDOW-2.2")
class SenderEvictsTokenByToken(ReferenceAdapter):
    """Thinks the sender evicted every token before the window (or chunk) itself, not whole
    blocks, so it refuses a receiver whose first block reaches back before the window."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        for group in case.model.layer_groups:
            needed = needed_tokens(group, seq_len, target_block_size)  # type: ignore[arg-type]  # a state too: None, every token
            if needed is None or not len(needed):
                continue
            if isinstance(group, SlidingWindow):
                first_held = max(0, seq_len - group.window)
            else:
                assert isinstance(group, ChunkedLocal)
                first_held = seq_len // group.chunk * group.chunk
            if needed.ranges[0].start < first_held:
                raise ValueError(f"tokens before {first_held} are evicted")
        return super().window_tokens(case, seq_len, target_block_size, target_block_size)


@mutant("WINDOW-2.2")
class RefusesBlocksThatDoNotDivide(ReferenceAdapter):
    """Refuses whenever the receiver's block size does not divide the sender's, a rule of
    thumb in place of the tokens: blocks of 12 and 8 both hold 24-49 of a window of 20
    after 50 tokens."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        if source_block_size % target_block_size:
            raise ValueError(f"blocks of {target_block_size} do not divide {source_block_size}")
        return super().window_tokens(case, seq_len, target_block_size, target_block_size)


@mutant("WINDOW-2.3", unclear=True)
class EvictionRefusedWithoutRange(ReferenceAdapter):
    """Refuses a receiver that needs tokens the sender evicted, as it must, with "the
    sender has evicted tokens the receiver needs", naming neither block size nor the
    evicted token range the clause asks for."""

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Tokens:
        for group in case.model.layer_groups:
            if not isinstance(group, SlidingWindow | ChunkedLocal):
                continue
            try:
                receiver_tokens(
                    group,
                    seq_len,
                    source_block_size=source_block_size,
                    target_block_size=target_block_size,
                )
            except ValueError:
                raise ValueError(
                    "the sender has evicted tokens the receiver needs: use one block size "
                    "for sliding-window and chunked layers"
                ) from None
        return super().window_tokens(case, seq_len, source_block_size, target_block_size)


# BLOCK-1 -------------------------------------------------------------------------------------
@mutant("BLOCK-1.1")
class StatePageAtTp1(ReferenceAdapter):
    """Sizes the state page as at TP1 whatever the stage's TP, a TP-stable page, while the
    attention page is the rank's: Qwen3-Next at TP4 gets 1072 tokens, not 272."""

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        from kvspec.topology import block_size as rule

        state = rule.state_page_bytes(model, 1)
        if state == 0:
            return rule.DEFAULT_BLOCK_SIZE if block_size is None else block_size
        token = rule.attention_token_bytes(model, attn_tp)
        derived = 16 * -(-state // (16 * token))
        return derived if block_size is None or block_size < derived else block_size


@mutant("BLOCK-1.1")
class TotalKvHeadsPerToken(ReferenceAdapter):
    """Sizes one token's attention page with the model's total KV heads, not the rank's:
    the block comes out too small at every TP above 1."""

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        from kvspec.topology import block_size as rule

        state = rule.state_page_bytes(model, attn_tp)
        if state == 0:
            return rule.DEFAULT_BLOCK_SIZE if block_size is None else block_size
        token = rule.attention_token_bytes(model, 1)
        derived = 16 * -(-state // (16 * token))
        return derived if block_size is None or block_size < derived else block_size


@mutant("BLOCK-1.2")
class UserBlockSizeAlwaysWins(ReferenceAdapter):
    """Keeps a user's block size even when its attention page cannot hold a state page."""

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        if block_size is not None:
            return block_size
        return hybrid_block_size(model, attn_tp)
