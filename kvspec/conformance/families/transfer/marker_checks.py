"""Checks of the receiver's slice step and its tp_head_slice marker [SLICE-3].

A receiver cuts an unapplied slice exactly once and marks it applied by the receiver;
an applied slice — applied by the sender, or by this very receiver before — passes
untouched; a payload marked for another rank is refused whether or not it is applied.
Shipments come from the reference sender, so only the marker step is under test.
"""

from __future__ import annotations

import random
from dataclasses import replace

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect, expect_refused, fail
from kvspec.conformance.draws import TENSOR_PINS, TENSOR_WEIGHT, Setup, difference, tensor_examples
from kvspec.conformance.tiers import BREAKS, DIFFERS
from kvspec.tensors.reshard import HEAD_AXIS, Shipment
from kvspec.tensors.slicing import HeadSlice, apply_head_slice


def _apply(ctx: Context, setup: Setup, dst: int, shipment: Shipment, label: str) -> Shipment:
    try:
        out = ctx.adapter.apply_marker(setup.case, dst, shipment)
    except Exception as error:
        fail(
            f"{setup.case.describe()}: target rank {dst} refused {label} shipment from source "
            f"{shipment.edge.src} (marker {shipment.marker.to_dict()}): {error!r} [SLICE-3.1]",
            tier=BREAKS,
        )
    if not isinstance(out, Shipment):
        fail(f"apply_marker returned a {type(out).__name__}, not a Shipment [SLICE-3.1]")
    return out


@check(
    "SLICE-3",
    "applied-once",
    "an unapplied slice is cut once and marked; an applied one is never cut again",
    needs=("marker",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("SLICE-3.1", "SLICE-3.2", "SLICE-1.3"),
)
def applied_once(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    where = setup.case.describe()
    differs: str | None = None  # a marker-only difference, raised after every other check
    for dst in setup.receivers():
        sliced = setup.shipments_to(dst, "sender")
        whole = setup.shipments_to(dst, "receiver")
        for by_sender, unapplied in zip(sliced, whole, strict=True):
            edge = by_sender.edge
            cut = _apply(ctx, setup, dst, unapplied, "an unapplied")
            want_marker = replace(unapplied.marker, applied=True, side="receiver")
            problem = difference(cut.kv, by_sender.kv)
            which = (
                f"offset {edge.offset_in_shard} of {edge.num_slices}) wrongly [SLICE-3.1]"
                if edge.offset_in_shard is not None
                else f"heads {list(unapplied.marker.heads or ())} of the sender's shard, no "
                "equal slice) wrongly [SLICE-1.3, SLICE-3.1]"
            )
            expect(
                problem is None,
                f"{where}: target rank {dst} cut the unapplied slice from source {edge.src} "
                f"({which}: {problem}",
            )
            if cut.marker != want_marker:
                message = (
                    f"{where}: after cutting the slice from source {edge.src}, target rank {dst} "
                    f"marked it {cut.marker.to_dict()}; expected {want_marker.to_dict()} (applied "
                    "by the receiver) [SLICE-3.1]"
                )
                expect(_harmless(cut, dst), message)
                if differs is None:
                    differs = (
                        f"{message}. The KV is bit-identical to the sender's cut, and a receiver "
                        "applying that marker again keeps it so (the marker's one job, that the "
                        "slice is cut once, holds for this transfer): a marker-only difference"
                    )
            for label, applied in (("a sender-applied", by_sender), ("a receiver-applied", cut)):
                again = _apply(ctx, setup, dst, applied, label)
                problem = difference(again.kv, applied.kv)
                expect(
                    problem is None and again.marker == applied.marker,
                    f"{where}: target rank {dst} cut {label} slice from source {edge.src} "
                    f"(marker {applied.marker.to_dict()}) again; an applied slice is never cut "
                    f"again [SLICE-3.2]: {problem or f'marker became {again.marker.to_dict()}'}",
                )
    if differs is not None:
        fail(differs, tier=DIFFERS)


def _harmless(out: Shipment, dst: int) -> bool:
    """Whether a receiver following [SLICE-3] leaves ``out``'s KV as it is when it meets
    ``out``'s marker again: the marker names this rank and is applied, or it is unapplied
    but cutting it again is the identity (one slice of the whole shard, as on a fan-in).
    The marker exists so that a slice is cut exactly once; a marker that cannot cause a
    second cut (or a refusal) downstream leaves this transfer's KV right. The check has
    already found the KV itself bit-identical to the sender's cut."""
    marker: HeadSlice = out.marker
    try:
        data, _ = apply_head_slice(out.kv.data, marker, my_rank=dst, head_axis=HEAD_AXIS)
    except ValueError:  # names another rank, or cannot be cut from this shard
        return False
    # a cut keeping the shape keeps every head: slice 0 of 1, or heads [0, n) of n
    return tuple(data.shape) == tuple(out.kv.data.shape)


@check(
    "SLICE-3",
    "refuses-other-rank",
    "a payload marked for another rank is refused, applied or not",
    needs=("marker",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("SLICE-3.3",),
)
def refuses_other_rank(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    world = setup.case.target.world_size
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        for slicing in ("sender", "receiver"):
            shipment = rng.choice(setup.shipments_to(dst, slicing))
            other = rng.choice([r for r in range(world + 1) if r != dst])  # world: no such rank
            stray = replace(shipment, marker=replace(shipment.marker, target_rank=other))
            state = "an applied" if stray.marker.applied else "an unapplied"

            def apply(stray: Shipment = stray, dst: int = dst) -> Shipment:
                return ctx.adapter.apply_marker(setup.case, dst, stray)

            expect_refused(
                "SLICE-3.3",
                f"{setup.case.describe()}: at target rank {dst}, {state} payload from source "
                f"{shipment.edge.src} marked for target rank {other}",
                apply,
                naming=(other,),
                accepted={"target_rank": dst, "marker": stray.marker.to_dict()},
            )
