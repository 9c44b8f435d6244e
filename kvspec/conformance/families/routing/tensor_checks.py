"""Checks of what the plan says an edge moves, on real tensors: its bytes [PLAN-5] and a
request's own plan at each length [PLAN-6].

Cases are drawn as the transfer family's tensor checks draw them
(:func:`~kvspec.conformance.draws.tensor_examples`); edges follow the implementation's own
routing when it provides one [PLAN-4].
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import expect
from kvspec.conformance.draws import TENSOR_PINS, TENSOR_WEIGHT, Setup, tensor_examples
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


@check(
    "PLAN-5",
    "edge-bytes",
    "an edge moves heads x layers x seq x head_dim x itemsize x (2 or 1) bytes",
    needs=("sender",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=TENSOR_WEIGHT,
    covers=("PLAN-5.1", "PLAN-5.2"),
)
def edge_bytes(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    for slicing in ctx.adapter.slicing_modes:
        for src in setup.case.source.ranks():
            for dst, kv in setup.sender_output(src, slicing).items():
                edge = setup.edge(src, dst)
                want = edge.nbytes(setup.seq_len, slicing=slicing)
                got = kv.data.numel() * kv.data.element_size()
                expect(
                    got == want,
                    f"{setup.case.describe()}, seq_len {setup.seq_len}, {slicing}-side slicing: "
                    f"edge {src}->{dst} moves {got} bytes of KV; the spec says {want} "
                    f"[PLAN-5.{1 if slicing == 'sender' else 2}]",
                )


@st.composite
def _two_lengths(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A case with token shards and a second request length for the same layouts [PLAN-6]."""
    example = draw(
        tensor_examples(adapter).filter(lambda e: TransferCase.from_dict(e["case"]).sharded)
    )
    return {**example, "other": draw(st.integers(1, 9)) + example["case"]["seq_len"]}


@check(
    "PLAN-6",
    "request-length",
    "the same layouts move requests of two lengths, each by the plan of its length",
    needs=("sender", "receiver"),
    strategy=_two_lengths,
    examples=(
        {
            "case": TransferCase(
                StageLayout(4, cp=2, cp_rule="interleave:2"),
                StageLayout(2),
                ModelShape(2, 2, 2),
                seq_len=5,
            ).to_dict(),
            "seq_len": 5,
            "seed": 0,
            "other": 11,
        },
    ),
    weight=TENSOR_WEIGHT,
    missing=lambda a: None if a.domain.token_shards else "the adapter's domain has no CP",
    covers=("PLAN-6.3",),
)
def request_length(ctx: Context, example: Example) -> None:
    first = example["case"]["seq_len"]
    for n in (first, example["other"], first):
        setup = Setup(ctx, {**example, "case": {**example["case"], "seq_len": n}})
        setup.expect_end_to_end(
            "PLAN-6.3", f"a request of {n} tokens after one of another length (same layouts)"
        )
