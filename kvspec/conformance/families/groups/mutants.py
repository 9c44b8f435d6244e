"""Mutants of hybrid models: layer maps, group facts, state parts, windows, chunked local
attention and bytes per group [GROUP-1..3, STATE-1..2, WINDOW-1, LOCAL-1].

Each is the reference with one bug a field engineer writes from the rule text; several
are bugs engines shipped (vllm#55208, vllm-ascend#11885; field/research/hybrids.md).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, cast

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter, case_group_plan
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import (
    KINDS,
    ChunkedLocal,
    DraftAttention,
    FullAttention,
    GdnState,
    Mamba2State,
    SlidingWindow,
    StateGroup,
)
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import layer_ranges, owned_heads
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import part_offsets, plan_state_reads
from kvspec.topology.tokens import Tokens
from kvspec.topology.windows import chunk_tokens, window_tokens

Config = TransferConfig


def _bytes(case: TransferCase, model: ModelShape, seq_len: int, block_size: int) -> dict:
    return case_group_plan(case, seq_len, model=model, block_size=block_size).bytes_per_edge()


def _with_groups(model: ModelShape, groups: tuple, layers: tuple | None = None) -> ModelShape:
    """``model`` with other groups (and layer map), unchecked, as a buggy loader builds it."""
    made = copy.copy(model)
    object.__setattr__(made, "groups", groups)
    if layers is not None:
        object.__setattr__(made, "layers", layers)
    return made


def _hybrid_model(config: Config) -> dict[str, Any] | None:
    model = config.get("model")
    return model if model and model.get("groups") else None


# GROUP-1 ------------------------------------------------------------------------------------
@mutant("GROUP-1.1")
class OwnAttentionGroupForgotten(ReferenceAdapter):
    """Plans the groups listed in ``model.groups`` and forgets group 0, the model's own
    attention: a uniform model moves nothing."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        got = super().group_bytes(case, seq_len, block_size)
        return {key: n for key, n in got.items() if key[0] != 0}


@mutant("GROUP-1.2")
class LayerMapFitToLength(ReferenceAdapter):
    """Truncates a long layer map and pads a short one with group 0, the lenient truncation
    SGLang logs for paged SWA (hybrids.md §4), instead of refusing it."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model is not None:
            n = model["num_layers"]
            model["layers"] = (model["layers"] + [0] * n)[:n]
        super().validate_model(given)


@mutant("GROUP-1.3")
class GroupIndexClamped(ReferenceAdapter):
    """Clamps a layer's group index to the last group instead of refusing an unknown one."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model is not None:
            last = len(model["groups"])
            model["layers"] = [min(g, last) if isinstance(g, int) else g for g in model["layers"]]
        super().validate_model(given)


@mutant("GROUP-1.4")
class UnusedGroupsDropped(ReferenceAdapter):
    """Builds caches only for the groups some layer names and drops the others silently."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model is not None and all(isinstance(g, int) for g in model["layers"]):
            used = sorted(set(model["layers"]) - {0})
            kept = [model["groups"][g - 1] for g in used if 0 < g <= len(model["groups"])]
            if len(kept) == len(used):
                renumber = {0: 0, **{g: i + 1 for i, g in enumerate(used)}}
                model["groups"] = kept
                model["layers"] = [renumber[g] for g in model["layers"]]
        super().validate_model(given)


@mutant("GROUP-1.5")
class LayerMapReadPerStage(ReferenceAdapter):
    """Each pipeline stage looks its local layer j up as layers[j], not layers[first + j]:
    right with one stage, wrong on every later one."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        model = case.model
        if not model.layers:
            return super().group_bytes(case, seq_len, block_size)
        layers = list(model.layers)
        for stage in layer_ranges(case.source, model.num_layers):
            for j, layer in enumerate(stage):
                layers[layer] = model.layers[j]
        return _bytes(case, _with_groups(model, model.groups, tuple(layers)), seq_len, block_size)


# GROUP-2 ------------------------------------------------------------------------------------
@mutant("GROUP-2.1")
class GroupSizesCoercedWithInt(ReferenceAdapter):
    """Reads group sizes with ``int()`` and raises a too-small one to its minimum, the way a
    config loader fills in defaults."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        for group in model["groups"] if model else ():
            for fact, value in list(group.items()):
                if fact in ("kind", "attention", "ssm_dtype"):
                    continue
                try:
                    number = int(value)
                except (TypeError, ValueError):
                    continue
                floor = {"conv_kernel": 2, "num_spec": 0}.get(fact, 1)
                group[fact] = max(number, floor)
        super().validate_model(given)


@mutant("GROUP-2.2")
class IndivisibleMambaGroupsAsOne(ReferenceAdapter):
    """Takes a Mamba-2 group count that does not divide the heads as one shared group."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        for group in model["groups"] if model else ():
            heads, groups = group.get("num_heads"), group.get("n_groups")
            numbers = isinstance(heads, int) and isinstance(groups, int) and groups > 0
            if group.get("kind") == "mamba2" and numbers and heads % groups:
                group["n_groups"] = 1
        super().validate_model(given)


@mutant("GROUP-2.3")
class UnknownKindReadAsFull(ReferenceAdapter):
    """Reads any group kind it does not know as full attention, dropping facts it does not
    know (a 'chunked_attention' or 'kda' layer becomes plain attention)."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model:
            for i, group in enumerate(model["groups"]):
                if group.get("kind") not in KINDS:
                    keep = ("num_kv_heads", "head_dim", "attention")
                    model["groups"][i] = {
                        "kind": "full",
                        **{k: group[k] for k in keep if k in group},
                    }
        super().validate_model(given)


@mutant("GROUP-2.4")
class DraftSizedWithTargetHeads(ReferenceAdapter):
    """Sizes draft/MTP layers with the target's KV head count and head_dim, as the Mooncake
    connector did (vllm-ascend#11885)."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        model = case.model
        target = DraftAttention(model.num_kv_heads, model.head_dim, model.attention)
        groups = tuple(target if isinstance(g, DraftAttention) else g for g in model.groups)
        return _bytes(case, _with_groups(model, groups), seq_len, block_size)


# GROUP-3 ------------------------------------------------------------------------------------
@mutant("GROUP-3.1")
class KAndVForEveryGroup(ReferenceAdapter):
    """Counts two tensors (K and V) per cell for every per-token group, an MLA draft too."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        got = super().group_bytes(case, seq_len, block_size)
        groups = case.model.layer_groups
        return {
            key: n * 2
            if isinstance(g := groups[key[0]], FullAttention) and g.kv_tensors == 1
            else n
            for key, n in got.items()
        }


@mutant("GROUP-3.2")
class StateCountedPerBlock(ReferenceAdapter):
    """Counts a state group like an attention group padded to its page: one state per block
    of the request, so its bytes grow with the length."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        got = super().group_bytes(case, seq_len, block_size)
        blocks = max(1, -(-seq_len // block_size))
        groups = case.model.layer_groups
        return {key: n if groups[key[0]].per_token else n * blocks for key, n in got.items()}


@mutant("GROUP-3.3")
class OnlyOwnAttentionHeadsChecked(ReferenceAdapter):
    """Checks the model's own KV heads against both TP sizes and takes every other
    per-token group's head count as the same."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model:
            for group in model["groups"]:
                if (
                    group.get("kind") in ("full", "sliding", "draft")
                    and group.get("attention") != "mla"
                ):
                    group["num_kv_heads"] = model["num_kv_heads"]
        super().validate_model(given)


@mutant("GROUP-3.1")
class MlpLayersMovedAsAttention(ReferenceAdapter):
    """Maps a layer with no cache (kind ``none``, an MLP-only layer) to the model's own
    attention group, as a loader that defaults a layer without a cache spec to group 0:
    group 0's edges move those layers' KV too."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        model = case.model
        empty = {i + 1 for i, g in enumerate(model.groups) if g.kind == "none"}
        if not empty:
            return super().group_bytes(case, seq_len, block_size)
        layers = tuple(0 if g in empty else g for g in model.layers)
        moved = dataclasses.replace(case, model=_with_groups(model, model.groups, layers))
        return super().group_bytes(moved, seq_len, block_size)


@mutant("GROUP-3.2")
class GdnSpeculativeRowsLeftOut(ReferenceAdapter):
    """Sizes a GDN conv state by ``conv_kernel - 1`` rows, leaving out its ``num_spec``
    speculative rows (speculative decoding added to Mamba-2 only): a GDN edge under
    speculative decoding moves too few bytes."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        model = case.model
        groups = tuple(
            dataclasses.replace(g, num_spec=0) if isinstance(g, GdnState) else g
            for g in model.groups
        )
        moved = dataclasses.replace(case, model=_with_groups(model, groups))
        return super().group_bytes(moved, seq_len, block_size)


# STATE --------------------------------------------------------------------------------------
@mutant("STATE-1.1")
class GdnStateByKeyHeads(ReferenceAdapter):
    """Splits a GDN temporal state by key heads, like Q and K, not by value heads."""

    def state_units(self, layout: StageLayout, model: ModelShape, group: int, rank: int) -> dict:
        got = super().state_units(layout, model, group, rank)
        state = model.layer_groups[group]
        if state.kind == "gdn":  # a GdnState
            got["ssm"] = owned_heads(
                cast(GdnState, state).num_k_heads, layout.attn_tp, layout.locate(rank).attn_tp_rank
            )
        return got


@mutant("STATE-1.2")
class GroupsSplitLikeHeads(ReferenceAdapter):
    """Splits B and C by the TP size like x even when there are fewer groups than ranks, so
    some ranks hold no group."""

    def state_units(self, layout: StageLayout, model: ModelShape, group: int, rank: int) -> dict:
        got = super().state_units(layout, model, group, rank)
        state = model.layer_groups[group]
        tp, r = layout.attn_tp, layout.locate(rank).attn_tp_rank
        if state.kind == "mamba2" and cast(Mamba2State, state).n_groups < tp:  # a Mamba2State
            g = cast(Mamba2State, state).n_groups
            got["B"] = got["C"] = range(r * g // tp, (r + 1) * g // tp)
        return got


@mutant("STATE-1.3")
class StateUnitsNotChecked(ReferenceAdapter):
    """Checks attention heads over TP but never a state's units: an indivisible GDN or Mamba
    head count is accepted (and sliced unevenly later)."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model:
            for i, group in enumerate(model["groups"]):
                if group.get("kind") in ("mamba1", "mamba2", "gdn"):
                    model["groups"][i] = {"kind": "none"}
        super().validate_model(given)


@mutant("STATE-2.1")
class ReceiverPartBasesFromSender(ReferenceAdapter):
    """Writes each part at the sender's part offset, as if both sides had one TP size."""

    def state_reads(self, case: TransferCase, group: int, dst: int) -> list:
        state = cast(StateGroup, case.model.layer_groups[group])  # state_reads: of a state
        src_base = part_offsets(state, case.source.attn_tp)
        dst_base = part_offsets(state, case.target.attn_tp)
        reads = plan_state_reads(case.source, case.target, case.model, group, policy=case.policy)
        return [
            (
                r.src,
                r.layer,
                r.src_offset,
                r.dst_offset - dst_base[r.part] + src_base[r.part],
                r.length,
            )
            for r in reads
            if r.dst == dst
        ]


@mutant("STATE-2.2")
class ReplicatedPartOffsetScaledByTpRatio(ReferenceAdapter):
    """Scales every conv part's remote offset by the TP ratio, replicated B and C too: with
    n_groups=1, P TP1 -> D TP2, one rank reads C as B (vllm#55208; hybrids.md §3)."""

    def state_reads(self, case: TransferCase, group: int, dst: int) -> list:
        state = cast(StateGroup, case.model.layer_groups[group])  # state_reads: of a state
        source, target = case.source, case.target
        base = part_offsets(state, source.attn_tp)
        reads = plan_state_reads(source, target, case.model, group, policy=case.policy)
        out = []
        for r in (r for r in reads if r.dst == dst):
            src_at = r.src_offset
            ratio = target.attn_tp // source.attn_tp
            if r.part in ("B", "C") and target.attn_tp % source.attn_tp == 0 and ratio > 1:
                src_at = base[r.part] + (target.locate(dst).attn_tp_rank % ratio) * r.length
            out.append((r.src, r.layer, src_at, r.dst_offset, r.length))
        return out


# WINDOW -------------------------------------------------------------------------------------
@mutant("WINDOW-1.1")
class SlidingWindowSendsAllTokens(ReferenceAdapter):
    """Sends a sliding-window group every token of the request, like full attention."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        model = case.model
        groups = tuple(
            FullAttention(g.num_kv_heads, g.head_dim, g.attention)
            if isinstance(g, SlidingWindow)
            else g
            for g in model.groups
        )
        return _bytes(case, _with_groups(model, groups), seq_len, block_size)


@mutant("WINDOW-1.1")
class WindowStartNotBlockAligned(ReferenceAdapter):
    """Sends exactly the last W tokens, the window start not floored to a block boundary."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return super().group_bytes(case, seq_len, 1)


@mutant("WINDOW-1.2")
class WindowAppliedToEveryGroup(ReferenceAdapter):
    """Applies the model's sliding window to every attention group of a model that has one."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        got = super().group_bytes(case, seq_len, block_size)
        groups = case.model.layer_groups
        windows = [g.window for g in groups if isinstance(g, SlidingWindow)]
        if not windows or seq_len == 0:
            return got
        kept = len(window_tokens(windows[0], seq_len, block_size))
        return {
            key: n * kept // seq_len
            if isinstance(groups[key[0]], FullAttention)
            and not isinstance(groups[key[0]], SlidingWindow)
            else n
            for key, n in got.items()
        }


# LOCAL-1 ------------------------------------------------------------------------------------
def _chunked_bytes(
    case: TransferCase,
    seq_len: int,
    block_size: int,
    tokens_of: Callable[[ChunkedLocal, int, int], Tokens],
) -> dict:
    """The reference's bytes with every chunked group moving ``tokens_of(group, L, B)``
    instead of its current chunk (every other group as the reference plans it)."""
    model = case.model
    groups = model.layer_groups
    got = {
        key: n
        for key, n in _bytes(case, model, seq_len, block_size).items()
        if not isinstance(groups[key[0]], ChunkedLocal)
    }
    if seq_len == 0:
        return got
    full = tuple(
        FullAttention(g.num_kv_heads, g.head_dim, g.attention) if isinstance(g, ChunkedLocal) else g
        for g in model.groups
    )
    for key, n in _bytes(case, _with_groups(model, full), seq_len, block_size).items():
        group = groups[key[0]]
        if isinstance(group, ChunkedLocal):
            moved = n * len(tokens_of(group, seq_len, block_size)) // seq_len
            if moved:
                got[key] = moved
    return got


@mutant("LOCAL-1.1")
class ChunkReadAsWindow(ReferenceAdapter):
    """Takes a chunk of C tokens for a sliding window of C: sends the last C tokens, which
    reach back into the previous chunk (and are never empty)."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _chunked_bytes(
            case, seq_len, block_size, lambda g, n, b: window_tokens(g.chunk, n, b)
        )


@mutant("LOCAL-1.1")
class ChunkStartNotBlockAligned(ReferenceAdapter):
    """Sends exactly the current chunk, its start not moved back to a block boundary."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _chunked_bytes(
            case, seq_len, block_size, lambda g, n, b: chunk_tokens(g.chunk, n, 1)
        )


@mutant("LOCAL-1.1")
class ChunkedSendsAllTokens(ReferenceAdapter):
    """Sends a chunked local-attention group every token of the request, like full
    attention."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _chunked_bytes(case, seq_len, block_size, lambda g, n, b: Tokens.span(0, n))


def _aligned(start: int, seq_len: int, block_size: int) -> Tokens:
    return Tokens.span(start // block_size * block_size, seq_len)


@mutant("LOCAL-1.2")
class EmptyChunkNotSpecialCased(ReferenceAdapter):
    """Floors the chunk start floor(L/C)*C to a block without first asking whether the
    chunk is empty: on a chunk boundary that is not a block boundary it sends the partial
    block before L."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _chunked_bytes(
            case, seq_len, block_size, lambda g, n, b: _aligned(n // g.chunk * g.chunk, n, b)
        )


@mutant("LOCAL-1.2")
class ChunkOfTheLastToken(ReferenceAdapter):
    """Sends the chunk the last prompt token is in, (L-1)//C*C on: right inside a chunk,
    but on a chunk boundary it sends the whole finished chunk."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _chunked_bytes(
            case,
            seq_len,
            block_size,
            lambda g, n, b: _aligned(max(0, n - 1) // g.chunk * g.chunk, n, b),
        )


@mutant("LOCAL-1.3")
class ChunkZeroReadAsFull(ReferenceAdapter):
    """Reads a chunk of 0 (or less) as "no chunking" and builds full attention, as a config
    loader does when ``attention_chunk_size`` is falsy, instead of refusing it."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        model = _hybrid_model(given)
        if model:
            for i, group in enumerate(model["groups"]):
                chunk = group.get("chunk")
                if group.get("kind") == "chunked" and isinstance(chunk, int) and chunk < 1:
                    keep = ("num_kv_heads", "head_dim", "attention")
                    model["groups"][i] = {
                        "kind": "full",
                        **{k: group[k] for k in keep if k in group},
                    }
        super().validate_model(given)
