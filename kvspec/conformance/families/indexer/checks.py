"""Checks of an MLA group's sparse indexer cache [INDEX-1].

Models are drawn as small MLA models whose own latent, and a draft MLA group beside it,
may keep an indexer of 128 or 256 values per token; the expected bytes are the spec's
group plan (:func:`kvspec.topology.group_plan.plan_groups`), under the adapter's replica rule.
"""

from __future__ import annotations

import copy
from typing import Any, cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, vacuous
from kvspec.conformance.checks.expectations import changed_values, expect, expect_refused
from kvspec.conformance.draws import spec_rule
from kvspec.conformance.transfer_config import handed
from kvspec.testing.strategies import TP_SIZES
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import FullAttention
from kvspec.topology.indexer import index_entry_bytes
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


def _tp_sizes(adapter: Adapter) -> list[int]:
    pairs = {t for pair in adapter.domain.pairs() for t in pair} & set(TP_SIZES) & {1, 2, 4}
    return sorted(pairs) or [1]


@st.composite
def _indexed_model(draw: st.DrawFn) -> dict[str, Any]:
    """A small MLA model with an indexer on its own latent, a draft MLA group, or both."""
    index = st.sampled_from([None, 128, 256])
    own, draft = draw(index), draw(index)
    if own is None and draft is None:
        own = 128
    num_layers = draw(st.integers(2, 6))
    layers = [0, 1] + [draw(st.integers(0, 1)) for _ in range(num_layers - 2)]
    model: dict[str, Any] = {
        "num_layers": num_layers,
        "num_kv_heads": 1,
        "head_dim": draw(st.integers(1, 8)),
        "attention": "mla",
        "dtype": draw(st.sampled_from(["bfloat16", "float32", "float16"])),
        "scale_format": None,
        "groups": [
            {
                "kind": "draft",
                "num_kv_heads": 1,
                "head_dim": draw(st.integers(1, 8)),
                "attention": "mla",
                **({"index_head_dim": draft} if draft else {}),
            }
        ],
        "layers": list(draw(st.permutations(layers))),
    }
    if own:
        model["index_head_dim"] = own
    return model


@st.composite
def _cases(draw: st.DrawFn, adapter: Adapter, *, split: bool = False) -> Example:
    tps = _tp_sizes(adapter)
    targets = [t for t in tps if t > 1] if split else tps
    if not targets:
        targets = tps
    model = draw(_indexed_model())
    pp = [p for p in adapter.domain.pp_sizes if p <= model["num_layers"]] or [1]
    source = StageLayout(draw(st.sampled_from(tps)), draw(st.sampled_from(pp)))
    target = StageLayout(draw(st.sampled_from(targets)), draw(st.sampled_from(pp)))
    policy = draw(st.sampled_from(adapter.drawn_policies))
    return {
        "case": TransferCase(source, target, ModelShape.from_dict(model), policy).to_dict(),
        "seq_len": draw(st.integers(0, 40)),
        "block_size": draw(st.sampled_from([1, 4, 16])),
    }


def _compare(ctx: Context, example: Example, obligation: str) -> None:
    case = TransferCase.from_dict(example["case"])
    if case.policy not in ctx.adapter.drawn_policies:
        raise OutsideDomain
    seq_len, block = example["seq_len"], example["block_size"]
    plan = case.group_plan(seq_len, spec_rule(ctx.adapter, case), block_size=block)
    want = plan.bytes_per_edge()
    got = dict(ctx.adapter.group_bytes(case, seq_len, block))
    for edge in plan.edges:
        key = (edge.group, edge.src, edge.dst)
        # An indexed model's groups are attention groups (_indexed_model).
        group = cast(FullAttention, case.model.layer_groups[edge.group])
        if not group.index_head_dim:
            continue
        tokens = seq_len if edge.tokens is None else len(edge.tokens)
        entry = index_entry_bytes(group.index_head_dim)
        expect(
            got.get(key, 0) == want[key],
            f"{case.source.describe()} -> {case.target.describe()}, {seq_len} tokens: group "
            f"{edge.group} {group.describe()}, edge {edge.src} -> {edge.dst} ({len(edge.layers)} "
            f"layers x {tokens} tokens) moves {want[key]} bytes: its latent's and "
            f"{len(edge.layers)} x {tokens} x {entry} of indexer [{obligation}]; the "
            f"implementation says {got.get(key, 0)}",
        )
    if not plan.edges:
        vacuous()


@check(
    "INDEX-1",
    "indexer-bytes",
    "an edge of an MLA group with an indexer moves its latent's bytes and l x T x "
    "(index_head_dim + 4 x index_head_dim / 128) of indexer",
    needs=("group-bytes",),
    strategy=_cases,
    examples=(
        {
            "case": TransferCase(
                StageLayout(1), StageLayout(1), ModelShape(3, 1, 8, "mla", index_head_dim=128)
            ).to_dict(),
            "seq_len": 5,
            "block_size": 16,
        },
    ),
    covers=("INDEX-1.1",),
)
def _indexer_bytes(ctx: Context, example: Example) -> None:
    _compare(ctx, example, "INDEX-1.1")


@check(
    "INDEX-1",
    "indexer-whole",
    "every receiver rank of a wider target gets each token's whole indexer entry, not a TP share",
    needs=("group-bytes",),
    strategy=lambda adapter: _cases(adapter, split=True),
    examples=(
        {
            "case": TransferCase(
                StageLayout(1), StageLayout(4), ModelShape(2, 1, 4, "mla", index_head_dim=128)
            ).to_dict(),
            "seq_len": 7,
            "block_size": 4,
        },
    ),
    covers=("INDEX-1.2",),
)
def _indexer_whole(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example["case"])
    if case.target.attn_tp == 1:
        vacuous()
    if case.target.attn_tp not in _tp_sizes(ctx.adapter):
        raise OutsideDomain
    _compare(ctx, example, "INDEX-1.2")


_BREAKS = {
    "mha": "an indexer on a group that is not MLA",
    "width": "an index_head_dim that is not a positive multiple of 128",
}


@st.composite
def _broken(draw: st.DrawFn, adapter: Adapter) -> Example:
    model = draw(_indexed_model())
    bad = copy.deepcopy(model)
    how = draw(st.sampled_from(sorted(_BREAKS)))
    if how == "mha":
        heads = draw(st.sampled_from([2, 4]))
        bad["groups"].append(
            {"kind": "full", "num_kv_heads": heads, "head_dim": 4, "index_head_dim": 128}
        )
    else:
        width = draw(st.sampled_from([64, 100, 192, 0, -128]))
        bad["groups"].append(
            {
                "kind": "draft",
                "num_kv_heads": 1,
                "head_dim": 4,
                "attention": "mla",
                "index_head_dim": width,
            }
        )
    bad["layers"].append(len(bad["groups"]))
    bad["num_layers"] += 1
    source, target = StageLayout(1).to_dict(), StageLayout(2).to_dict()
    return {
        "how": how,
        "good": {"source": source, "target": target, "model": model, "seq_len": 8},
        "bad": {"source": source, "target": target, "model": bad, "seq_len": 8},
    }


@check(
    "INDEX-1",
    "refuses-index1",
    "an indexer on a group that is not MLA, or an index_head_dim that is not a positive "
    "multiple of 128: each refused, the valid model accepted",
    needs=("models",),
    strategy=_broken,
    covers=("INDEX-1.3",),
)
def _refuses(ctx: Context, example: Example) -> None:
    if 2 not in _tp_sizes(ctx.adapter):
        raise OutsideDomain
    handed(example["good"])
    handed(example["bad"])
    ctx.adapter.validate_model(example["good"])
    expect_refused(
        "INDEX-1.3",
        f"{_BREAKS[example['how']]} ({example['bad']['model']['groups'][-1]})",
        lambda: ctx.adapter.validate_model(example["bad"]),
        naming=changed_values(example["good"], example["bad"]),
        accepted=example["bad"],
    )
