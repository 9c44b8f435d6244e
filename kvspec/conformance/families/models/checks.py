"""Checks that a model's caches move as the model says on real tensors: an MLA latent, one
tensor and no head axis, arrives intact [MODEL-2].
"""

from __future__ import annotations

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.draws import (
    ROUTING_PINS,
    TENSOR_WEIGHT,
    Setup,
    tensor_examples,
    tensor_pins,
)


@check(
    "MODEL-2",
    "mla-latent",
    "an MLA latent (no V, no head axis) moves intact",
    needs=("sender", "receiver"),
    strategy=lambda adapter: tensor_examples(adapter, attention=("mla",)),
    examples=tensor_pins(*(c for c in ROUTING_PINS if c["model"]["attention"] == "mla")),
    weight=TENSOR_WEIGHT,
    missing=lambda a: None if "mla" in a.domain.attention else "the adapter's domain has no MLA",
    covers=("MODEL-2.1",),
)
def mla_latent(ctx: Context, example: Example) -> None:
    Setup(ctx, example).expect_end_to_end("MODEL-2.1", "the latent must arrive intact")
