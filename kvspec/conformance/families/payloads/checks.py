"""Checks of merging several senders' payloads into one receiver shard [PAYLOAD-2,
PAYLOAD-3].

The payloads come from the reference sender along the plan's edges, each with block
ids of its own; the implementation's merge must give the spec's shard whatever the
arrival order. Then one payload at a time is made to disagree in one fact — request
id, seq_len, num_layers, dtype, block_size, chunk, a missing or an extra layer — and
every such set must be refused.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect_refused, fail
from kvspec.conformance.draws import BLOCK_SIZE, TENSOR_PINS, Inbox, Setup, inbox, tensor_examples
from kvspec.conformance.tiers import BREAKS
from kvspec.tensors.dtypes import DTYPES
from kvspec.transport.payload import (
    Chunk,
    Layers,
    Payload,
    merge_payloads,
    payload_equal,
)


def _describe_difference(got: object, want: Payload) -> str:
    if not isinstance(got, Payload):
        return f"the merge returned a {type(got).__name__}, not a Payload"
    for fact in ("request_id", "seq_len", "dtype", "block_size", "chunk", "layers"):
        a, b = getattr(got, fact), getattr(want, fact)
        if a != b:
            return f"its {fact} is {a!r}, the spec's {b!r}"
    if got.head_slice != want.head_slice:
        return (
            f"its tp_head_slice is {got.head_slice.to_dict()}, the spec's "
            f"{want.head_slice.to_dict()} (num_slices 1, applied by the receiver)"
        )
    if not payload_equal(replace(got, block_ids=want.block_ids), want):
        return "its tensors differ from the spec's (shards placed out of source-rank order?)"
    return f"its block_ids are {list(got.block_ids)}, the lowest source's {list(want.block_ids)}"


@check(
    "PAYLOAD-3",
    "merge",
    "shards merge in source-rank order whatever the arrival; the lowest source's block ids",
    needs=("payload",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=0.5,
    covers=("PAYLOAD-3.1", "PAYLOAD-3.9"),
)
def merge(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        received = inbox(setup, dst, rng.choice(["sender", "receiver"]))
        want = merge_payloads(setup.plan, dst, received)
        shuffled = rng.sample(received, len(received))
        if [s for s, _ in shuffled] == [s for s, _ in received]:
            shuffled = received[::-1]
        try:
            got = ctx.adapter.merge(setup.case, dst, shuffled)
        except Exception as error:
            fail(
                f"{setup.case.describe()}: target rank {dst} refused a valid set of payloads "
                f"from {[s for s, _ in shuffled]}: {error!r} [PAYLOAD-3.1]",
                tier=BREAKS,
            )
        if payload_equal(got, want):
            continue
        block_ids_only = (
            isinstance(got, Payload)
            and got.block_ids != want.block_ids
            and payload_equal(replace(got, block_ids=want.block_ids), want)
        )
        fail(
            f"{setup.case.describe()}: target rank {dst}'s merge of payloads arriving from "
            f"{[s for s, _ in shuffled]} differs from the spec's: "
            f"{_describe_difference(got, want)} "
            f"[{'PAYLOAD-3.9' if block_ids_only else 'PAYLOAD-3.1'}]"
        )


def _tensors(
    payload: Payload, change: Callable[[torch.Tensor], torch.Tensor], **facts: Any
) -> Payload:
    """``payload`` with ``change`` applied to every present cache tensor (and ``facts``)."""

    def apply(values: Layers) -> Layers:
        return tuple(None if t is None else change(t) for t in values)

    return replace(
        payload,
        key_cache=apply(payload.key_cache),
        value_cache=apply(payload.value_cache),
        **facts,
    )


def _extra_layer(payload: Payload) -> Payload:
    """``payload`` with one more (absent) layer at the end: num_layers + 1."""
    return payload.with_layers(lambda values: (*values, None))


def _without_layer(payload: Payload, layer: int) -> Payload:
    return payload.with_layers(
        lambda values: tuple(None if i == layer else t for i, t in enumerate(values))
    )


def _with_layer(payload: Payload, layer: int) -> Payload:
    """``payload`` also carrying ``layer`` (a copy of its first present layer)."""
    first = payload.layers[0]
    return payload.with_layers(
        lambda values: tuple(values[first] if i == layer else t for i, t in enumerate(values))
    )


def _other_dtype(payload: Payload) -> Payload:
    """The same bits read as another dtype of one itemsize (bfloat16 <-> float16, the two
    fp8 kinds), or float32 cast down: dtype alone differs."""
    torch_dtype = DTYPES[payload.dtype]
    same = [n for n, d in DTYPES.items() if d != torch_dtype and d.itemsize == torch_dtype.itemsize]
    if same:
        other = same[0]
        return _tensors(payload, lambda t: t.view(DTYPES[other]), dtype=other)
    return _tensors(payload, lambda t: t.to(torch.bfloat16), dtype="bfloat16")


Probe = tuple[str, str, Inbox]


def disagreements(setup: Setup, received: Inbox, rng: random.Random) -> list[Probe]:
    """Sets of payloads into one receiver, each with one fact changed [PAYLOAD-2, PAYLOAD-3]."""
    probes: list[Probe] = []
    i = rng.randrange(len(received))
    src, victim = received[i]

    def swap(new: Payload) -> Inbox:
        return [(s, new if j == i else p) for j, (s, p) in enumerate(received)]

    model = setup.case.model
    if len(received) > 1:
        probes.append(("PAYLOAD-3.2", "request_id", swap(replace(victim, request_id="req-2"))))
        probes.append(("PAYLOAD-3.4", "num_layers", swap(_extra_layer(victim))))
        probes.append(("PAYLOAD-3.5", "dtype", swap(_other_dtype(victim))))
        probes.append(
            ("PAYLOAD-3.6", "block_size", swap(replace(victim, block_size=BLOCK_SIZE + 1)))
        )
        chunk = Chunk(chunk_id=0, token_start=0, final=False)
        probes.append(("PAYLOAD-3.7", "chunk", swap(replace(victim, chunk=chunk))))
        if victim.seq_len > 1:
            short = _tensors(victim, lambda t: t[:-1], seq_len=victim.seq_len - 1)
            # With token shards each payload holds its own edge's tokens: one token fewer is
            # one token short of its edge [SLICE-4].
            obligation = "PAYLOAD-3.3" if setup.plan.seq_len is None else "SLICE-4.2"
            probes.append((obligation, "seq_len", swap(short)))
        present = {s: set(p.layers) for s, p in received}
        for layer in victim.layers:
            if len(victim.layers) > 1 and any(layer in ls for s, ls in present.items() if s != src):
                probes.append(
                    (
                        "PAYLOAD-3.8",
                        f"layer {layer}, missing on source {src}'s shard alone",
                        swap(_without_layer(victim, layer)),
                    )
                )
                break
    everyone = [(s, _extra_layer(p)) for s, p in received]
    probes.append(("PAYLOAD-2.1", f"num_layers {model.num_layers + 1} on every shard", everyone))
    outside = [n for n in range(model.num_layers) if n not in victim.layers]
    if outside:
        layer = rng.choice(outside)
        probes.append(
            ("PAYLOAD-2.2", f"layer {layer}, outside its edge", swap(_with_layer(victim, layer)))
        )
    return probes


@check(
    "PAYLOAD-3",
    "refuses-disagreement",
    "shards that disagree in one fact, or carry layers other than their edge's, are refused",
    needs=("payload",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=0.5,
    covers=(
        "PAYLOAD-2.1",
        "PAYLOAD-2.2",
        *(f"PAYLOAD-3.{i}" for i in range(2, 9)),
    ),
)
def refuses_disagreement(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        received = inbox(setup, dst)
        for obligation, what, bad in disagreements(setup, received, rng):

            def merge(bad: Inbox = bad, dst: int = dst) -> object:
                return ctx.adapter.merge(setup.case, dst, bad)

            expect_refused(
                obligation,
                f"{setup.case.describe()}, seq_len {setup.seq_len}: target rank {dst} merging "
                f"payloads that disagree on {what}",
                merge,
            )
