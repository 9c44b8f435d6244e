"""The ``tokens`` vectors: the tokens of a request each rank holds under a
context-parallel rule, over the cp axis, DCP, both, and beside attention DP
[CP-1, CP-3, STAGE-2].
"""

from __future__ import annotations

import random

from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import TOKEN_LAYOUTS
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens, as_tokens


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, (layout, model) in enumerate(TOKEN_LAYOUTS):
        for seq_len in sorted({2 * layout.token_shards, rng.randint(1, 40), rng.randint(41, 99)}):
            if seq_len < layout.min_tokens:
                continue
            owners = stage_ownership(layout, model, seq_len=seq_len)
            cases.append(
                {
                    "id": f"tokens-{i:03d}-{seq_len}",
                    "clauses": ["CP-1", "CP-3", "STAGE-2"],
                    "layout": layout.to_dict(),
                    "model": model.to_dict(),
                    "seq_len": seq_len,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "token_shard": layout.token_shard(r.rank),
                            "tokens": (
                                Tokens.span(0, seq_len) if r.tokens is None else r.tokens
                            ).to_list(),
                        }
                        for r in owners
                    ],
                }
            )
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    layout, model = StageLayout.from_dict(case["layout"]), ModelShape.from_dict(case["model"])
    if not adapter.domain.holds_stage(layout, model):
        raise NotApplicable("outside the adapter's declared domain")
    for expected in case["ranks"]:
        got = as_tokens(adapter.owned_tokens(layout, model, expected["rank"], case["seq_len"]))
        if got.to_list() != expected["tokens"]:
            return f"rank {expected['rank']}: tokens {got.to_list()}, expected {expected['tokens']}"
    return None


FAMILY = Family("tokens", ("tokens",), export, check)
