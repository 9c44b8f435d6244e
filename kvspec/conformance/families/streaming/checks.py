"""Checks of layer-wise streaming [STREAM-1].

The layer groups are compared with the spec's for every model depth and group count;
the key of every group is compared with the rank-aware key of its chunk id; and a
receiver's group, placed from its sources' parts arriving out of source order, must
equal that group's layers of the shard merged from the whole payloads.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, vacuous
from kvspec.conformance.checks.expectations import fail
from kvspec.conformance.draws import TENSOR_PINS, Setup, inbox, tensor_examples
from kvspec.conformance.tiers import BREAKS
from kvspec.tensors.kv import RequestKV, kv_equal
from kvspec.transport.payload import merge_to_request_kv
from kvspec.transport.streaming import group_layers, layer_groups, layer_part, stream_key


def _group_counts(adapter: Adapter) -> st.SearchStrategy[Example]:
    return st.integers(1, 96).flatmap(
        lambda layers: st.fixed_dictionaries(
            {"layers": st.just(layers), "groups": st.integers(1, layers)}
        )
    )


@check(
    "STREAM-1",
    "layer-groups",
    "layers cut into G contiguous groups in order, sizes within one, the larger first",
    needs=("streaming",),
    strategy=_group_counts,
    examples=({"layers": 7, "groups": 3}, {"layers": 61, "groups": 4}, {"layers": 5, "groups": 5}),
    covers=("STREAM-1.1",),
)
def groups_match(ctx: Context, example: Example) -> None:
    layers, groups = example["layers"], example["groups"]
    got = [(r.start, r.stop) for r in ctx.adapter.layer_groups(layers, groups)]
    want = [(r.start, r.stop) for r in layer_groups(layers, groups)]
    if got != want:
        fail(
            f"{layers} layers in {groups} groups gave [start, stop) {got}, not {want}: "
            "contiguous, in order, sizes within one, the larger first [STREAM-1.1]"
        )


def _key_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    return st.integers(1, 40).flatmap(
        lambda groups: st.fixed_dictionaries(
            {
                "request_id": st.sampled_from(["req-1", "r_2", "a_0_1"]),
                "from_stage": st.integers(0, 3),
                "chunk_id": st.integers(0, 6),
                "group": st.integers(0, groups - 1),
                "groups": st.just(groups),
                "from_rank": st.integers(0, 8),
                "to_rank": st.integers(0, 8),
            }
        )
    )


_KEY_ORDER = ("request_id", "from_stage", "chunk_id", "group", "groups", "from_rank", "to_rank")


@check(
    "STREAM-1",
    "group-keys",
    "group g of chunk c goes under the rank-aware key of chunk id c*G + g",
    needs=("streaming",),
    strategy=_key_examples,
    examples=(
        {
            "request_id": "req-1",
            "from_stage": 0,
            "chunk_id": 1,
            "group": 0,
            "groups": 2,
            "from_rank": 0,
            "to_rank": 0,
        },
        {
            "request_id": "r_2",
            "from_stage": 1,
            "chunk_id": 0,
            "group": 3,
            "groups": 4,
            "from_rank": 2,
            "to_rank": 1,
        },
    ),
    covers=("STREAM-1.2",),
)
def keys_match(ctx: Context, example: Example) -> None:
    args = [example[name] for name in _KEY_ORDER]
    got = ctx.adapter.stream_key(*args)
    want = stream_key(*args)
    if got != want:
        shown = ", ".join(f"{name}={example[name]!r}" for name in _KEY_ORDER)
        fail(f"the key of {shown} is {got!r}, not {want!r} [STREAM-1.2]")


def _merge_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    return st.fixed_dictionaries(
        {
            "tensors": tensor_examples(adapter),
            "groups": st.integers(1, 4),
            "group": st.integers(0, 3),
        }
    )


@check(
    "STREAM-1",
    "place-group",
    "a group placed from its parts, out of source order, equals its layers of the merged shard",
    needs=("streaming",),
    strategy=_merge_examples,
    examples=tuple({"tensors": pin, "groups": 2, "group": 1} for pin in TENSOR_PINS[:4]),
    weight=0.5,
    covers=("STREAM-1.3",),
)
def group_placed(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example["tensors"])
    model = setup.case.model
    groups = min(example["groups"], model.num_layers)
    group = layer_groups(model.num_layers, groups)[example["group"] % groups]
    rng = random.Random(setup.seed)
    for dst in setup.receivers():
        owner = setup.plan.owner("target", dst)
        mine = group_layers(owner.layers, group)
        if not len(mine):
            continue
        whole = inbox(setup, dst)
        parts = [(src, part) for src, p in whole if (part := layer_part(p, group)) is not None]
        arrived = rng.sample(parts, len(parts))
        if len(parts) > 1 and [s for s, _ in arrived] == [s for s, _ in parts]:
            arrived = parts[::-1]
        start = mine.start - owner.layers.start
        want = merge_to_request_kv(setup.plan, dst, whole).layer_slice(start, start + len(mine))
        where = (
            f"{setup.case.describe()}: target rank {dst}, layers {mine.start}..{mine.stop - 1} "
            f"(group {group.start}..{group.stop - 1}) from sources {[s for s, _ in arrived]} "
            "in that arrival order"
        )
        try:
            got = ctx.adapter.merge_layers(setup.case, dst, group, arrived)
        except Exception as error:
            fail(f"{where}: refused: {error!r} [STREAM-1.3]", tier=BREAKS)
        if not isinstance(got, RequestKV) or not kv_equal(got, want):
            fail(f"{where}: placed KV differs from those layers of the merged shard [STREAM-1.3]")
        return
    vacuous()
