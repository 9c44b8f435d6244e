"""What the families share to draw and set up their examples: a transfer case of the
adapter's domain and the pinned ones (:func:`case_examples`, :data:`ROUTING_PINS`), its
spec and routed plans, and a case on real tensors (:func:`tensor_examples`,
:class:`Setup`: the request's KV, the reference shards on both sides, the
implementation's sender and receiver along the routed plan) with the received payloads
(:func:`inbox`) [PLAN, RESHARD, SLICE].

A family imports these, never another family's modules; what some families share beside
them is in the modules beside this one: hybrid models (:mod:`.hybrids`), record and
block-scaled regions (:mod:`.records`), wire messages (:mod:`.messages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter, provided_capabilities
from kvspec.conformance.checks import Context, Example, OutsideDomain, within_domain
from kvspec.conformance.checks.expectations import expect, fail
from kvspec.conformance.tiers import BREAKS
from kvspec.memory.paged import blocks_needed
from kvspec.tensors.dtypes import raw_bits
from kvspec.tensors.kv import RequestKV, random_request_kv
from kvspec.tensors.reshard import Shipment, send, shard
from kvspec.tensors.reshard import edge_marker as spec_marker
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import Edge, ReplicaRule, TransferPlan, edge_between
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import (
    Payload,
    payload_from_shipment,
)


def case_examples(adapter: Adapter, **kwargs: Any) -> st.SearchStrategy[Example]:
    """Valid transfer cases inside the adapter's domain, under the policies it names, its
    stages split as the engine splits layers by default (``Adapter.layer_partition``)."""
    cases = adapter.domain.cases(
        policies=adapter.drawn_policies, partition=adapter.layer_partition, **kwargs
    )
    return cases.map(TransferCase.to_dict)


def spec_rule(adapter: Adapter, case: TransferCase) -> ReplicaRule | None:
    """The adapter's own rule of ``case``'s policy (``Adapter.policy_rules``: a field rule
    of :mod:`kvspec.topology.field_policies`, or one of its own); None for the spec's
    ``lowest`` and ``balanced``. Every family's expected plan is made under it, a uniform
    model's, a hybrid's layer groups' and its state reads' alike [PLAN-4]."""
    return adapter.policy_rules.get(case.policy)


def spec_plan(adapter: Adapter, case: TransferCase) -> TransferPlan:
    """The spec's plan of ``case``, under the adapter's own rule when its policy is one."""
    return case.plan(spec_rule(adapter, case))


def pinned_case(tp_s: int, tp_t: int, heads: int, layers: int = 2, **kw: Any) -> Example:
    pp_s, pp_t = kw.get("pp_s", 1), kw.get("pp_t", 1)
    return TransferCase(
        StageLayout(tp_s, pp_s),
        StageLayout(tp_t, pp_t),
        ModelShape(layers, heads, 2),
        kw.get("policy", "lowest"),
    ).to_dict()


ROUTING_PINS: tuple[Example, ...] = (
    pinned_case(
        4, 2, 2
    ),  # GQA replicas on the sender: each head must be taken once, not merged twice
    pinned_case(8, 2, 4),  # TP8 -> TP2 with 4 heads
    pinned_case(2, 8, 4),  # fan-out into replicated heads
    pinned_case(2, 4, 8),  # fan-out, two heads per slice: a slice cut twice loses one
    pinned_case(1, 2, 2),  # a TP1 sender: legacy keys are for two single-rank stages only
    pinned_case(2, 2, 8, layers=5, pp_s=2, pp_t=3),  # uneven pipeline partitions on both sides
    pinned_case(4, 4, 2, layers=3, pp_s=2, pp_t=1),  # replicated heads from two pipeline stages
    # an uneven prefill split into one decode stage, no replicas: each stage's K and V
    # layers land in the decode's own buffers [LAYER-1] (SGLang's split [1, 2] misroutes V:
    # sgl-project/sglang#27740)
    pinned_case(2, 2, 2, layers=3, pp_s=2, pp_t=1),
    TransferCase(StageLayout(4), StageLayout(8), ModelShape.mla(2, 4)).to_dict(),
    TransferCase(StageLayout(4, 2), StageLayout(2), ModelShape.mla(3, 2)).to_dict(),
    pinned_case(4, 6, 12),  # no TP divides the other: heads by range, some no equal slice
    pinned_case(6, 4, 12, layers=3, pp_t=2),
    TransferCase(
        StageLayout(4, cp=2, cp_rule="interleave:2"),
        StageLayout(6),
        ModelShape(2, 12, 2),
        seq_len=9,
    ).to_dict(),
    TransferCase(  # PCP -> DCP: token sets on both sides
        StageLayout(4, cp=2, cp_rule="zigzag"),
        StageLayout(8, dcp=2, cp_rule="interleave:1"),
        ModelShape(2, 2, 2),
        seq_len=9,
    ).to_dict(),
    TransferCase(  # a request on DP group 1 of the source, group 0 of the target
        StageLayout(8, dp=2), StageLayout(4, dp=2), ModelShape(2, 2, 2), source_dp=1
    ).to_dict(),
)
"""Configurations where routing bugs of the field show: replicas, fan-out, PP, MLA, TP
sizes that do not divide, token shards, attention-DP groups."""


def policy_in_domain(ctx: Context, case: TransferCase) -> None:
    """A pinned case under a policy the adapter does not name lies outside its domain."""
    if case.policy not in ctx.adapter.drawn_policies:
        raise OutsideDomain


TENSOR_WEIGHT = 0.5


def tensor_examples(adapter: Adapter, **case_kwargs: Any) -> st.SearchStrategy[Example]:
    """A small valid case of the domain, a sequence length and a seed for data and order
    (a case with token shards brings its own length [PLAN-6])."""
    return st.fixed_dictionaries(
        {
            "case": case_examples(adapter, max_layers=4, max_head_dim=3, **case_kwargs),
            "seq_len": st.integers(1, 3),
            "seed": st.integers(0, 2**16),
        }
    )


def tensor_pins(*cases: Example) -> tuple[Example, ...]:
    return tuple({"case": c, "seq_len": 2, "seed": 0} for c in cases)


TENSOR_PINS = tensor_pins(*ROUTING_PINS)


def no_fp8(adapter: Adapter) -> str | None:
    return None if adapter.domain.fp8 else "the adapter's domain has no fp8 dtype"


class Setup:
    """The request's KV, the reference shards on both sides and the routed plan."""

    def __init__(self, ctx: Context, example: Example) -> None:
        self.ctx = ctx
        self.case = TransferCase.from_dict(example["case"])
        within_domain(ctx, self.case)
        policy_in_domain(ctx, self.case)
        # A sharded case has its seq_len [PLAN-6].
        self.seq_len: int = (
            cast(int, self.case.seq_len) if self.case.sharded else example["seq_len"]
        )
        self.seed = example["seed"]
        self.full = random_request_kv(
            self.case.model, self.seq_len, seed=self.seed, device=ctx.device
        )
        self.reshard_full()
        self.plan = routed_plan(ctx, self.case)

    def reshard_full(self) -> None:
        """The reference shards of :attr:`full` on both sides [RESHARD-1]."""
        case, model = self.case, self.case.model
        self.source_shards = shard(self.full, case.source, model, dp_rank=case.source_dp)
        self.target_shards = shard(self.full, case.target, model, dp_rank=case.target_dp)

    def receivers(self) -> list[int]:
        """The target ranks that hold some of the request (a token of it, on its DP group)."""
        return [
            dst
            for dst in self.case.target.ranks()
            if self.target_shards[dst].data.numel() and self.target_shards[dst].seq_len
        ]

    def shipments_to(self, dst: int, slicing: str) -> list[Shipment]:
        """Reference shipments along the routed plan's edges into ``dst``."""
        return [
            s
            for src in self.plan.sources_of(dst)
            for s in send(self.plan, src, self.source_shards[src], slicing=slicing)
            if s.edge.dst == dst
        ]

    def combine(self, dst: int, shipments: Sequence[Shipment]) -> RequestKV:
        try:
            return self.ctx.adapter.receiver_combine(self.case, dst, list(shipments))
        except Exception as error:
            fail(
                f"{self.case.describe()}: target rank {dst} refused a valid set of "
                f"{len(shipments)} shipment(s) from sources "
                f"{[s.edge.src for s in shipments]}: {error!r} [RESHARD-2.1]",
                tier=BREAKS,
            )

    def received(self, dst: int, shipments: list[Shipment]) -> list[Shipment]:
        """The receiver's slice step on every shipment, when the adapter has one [SLICE-3]."""
        if "marker" not in provided_capabilities(self.ctx.adapter):
            return shipments
        out = []
        for s in shipments:
            try:
                out.append(self.ctx.adapter.apply_marker(self.case, dst, s))
            except Exception as error:
                fail(
                    f"{self.case.describe()}: target rank {dst} refused the marker "
                    f"{s.marker.to_dict()} of the shipment from source {s.edge.src}: "
                    f"{error!r} [SLICE-3.1]",
                    tier=BREAKS,
                )
        return out

    def end_to_end(self, slicing: str) -> dict[int, RequestKV]:
        """The implementation's sender transform then its receiver, every receiver that
        holds some of the request."""
        inbox: dict[int, list[Shipment]] = {t: [] for t in self.case.target.ranks()}
        for src in self.case.source.ranks():
            for dst, kv in self.sender_output(src, slicing).items():
                edge = self.edge(src, dst)
                inbox[dst].append(Shipment(edge, edge_marker(self.plan, edge, slicing), kv))
        return {dst: self.combine(dst, self.received(dst, inbox[dst])) for dst in self.receivers()}

    def expect_end_to_end(self, obligation: str, what: str) -> None:
        """Every receiver's shard, in every slicing mode of the adapter, equals the spec's."""
        for slicing in self.ctx.adapter.slicing_modes:
            for dst, got in self.end_to_end(slicing).items():
                problem = difference(got, self.target_shards[dst])
                expect(
                    problem is None,
                    f"{self.case.describe()}, seq_len {self.seq_len}, {slicing}-side slicing: "
                    f"target rank {dst}: {what} [{obligation}]: {problem}",
                )

    def sender_output(self, src: int, slicing: str) -> dict[int, RequestKV]:
        try:
            out = self.ctx.adapter.sender_transform(
                self.case, src, self.source_shards[src], slicing
            )
        except Exception as error:
            fail(
                f"{self.case.describe()}: source rank {src} ({slicing}-side) raised {error!r} "
                "[SLICE-1.1]",
                tier=BREAKS,
            )
        bad = sorted(d for d in out if d not in self.case.target.ranks())
        expect(
            not bad, f"{self.case.describe()}: source rank {src} sends to ranks {bad} [PLAN-3.1]"
        )
        return out

    def edge(self, src: int, dst: int) -> Edge:
        sender = self.case.owner("source", src)
        receiver = self.case.owner("target", dst)
        try:
            return edge_between(sender, receiver, self.case.model)
        except ValueError as error:
            fail(f"{self.case.describe()}: {error} [PLAN-2.3]")


def routed_plan(ctx: Context, case: TransferCase) -> TransferPlan:
    """The reference plan, with edges along the adapter's routing when it has one."""
    plan = spec_plan(ctx.adapter, case)
    if "routing" not in provided_capabilities(ctx.adapter):
        return plan
    edges = []
    for dst in case.target.ranks():
        receiver = case.owner("target", dst)
        for src in ctx.adapter.sources(case, dst):
            sender = case.owner("source", src)
            try:
                edges.append(edge_between(sender, receiver, case.model))
            except ValueError as error:
                fail(
                    f"{case.describe()}: routing lists source {src} for target {dst}: {error} "
                    "[PLAN-2.3]"
                )
    edges.sort(key=lambda e: (e.src, e.dst))
    return replace(plan, edges=tuple(edges))


def edge_marker(plan: TransferPlan, edge: Edge, slicing: str) -> HeadSlice:
    """The tp_head_slice marker of a shipment on ``edge`` [SLICE-1, SLICE-3, SLICE-4]."""
    return spec_marker(plan, edge, applied=slicing == "sender")


def difference(got: RequestKV, want: RequestKV) -> str | None:
    """None when bit-equal; else where and how ``got`` differs from ``want``."""
    if not isinstance(got, RequestKV):
        return f"got a {type(got).__name__}, not a RequestKV"
    if tuple(got.data.shape) != tuple(want.data.shape) or got.data.dtype != want.data.dtype:
        return (
            f"got {got.data.dtype} {list(got.data.shape)}, expected {want.data.dtype} "
            f"{list(want.data.shape)} ([layers, kv, seq, heads, head_dim])"
        )
    if (got.scales is None) != (want.scales is None):
        return f"scales {'missing' if got.scales is None else 'unexpected'}"
    if got.scales is not None:
        assert want.scales is not None
        if tuple(got.scales.shape) != tuple(want.scales.shape) or not torch.equal(
            raw_bits(got.scales), raw_bits(want.scales.to(got.scales.device))
        ):
            return f"scales {got.scales.tolist()} != expected {want.scales.tolist()}"
    diff = raw_bits(got.data) != raw_bits(want.data.to(got.data.device))
    if not bool(diff.any()):
        return None
    where = [int(i) for i in diff.nonzero()[0].tolist()]
    return (
        f"{int(diff.sum())} of {diff.numel()} elements differ; first at [layer, kv, token, head, "
        f"dim] = {where} (relative to the shard)"
    )


BLOCK_SIZE = 2
"""Block size of the payloads built here: small, so that a request spans several blocks."""


Inbox = list[tuple[int, Payload]]


def inbox(setup: Setup, dst: int, slicing: str = "sender", request_id: str = "req-1") -> Inbox:
    """``(source rank, payload)`` into ``dst`` along the routed plan, each source with block
    ids of its own (source s holds blocks 100*s, 100*s+1, ..., enough for the tokens its
    edge carries)."""
    return [
        (
            s.edge.src,
            payload_from_shipment(
                setup.plan,
                s,
                request_id,
                block_size=BLOCK_SIZE,
                block_ids=[
                    100 * s.edge.src + i for i in range(blocks_needed(s.kv.seq_len, BLOCK_SIZE))
                ],
            ),
        )
        for s in setup.shipments_to(dst, slicing)
    ]
