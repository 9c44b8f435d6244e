"""Checks of what travels and how it is combined, on real tensors.

A request's KV of random bits (NaN payloads and -0.0 included) is sharded by the
reference for the source layout (its heads, layers and, with token shards, tokens, on
the request's DP group); the implementation's sender transform and receiver combine
must reproduce the reference's target shards bit for bit [RESHARD-2]. Receivers that
hold nothing of the request (no token of it, or another DP group) are not asked.
Edges follow the implementation's own routing when it provides one, so any replica
choice that satisfies the rules passes [PLAN-4]. Under receiver-side slicing the
receiver's slice step is the adapter's :meth:`apply_marker` when it has one, else its
``receiver_combine`` cuts [SLICE-3].
"""

from __future__ import annotations

import random

import torch

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect, fail
from kvspec.conformance.draws import (
    TENSOR_PINS,
    TENSOR_WEIGHT,
    Setup,
    difference,
    no_fp8,
    tensor_examples,
    tensor_pins,
)
from kvspec.tensors.dtypes import FP8_DTYPES, raw_bits
from kvspec.tensors.reshard import send
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

FP8_PINS = tensor_pins(
    TransferCase(
        StageLayout(4), StageLayout(2), ModelShape(2, 4, 2, dtype="float8_e4m3fn")
    ).to_dict(),
    TransferCase(
        StageLayout(2, 2), StageLayout(2), ModelShape(3, 2, 2, dtype="float8_e5m2")
    ).to_dict(),
)


@check(
    "SLICE-1",
    "sender-content",
    "each edge carries the sender's slice (or whole shard) of the edge's layers",
    needs=("sender",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("SLICE-1.1", "SLICE-1.2", "SLICE-1.3", "SLICE-2.1", "PLAN-6.1", "PLAN-6.2"),
)
def sender_content(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    for slicing in ctx.adapter.slicing_modes:
        for src in setup.case.source.ranks():
            owner = setup.case.owner("source", src)
            for dst, kv in setup.sender_output(src, slicing).items():
                edge = setup.edge(src, dst)
                [expected] = [
                    s.kv
                    for s in send(setup.plan, src, setup.source_shards[src], slicing=slicing)
                    if s.edge.dst == dst
                ]
                problem = difference(kv, expected)
                if problem is None:
                    continue
                layers_wrong = kv.data.dim() == 5 and kv.data.shape[0] != len(edge.layers)
                tokens_wrong = kv.data.dim() == 5 and kv.data.shape[2] != expected.seq_len
                if layers_wrong:
                    obligation = "SLICE-1.2"
                elif tokens_wrong:
                    obligation = "PLAN-6.2"
                elif slicing == "receiver":
                    obligation = "SLICE-2.1"
                elif edge.offset_in_shard is None:
                    obligation = "PLAN-6.1, SLICE-1.3"
                else:
                    obligation = "SLICE-1.1"
                slice_of = (
                    f"slice {edge.offset_in_shard} of {edge.num_slices}"
                    if edge.offset_in_shard is not None
                    else f"heads {edge.head_offset}..{edge.head_offset + len(edge.heads) - 1}"
                )
                heads = (
                    f"heads {edge.heads.start}..{edge.heads.stop - 1} ({slice_of} of the "
                    "sender's heads)"
                    if slicing == "sender"
                    else f"the sender's whole head shard {owner.heads.start}.."
                    f"{owner.heads.stop - 1} (receiver-side slicing)"
                )
                tokens = "" if edge.tokens is None else f", tokens {edge.tokens.describe()}"
                fail(
                    f"{setup.case.describe()}, {slicing}-side slicing: edge {src}->{dst} should "
                    f"carry layers {edge.layers.start}..{edge.layers.stop - 1} and {heads}"
                    f"{tokens} [{obligation}]: {problem}"
                )


@check(
    "RESHARD-2",
    "round-trip",
    "sender transform then receiver combine reproduce the target shards",
    needs=("sender", "receiver"),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("RESHARD-2.1", "SLICE-4.1"),
)
def round_trip(ctx: Context, example: Example) -> None:
    Setup(ctx, example).expect_end_to_end("RESHARD-2.1", "the shard differs from the spec's")


@check(
    "RESHARD-2",
    "arrival-order",
    "the assembled shard does not depend on the arrival order of the shipments",
    needs=("receiver",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("RESHARD-2.2",),
)
def arrival_order(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        shipments = setup.shipments_to(dst, "sender")
        shuffled = rng.sample(shipments, len(shipments))
        if [s.edge.src for s in shuffled] == [s.edge.src for s in shipments]:
            shuffled = shipments[::-1]
        got = setup.combine(dst, shuffled)
        problem = difference(got, setup.target_shards[dst])
        expect(
            problem is None,
            f"{setup.case.describe()}: target rank {dst} assembles a wrong shard when its "
            f"shipments arrive from sources {[s.edge.src for s in shuffled]} in that order; the "
            f"result must not depend on arrival order [RESHARD-2.2]: {problem}",
        )


@check(
    "RESHARD-1",
    "shard-shape",
    "a receiver's shard is exactly its layers and heads",
    needs=("receiver",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("RESHARD-1.1",),
)
def shard_shape(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    model = setup.case.model
    for dst in setup.receivers():
        owner = setup.case.owner("target", dst)
        got = setup.combine(dst, setup.shipments_to(dst, "sender"))
        want = [
            len(owner.layers),
            model.kv_tensors,
            owner.token_count(setup.seq_len),
            len(owner.heads),
            model.head_dim,
        ]
        expect(
            list(got.data.shape) == want,
            f"{setup.case.describe()}: target rank {dst} owns layers "
            f"{owner.layers.start}..{owner.layers.stop - 1} and heads "
            f"{owner.heads.start}..{owner.heads.stop - 1}, so its shard is {want}; the "
            f"implementation returned {list(got.data.shape)} [RESHARD-1.1]",
        )


@check(
    "SLICE-2",
    "modes-agree",
    "sender-side and receiver-side slicing give identical bits",
    needs=("sender", "receiver"),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    missing=lambda a: (
        None
        if len(set(a.slicing_modes)) == 2
        else f"the adapter's sender transform does only {list(a.slicing_modes)} slicing"
    ),
    covers=("SLICE-2.2",),
)
def modes_agree(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    by_sender = setup.end_to_end("sender")
    by_receiver = setup.end_to_end("receiver")
    for dst, a in by_sender.items():
        problem = difference(by_receiver[dst], a)
        expect(
            problem is None,
            f"{setup.case.describe()}: target rank {dst} differs between sender-side and "
            f"receiver-side slicing [SLICE-2.2]: {problem}",
        )


# Bit patterns, as the signed integers raw_bits() reads: a NaN with a payload, and -0.0.
_NAN_WITH_PAYLOAD = {torch.float32: 0x7FC0_1234, torch.bfloat16: 0x7FC1, torch.float16: 0x7E01}
_NEGATIVE_ZERO = {4: -0x8000_0000, 2: -0x8000}


def _special_values(setup: Setup) -> None:
    """Overwrite every fourth element (at random) with a NaN payload or -0.0 [DTYPE-2]."""
    data = setup.full.data
    assert data.is_contiguous()
    flat = raw_bits(data).view(-1)  # shares data's storage
    generator = torch.Generator().manual_seed(setup.seed)
    where = torch.randint(0, flat.numel(), (max(1, flat.numel() // 4),), generator=generator)
    nan = torch.rand(where.shape, generator=generator) < 0.5
    values = torch.where(
        nan, _NAN_WITH_PAYLOAD[data.dtype], _NEGATIVE_ZERO[data.element_size()]
    ).to(flat.dtype)
    flat[where.to(flat.device)] = values.to(flat.device)
    setup.reshard_full()


_SPECIAL_DTYPES = ("float32", "bfloat16", "float16")


@check(
    "DTYPE-2",
    "special-values",
    "NaN payloads and -0.0 arrive unchanged",
    needs=("sender", "receiver"),
    strategy=lambda adapter: tensor_examples(adapter, dtypes=_SPECIAL_DTYPES),
    examples=TENSOR_PINS[:2],
    weight=TENSOR_WEIGHT,
    missing=lambda a: (
        None
        if a.domain.model_dtypes(_SPECIAL_DTYPES)
        else "the adapter's domain has no float32, bfloat16 or float16"
    ),
    covers=("DTYPE-2.1",),
)
def special_values(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    _special_values(setup)
    setup.expect_end_to_end("DTYPE-2.1", "NaN payloads and -0.0 must arrive bit for bit")


@check(
    "DTYPE-3",
    "scales-travel",
    "fp8 scales travel with the data, each shard with the scales of its layers",
    needs=("sender", "receiver", "fp8-scales"),
    strategy=lambda adapter: tensor_examples(adapter, dtypes=FP8_DTYPES),
    examples=FP8_PINS,
    weight=TENSOR_WEIGHT,
    missing=no_fp8,
    covers=("DTYPE-3.1", "RESHARD-1.2"),
)
def scales_travel(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    for slicing in ctx.adapter.slicing_modes:
        for dst, got in setup.end_to_end(slicing).items():
            want = setup.target_shards[dst]
            problem = difference(got, want)
            if problem is None:
                continue
            about_scales = problem.startswith("scales")
            obligation = "DTYPE-3.1" if got.scales is None or not about_scales else "RESHARD-1.2"
            fail(
                f"{setup.case.describe()}, {slicing}-side slicing: target rank {dst} must get "
                f"its data and the scales of its {want.data.shape[0]} layer(s) bit for bit "
                f"[{obligation}]: {problem}"
            )
