"""Checks that a receiver refuses any set of shipments but exactly its plan's [RESHARD-3,
DTYPE-3].

Each example starts from the right shipments into one receiver and changes one thing
at a time — one dropped, one from a rank that is no source, one repeated, one carrying
another edge, one a token short, one a head or a layer off, one with other fp8 scales —
and every variant must be refused. Nothing may be dropped, padded or guessed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import cast

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect_refused
from kvspec.conformance.draws import (
    TENSOR_PINS,
    TENSOR_WEIGHT,
    Setup,
    edge_marker,
    no_fp8,
    tensor_examples,
)
from kvspec.conformance.families.transfer.checks import FP8_PINS
from kvspec.conformance.tiers import DIFFERS
from kvspec.tensors.dtypes import FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment, send
from kvspec.topology.plan import edge_between
from kvspec.topology.tokens import Tokens

Variant = tuple[str, str, list[Shipment]]
"""(obligation, what was changed, the shipments)."""


def _swap(shipments: list[Shipment], i: int, new: Shipment) -> list[Shipment]:
    """``shipments`` with the i-th replaced by ``new``."""
    return [new if j == i else s for j, s in enumerate(shipments)]


def _variants(setup: Setup, dst: int, rng: random.Random) -> list[Variant]:
    """Wrong sets of shipments into ``dst``, each one change away from the right one."""
    case, model = setup.case, setup.case.model
    good = setup.shipments_to(dst, "sender")
    found: list[Variant] = []
    i = rng.randrange(len(good))
    victim = good[i]
    found.append(
        (
            "RESHARD-3.1",
            f"the shipment from source {victim.edge.src} missing",
            good[:i] + good[i + 1 :],
        )
    )
    if setup.ctx.adapter.domain.repeated_deliveries:
        found.append(
            ("RESHARD-3.3", f"the shipment from source {victim.edge.src} twice", [*good, victim])
        )
    sources = set(setup.plan.sources_of(dst))
    others = [s for s in case.source.ranks() if s not in sources]
    if others:
        stranger = rng.choice(others)
        receiver = case.owner("target", dst)
        try:  # a replica the plan did not choose, sending what it holds
            edge = edge_between(case.owner("source", stranger), receiver, model)
            alone = replace(setup.plan, edges=(edge,))
            [extra] = send(alone, stranger, setup.source_shards[stranger])
        except ValueError:  # a rank sharing nothing with dst, posing as a source
            edge = replace(victim.edge, src=stranger)
            extra = Shipment(edge, edge_marker(setup.plan, edge, "sender"), victim.kv)
        found.append(("RESHARD-3.2", f"an extra shipment from rank {stranger}", [*good, extra]))
    for elsewhere in setup.plan.targets_of(victim.edge.src):
        if elsewhere == dst:
            continue
        (theirs,) = [
            s for s in setup.shipments_to(elsewhere, "sender") if s.edge.src == victim.edge.src
        ]
        mine = replace(theirs, marker=replace(theirs.marker, target_rank=dst))
        found.append(
            (
                "RESHARD-3.4",
                f"source {victim.edge.src}'s shipment for target {elsewhere} marked for {dst}",
                _swap(good, i, mine),
            )
        )
        break
    if victim.edge.tokens is not None:
        shifted = Tokens.of(range(r.start + 1, r.stop + 1) for r in victim.edge.tokens.ranges)
        found.append(
            (
                "SLICE-4.2",
                f"the shipment from source {victim.edge.src} marked as carrying tokens "
                f"{shifted.describe()}, not its edge's {victim.edge.tokens.describe()}",
                _swap(good, i, replace(victim, marker=replace(victim.marker, tokens=shifted))),
            )
        )
    if len(good) > 1 and victim.kv.seq_len > 1:
        short = RequestKV(victim.kv.data[:, :, :-1], victim.kv.scales)
        found.append(
            (
                "RESHARD-3.5",
                f"the shipment from source {victim.edge.src} one token shorter than the others",
                _swap(good, i, replace(victim, kv=short)),
            )
        )
    data = victim.kv.data
    grown = [
        ("one head more", torch.cat([data, data[:, :, :, :1]], dim=3), victim.kv.scales),
        ("head_dim one longer", torch.cat([data, data[..., :1]], dim=4), victim.kv.scales),
    ]
    if data.shape[0] > 1:
        scales = None if victim.kv.scales is None else victim.kv.scales[:-1]
        grown.append(("one layer fewer", data[:-1], scales))
    else:
        scales = None if victim.kv.scales is None else torch.cat([victim.kv.scales] * 2)
        grown.append(("one layer more", torch.cat([data, data]), scales))
    what, bad, scales = rng.choice(grown)
    found.append(
        (
            "RESHARD-3.6",
            f"the shipment from source {victim.edge.src} with {what} than its edge",
            _swap(good, i, replace(victim, kv=RequestKV(bad, scales))),
        )
    )
    return found


@check(
    "RESHARD-3",
    "refuses-wrong-shipments",
    "missing, extra, repeated, misaddressed, short or misshapen shipments are refused",
    needs=("receiver",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=(*(f"RESHARD-3.{i}" for i in range(1, 7)), "SLICE-4.2"),
)
def refuses_wrong_shipments(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        for obligation, what, shipments in _variants(setup, dst, rng):
            replica = obligation == "RESHARD-3.2" and _replica_extra(setup, dst, shipments[-1])

            def combine(shipments: list[Shipment] = shipments, dst: int = dst) -> RequestKV:
                return ctx.adapter.receiver_combine(setup.case, dst, shipments)

            expect_refused(
                obligation,
                f"{setup.case.describe()}, seq_len {setup.seq_len}: target rank {dst} assembling "
                f"with {what}"
                + (
                    ", a replica sending the identical bytes it holds, as the adapter declares "
                    "every replica does (replicas_write='every')"
                    if replica
                    else ""
                ),
                combine,
                accepted_tier=DIFFERS if replica else None,
            )


def _replica_extra(setup: Setup, dst: int, extra: Shipment) -> bool:
    """Whether ``extra`` is what an engine whose replicas all write sends ``dst``: the
    adapter declares ``replicas_write`` ``"every"``, and the shipment is the edge from a
    source rank holding part of what ``dst`` owns (a replica) with the bytes it holds."""
    if setup.ctx.adapter.replicas_write != "every":
        return False
    case = setup.case
    try:
        edge = edge_between(
            case.owner("source", extra.edge.src), case.owner("target", dst), case.model
        )
    except ValueError:
        return False
    if extra.edge != edge:
        return False
    alone = replace(setup.plan, edges=(edge,))
    [want] = send(alone, extra.edge.src, setup.source_shards[extra.edge.src])
    bits = [s.kv.data.contiguous().view(torch.uint8) for s in (want, extra)]
    return bits[0].shape == bits[1].shape and torch.equal(*bits)


def _scale_variants(setup: Setup, dst: int, rng: random.Random) -> list[Variant]:
    """fp8 shipments into ``dst`` with one scale changed, or scales missing [DTYPE-3]."""
    good = setup.shipments_to(dst, "sender")
    found: list[Variant] = []
    i = rng.randrange(len(good))
    victim = good[i]
    found.append(
        (
            "DTYPE-3.3",
            f"the shipment from source {victim.edge.src} without its scales",
            _swap(good, i, replace(victim, kv=RequestKV(victim.kv.data))),
        )
    )
    shared = [
        (a, b)
        for a in range(len(good))
        for b in range(len(good))
        if a < b and set(good[a].edge.layers) & set(good[b].edge.layers)
    ]
    if shared:
        first, second = rng.choice(shared)
        layer = rng.choice(sorted(set(good[first].edge.layers) & set(good[second].edge.layers)))
        kv = rng.randrange(setup.case.model.kv_tensors)
        row = layer - good[second].edge.layers.start
        scales = cast(torch.Tensor, good[second].kv.scales).clone()  # fp8: it has scales
        scales[row, kv] *= 2
        changed = replace(good[second], kv=RequestKV(good[second].kv.data, scales))
        found.append(
            (
                "DTYPE-3.2",
                f"source {good[second].edge.src}'s {'KV'[kv] if kv < 2 else ''} scale of layer "
                f"{layer} twice source {good[first].edge.src}'s",
                _swap(good, second, changed),
            )
        )
    return found


def _scale_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    """Mostly fp8 cases; sometimes another dtype, to carry stray scales [DTYPE-3.4]."""
    return st.one_of(tensor_examples(adapter, dtypes=FP8_DTYPES), tensor_examples(adapter))


def _stray_scales(setup: Setup, dst: int) -> Variant:
    """Non-fp8 shipments, one carrying scales anyway [DTYPE-3.4]."""
    good = setup.shipments_to(dst, "sender")
    victim = good[0]
    scales = torch.ones(len(victim.edge.layers), setup.case.model.kv_tensors)
    return (
        "DTYPE-3.4",
        f"{setup.case.model.dtype} KV from source {victim.edge.src} that carries scales",
        _swap(
            good, 0, replace(victim, kv=RequestKV(victim.kv.data, scales.to(victim.kv.data.device)))
        ),
    )


def _refuse_all(setup: Setup, dst: int, variants: list[Variant], run: Callable) -> None:
    for obligation, what, shipments in variants:

        def assemble(shipments: list[Shipment] = shipments) -> object:
            return run(shipments)

        expect_refused(
            obligation,
            f"{setup.case.describe()}: target rank {dst} assembling with {what}",
            assemble,
        )


@check(
    "DTYPE-3",
    "refuses-bad-scales",
    "fp8 scales missing or differing between senders, or scales on other dtypes, are refused",
    needs=("receiver", "fp8-scales"),
    strategy=_scale_examples,
    examples=FP8_PINS + TENSOR_PINS[:1],
    weight=TENSOR_WEIGHT,
    missing=no_fp8,
    covers=("DTYPE-3.2", "DTYPE-3.3", "DTYPE-3.4"),
)
def refuses_bad_scales(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    fp8 = setup.case.model.dtype in FP8_DTYPES
    for dst in setup.receivers():
        variants = _scale_variants(setup, dst, rng) if fp8 else [_stray_scales(setup, dst)]

        def run(shipments: list[Shipment], dst: int = dst) -> object:
            return ctx.adapter.receiver_combine(setup.case, dst, shipments)

        _refuse_all(setup, dst, variants, run)
