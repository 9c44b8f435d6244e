"""Checks of reassembling a request's chunks [CHUNK-1, CHUNK-2].

A whole-request payload of 3 to 12 tokens, with block ids, is cut into 2 to 5 chunks
at boundaries that need not be block-aligned; the chunks arrive in a random order.
Then one thing at a time goes wrong — a chunk missing at the start, in the middle or
at the end, a chunk repeated, overlapping or past the final one, one chunk disagreeing
in a fact — and every such set must be refused.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any, overload

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, vacuous
from kvspec.conformance.checks.expectations import expect_refused, fail
from kvspec.conformance.draws import BLOCK_SIZE, TENSOR_PINS, Setup, case_examples, inbox
from kvspec.conformance.tiers import BREAKS
from kvspec.tensors.dtypes import FP8_DTYPES
from kvspec.transport.chunks import reassemble, split_chunks
from kvspec.transport.payload import Chunk, Layers, Payload, payload_equal


def chunk_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    """A small case of the domain, 3..12 tokens, and where to cut them."""
    return st.fixed_dictionaries(
        {
            "case": case_examples(adapter, max_layers=3, max_head_dim=2),
            "seq_len": st.integers(3, 12),
            "seed": st.integers(0, 2**16),
            "cuts": st.lists(st.integers(1, 11), min_size=1, max_size=4, unique=True),
        }
    )


CHUNK_PINS = tuple(
    {**pin, "seq_len": 7, "cuts": [1, 3, 5]} for pin in TENSOR_PINS[:3]
)  # boundaries at odd tokens: blocks of 2 are shared by neighbouring chunks


def _whole_and_chunks(ctx: Context, example: Example) -> tuple[Setup, Payload, list[Payload]]:
    setup = Setup(ctx, example)
    # With token shards a payload holds its edge's tokens; chunks count positions along
    # them [CHUNK-1, SLICE-4]. The payload with the most tokens is chunked, so a case whose
    # first receiver holds one token still has something to cut.
    payloads = [p for dst in setup.receivers() for _, p in inbox(setup, dst)]
    whole = max(payloads, key=lambda p: p.seq_len)
    tokens = whole.seq_len
    if tokens < 2:
        vacuous()
    cuts = sorted({c for c in example["cuts"] if 0 < c < tokens}) or [tokens // 2]
    bounds = [0, *cuts, tokens]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    return setup, whole, list(split_chunks(whole, sizes))


@check(
    "CHUNK-2",
    "reassemble",
    "chunks reassemble, in any arrival order, to the unchunked payload, block ids included",
    needs=("chunks",),
    strategy=chunk_examples,
    examples=CHUNK_PINS,
    weight=1.0,  # token shards leave some cases nothing to cut: more draws
    covers=("CHUNK-2.1", "CHUNK-2.2"),
)
def reassembles(ctx: Context, example: Example) -> None:
    setup, whole, chunks = _whole_and_chunks(ctx, example)
    rng = random.Random(setup.seed)
    shuffled = rng.sample(chunks, len(chunks))
    if [c.chunk.chunk_id for c in shuffled] == [c.chunk.chunk_id for c in chunks]:
        shuffled = chunks[::-1]
    try:
        got = ctx.adapter.reassemble(shuffled)
    except Exception as error:
        fail(
            f"{setup.case.describe()}: a complete set of {len(chunks)} chunks arriving as "
            f"{[c.chunk.chunk_id for c in shuffled]} was refused: {error!r} [CHUNK-2.1]",
            tier=BREAKS,
        )
    want = reassemble(chunks)
    if payload_equal(got, want):
        return
    spans = [(c.chunk.token_start, c.seq_len) for c in chunks]
    blocks_only = (
        isinstance(got, Payload)
        and got.block_ids != want.block_ids
        and payload_equal(replace(got, block_ids=want.block_ids), want)
    )
    fail(
        f"{setup.case.describe()}: chunks (token_start, tokens) {spans} of a request in blocks "
        f"{list(whole.block_ids)} of {BLOCK_SIZE} tokens, arriving as "
        f"{[c.chunk.chunk_id for c in shuffled]}, reassemble to "
        + (
            f"block ids {list(got.block_ids)}, not {list(want.block_ids)}: a block shared at "
            "a boundary is listed once [CHUNK-2.2]"
            if blocks_only
            else "another payload than the unchunked one [CHUNK-2.1]"
        )
    )


def _token_range(whole: Payload, start: int, stop: int, chunk: Chunk) -> Payload:
    """Tokens ``start..stop-1`` of ``whole`` as a chunk (block ids of those tokens)."""

    @overload
    def cut(values: Layers) -> Layers: ...
    @overload
    def cut(values: Layers | None) -> Layers | None: ...
    def cut(values: Layers | None) -> Layers | None:
        return (
            None if values is None else tuple(None if t is None else t[start:stop] for t in values)
        )

    first, last = start // BLOCK_SIZE, (stop - 1) // BLOCK_SIZE
    return replace(
        whole,
        key_cache=cut(whole.key_cache),
        value_cache=cut(whole.value_cache),
        seq_len=stop - start,
        block_ids=tuple(whole.block_ids[first : last + 1]),
        chunk=chunk,
    )


Probe = tuple[str, str, list[Payload]]


Named = tuple[str, str, list[Payload], tuple[object, ...]]
"""A probe with the values its refusal must name: (obligation, what, the chunks, values)."""


def _incomplete(whole: Payload, chunks: list[Payload], rng: random.Random) -> list[Named]:
    """Sets that are missing something or can never be valid [CHUNK-2], each with the chunk
    ids its refusal must name ("refused with every problem named")."""
    n = len(chunks)
    gap = rng.randrange(n - 1) if n > 1 else None
    probes: list[Named] = []
    if gap is not None:
        start = chunks[gap].chunk.token_start
        missing = f"{start}-{start + chunks[gap].seq_len - 1}"  # its token range, or its id
        probes.append(
            (
                "CHUNK-2.3",
                f"without chunk {gap} of {n}",
                chunks[:gap] + chunks[gap + 1 :],
                (gap, missing),
            )
        )
    probes.append(("CHUNK-2.4", f"without the final chunk {n - 1}", chunks[:-1], (n - 1, "final")))
    twice = rng.randrange(n)
    probes.append(("CHUNK-2.5", f"with chunk {twice} twice", [*chunks, chunks[twice]], (twice,)))
    if n > 1:
        i = rng.randrange(n - 1)
        grown = chunks[i]
        start = grown.chunk.token_start
        longer = _token_range(whole, start, start + grown.seq_len + 1, grown.chunk)
        overlapping = [longer if j == i else c for j, c in enumerate(chunks)]
        probes.append(
            ("CHUNK-2.5", f"chunk {i} one token into chunk {i + 1}", overlapping, (i, i + 1))
        )
    last = chunks[-1]
    extra = replace(
        last,
        chunk=Chunk(chunk_id=n, token_start=whole.seq_len, final=False),
        block_ids=(),
    )
    probes.append(("CHUNK-2.6", f"a chunk {n} past the final one", [*chunks, extra], (n,)))
    return probes


@check(
    "CHUNK-2",
    "refuses-incomplete",
    "a missing, repeated, overlapping or extra chunk is refused",
    needs=("chunks",),
    strategy=chunk_examples,
    examples=CHUNK_PINS,
    weight=1.0,  # token shards leave some cases nothing to cut: more draws
    covers=("CHUNK-2.3", "CHUNK-2.4", "CHUNK-2.5", "CHUNK-2.6"),
)
def refuses_incomplete(ctx: Context, example: Example) -> None:
    setup, whole, chunks = _whole_and_chunks(ctx, example)
    rng = random.Random(setup.seed)
    for obligation, what, ordered, naming in _incomplete(whole, chunks, rng):
        given = rng.sample(ordered, len(ordered))
        spans = [(c.chunk.chunk_id, c.chunk.token_start, c.seq_len) for c in given]

        def reassemble(given: list[Payload] = given) -> Payload:
            return ctx.adapter.reassemble(given)

        expect_refused(
            obligation,
            f"{setup.case.describe()}: reassembling {len(chunks)} chunks of {whole.seq_len} "
            f"tokens {what} (chunk id, token_start, tokens: {spans})",
            reassemble,
            naming=naming,
        )


def _disagreeing(whole: Payload, chunks: list[Payload], rng: random.Random) -> list[Probe]:
    """Complete sets with one chunk disagreeing in one fact [CHUNK-1]."""
    i = rng.randrange(len(chunks))
    victim = chunks[i]

    def swap(new: Payload) -> list[Payload]:
        return [new if j == i else c for j, c in enumerate(chunks)]

    marker = victim.head_slice
    probes: list[Probe] = [
        ("CHUNK-1.1", "request_id", swap(replace(victim, request_id=whole.request_id + "-x"))),
        ("CHUNK-1.1", "block_size", swap(replace(victim, block_size=BLOCK_SIZE + 1))),
        (
            "CHUNK-1.1",
            "tp_head_slice",
            swap(replace(victim, head_slice=replace(marker, target_rank=marker.target_rank + 1))),
        ),
    ]
    if len(victim.layers) > 1:
        layer = rng.choice(victim.layers)
        dropped: dict[str, Any] = {  # fields by name
            name: tuple(None if n == layer else t for n, t in enumerate(getattr(victim, name)))
            if getattr(victim, name) is not None
            else None
            for name in ("key_cache", "value_cache", "key_scale", "value_scale")
        }
        probes.append(
            ("CHUNK-1.2", f"present layers (layer {layer})", swap(replace(victim, **dropped)))
        )
    if victim.heads > 1:
        narrower: dict[str, Any] = {
            name: tuple(None if t is None else t[:, :-1] for t in getattr(victim, name))
            for name in ("key_cache", "value_cache")
        }
        probes.append(("CHUNK-1.2", "head shape", swap(replace(victim, **narrower))))
    if victim.dtype in FP8_DTYPES and victim.key_scale is not None:
        layer = rng.choice(victim.layers)
        name = rng.choice(["key_scale", "value_scale"] if victim.kv_tensors == 2 else ["key_scale"])
        scales = list(getattr(victim, name))
        scales[layer] = scales[layer] * 2
        scaled: dict[str, Any] = {name: tuple(scales)}
        probes.append(
            ("CHUNK-1.3", f"the {name} of layer {layer}", swap(replace(victim, **scaled)))
        )
    return probes


@check(
    "CHUNK-1",
    "refuses-disagreeing",
    "chunks of one edge that disagree in one fact are refused",
    needs=("chunks",),
    strategy=chunk_examples,
    examples=CHUNK_PINS,
    weight=1.0,  # token shards leave some cases nothing to cut: more draws
    covers=("CHUNK-1.1", "CHUNK-1.2", "CHUNK-1.3"),
)
def refuses_disagreeing(ctx: Context, example: Example) -> None:
    setup, whole, chunks = _whole_and_chunks(ctx, example)
    if len(chunks) < 2:
        vacuous()
    rng = random.Random(setup.seed)
    for obligation, what, given in _disagreeing(whole, chunks, rng):

        def reassemble(given: list[Payload] = given) -> Payload:
            return ctx.adapter.reassemble(given)

        expect_refused(
            obligation,
            f"{setup.case.describe()}: reassembling {len(chunks)} chunks, one of which "
            f"disagrees on {what}",
            reassemble,
        )
