"""Checks of connector keys and ports [KEY-1..4, PORT-1..3].

Keys and ports are how two ends find each other without talking; an injectivity bug
there is silent corruption (two requests under one key) or a bind failure.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import suppress

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, fail, within_domain
from kvspec.conformance.checks.routing import ROUTING_PINS, case_examples
from kvspec.keys import legacy_key, rank_aware_key, recv_keys, send_keys
from kvspec.model import ModelShape
from kvspec.ports import port
from kvspec.stage import StageLayout
from kvspec.strategies import TransferCase, request_ids

_FIELDS = ("from_stage", "chunk_id", "from_rank", "to_rank")


def _accepted_rank_aware(ids: st.SearchStrategy[str]) -> st.SearchStrategy[Example]:
    def valid(args: Example) -> bool:
        try:
            rank_aware_key(**args)
        except ValueError:
            return False
        return True

    return st.fixed_dictionaries(
        {"request_id": ids, **{f: st.integers(0, 40) for f in _FIELDS}}
    ).filter(valid)


@check(
    "KEY-1",
    "rank-aware-format",
    "{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}",
    needs=("keys",),
    strategy=lambda adapter: _accepted_rank_aware(request_ids()),
    examples=(
        {"request_id": "req_7", "from_stage": 0, "chunk_id": 0, "from_rank": 2, "to_rank": 1},
    ),
)
def rank_aware_format(ctx: Context, example: Example) -> None:
    got = ctx.adapter.rank_aware_key(**example)
    want = rank_aware_key(**example)
    expect(got == want, f"key of {example} is {got!r}; the spec's is {want!r} [KEY-1]")


@check(
    "KEY-2",
    "legacy-format",
    "omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}",
    needs=("keys",),
    strategy=lambda adapter: st.fixed_dictionaries(
        {
            "request_id": request_ids(),
            "from_stage": st.integers(0, 9),
            "to_stage": st.integers(0, 9),
        }
    ),
    examples=({"request_id": "5_0_0_0_0", "from_stage": 0, "to_stage": 1},),
)
def legacy_format(ctx: Context, example: Example) -> None:
    got = ctx.adapter.legacy_key(**example)
    want = legacy_key(**example)
    expect(got == want, f"legacy key of {example} is {got!r}; the spec's is {want!r} [KEY-2]")


@st.composite
def _colliding_inputs(draw: st.DrawFn) -> Example:
    """Two different field tuples that would join to one string with '_'."""
    head = draw(st.sampled_from(["a", "req", "omni_0_to_1_kv_cache", "x_1"]))
    numbers = [draw(st.integers(0, 9)) for _ in range(5)]
    first = {
        "request_id": f"{head}_{numbers[0]}",
        "from_stage": numbers[1],
        "chunk_id": numbers[2],
        "from_rank": numbers[3],
        "to_rank": numbers[4],
    }
    second = {
        "request_id": head,
        "from_stage": f"{numbers[0]}_{numbers[1]}",
        "chunk_id": numbers[2],
        "from_rank": numbers[3],
        "to_rank": numbers[4],
    }
    legacy = {
        "request_id": f"{numbers[1]}_{numbers[2]}_{numbers[3]}_{numbers[4]}",
        "from_stage": 0,
        "to_stage": 1,
    }
    return {"first": first, "second": second, "legacy": legacy}


@check(
    "KEY-3",
    "injective",
    "distinct inputs never share a key; inputs outside the domain are refused",
    needs=("keys",),
    strategy=lambda adapter: _colliding_inputs(),
    examples=(
        {
            "first": {
                "request_id": "omni_0_to_1_kv_cache_5",
                "from_stage": 0,
                "chunk_id": 0,
                "from_rank": 0,
                "to_rank": 0,
            },
            "second": {
                "request_id": "a",
                "from_stage": "0_0",
                "chunk_id": 0,
                "from_rank": 0,
                "to_rank": 0,
            },
            "legacy": {"request_id": "5_0_0_0_0", "from_stage": 0, "to_stage": 1},
        },
    ),
)
def injective(ctx: Context, example: Example) -> None:
    made: dict[str, list[str]] = defaultdict(list)
    for label in ("first", "second"):
        with suppress(Exception):  # refusing is always allowed
            key = ctx.adapter.rank_aware_key(**example[label])
            made[key].append(f"rank-aware {example[label]}")
    with suppress(Exception):
        made[ctx.adapter.legacy_key(**example["legacy"])].append(f"legacy {example['legacy']}")
    clashes = {k: v for k, v in made.items() if len(v) > 1}
    expect(
        not clashes,
        "different inputs give the same key: "
        + "; ".join(f"{k!r} <- {' and '.join(v)}" for k, v in clashes.items())
        + " — one of them must be refused [KEY-3]",
    )


@check(
    "KEY-4",
    "send-equals-recv",
    "the keys s sends t are the keys t expects from s",
    needs=("edge-keys",),
    strategy=lambda adapter: case_examples(adapter),
    # TP1 -> TP1 is the legacy key's case: both ends must agree on it [KEY-2].
    examples=(
        *ROUTING_PINS,
        TransferCase(StageLayout(1), StageLayout(1), ModelShape(2, 2, 2)).to_dict(),
    ),
)
def send_equals_recv(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    sent = {
        (src, dst, key)
        for src in case.source.ranks()
        for key, dst in ctx.adapter.send_keys(case, "req-1", src, from_stage=0, to_stage=1)
    }
    expected = {
        (src, dst, key)
        for dst in case.target.ranks()
        for key, src in ctx.adapter.recv_keys(case, "req-1", dst, from_stage=0, to_stage=1)
    }
    expect(
        sent == expected,
        f"{case.describe()}: keys sent but not expected {sorted(sent - expected)[:3]}; expected "
        f"but never sent {sorted(expected - sent)[:3]} [KEY-4]",
    )
    keys = [k for _, _, k in sent]
    expect(len(keys) == len(set(keys)), f"{case.describe()}: two edges share a key [KEY-4]")
    plan = case.plan()
    want = {(e.src, e.dst) for e in plan.edges}
    if {(s, d) for s, d, _ in sent} != want and ctx.adapter.policies:
        fail(
            f"{case.describe()}: keys name edges {sorted({(s, d) for s, d, _ in sent})}, the plan "
            f"has {sorted(want)} [KEY-4]"
        )
    reference = {
        k
        for src in case.source.ranks()
        for k, _ in send_keys(plan, "req-1", src, from_stage=0, to_stage=1)
    }
    reference |= {
        k
        for dst in case.target.ranks()
        for k, _ in recv_keys(plan, "req-1", dst, from_stage=0, to_stage=1)
    }
    foreign = sorted(set(keys) - reference)
    expect(
        not foreign or not ctx.adapter.policies,
        f"{case.describe()}: keys {foreign[:3]} are not the spec's keys for this plan "
        "[KEY-1, KEY-2]",
    )


def _port_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    return st.fixed_dictionaries(
        {
            "base": st.integers(1, 60000),
            "stage": st.integers(0, 20),
            "rank": st.integers(0, 80),
            "replica": st.integers(0, 70),
        }
    )


@check(
    "PORT-1",
    "formula",
    "kv port = base + 100 + replica*1024 + rank*16 + stage where valid",
    needs=("ports",),
    strategy=_port_examples,
    examples=({"base": 50000, "stage": 1, "rank": 3, "replica": 1},),
)
def formula(ctx: Context, example: Example) -> None:
    try:
        want = port("kv", **example)
    except ValueError:
        return  # outside the domain: PORT-2 checks the refusal
    got = ctx.adapter.kv_port(**example)
    expect(got == want, f"KV port of {example} is {got}; the spec's is {want} [PORT-1]")


@check(
    "PORT-2",
    "refuses-outside-domain",
    "arguments that could collide, or ports outside 1..65535, are refused",
    needs=("ports",),
    strategy=_port_examples,
    examples=(
        {
            "base": 50000,
            "stage": 16,
            "rank": 0,
            "replica": 0,
        },  # stage 16 of rank 0 = stage 0 of rank 1
        {"base": 50000, "stage": 0, "rank": 64, "replica": 0},  # rank 64 = replica 1's rank 0
        {"base": 65000, "stage": 0, "rank": 40, "replica": 0},  # past 65535
    ),
)
def refuses_outside_domain(ctx: Context, example: Example) -> None:
    try:
        port("kv", **example)
        return  # inside the domain
    except ValueError as why:
        reason = str(why)
    try:
        got = ctx.adapter.kv_port(**example)
    except Exception:
        return
    fail(f"KV port of {example} was given as {got}; the spec refuses it: {reason}")


@st.composite
def _deployment_examples(draw: st.DrawFn) -> Example:
    stages = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3))
    return {
        "base": draw(st.integers(1024, 40000)),
        "tp": stages,
        "replicas": draw(st.integers(1, 3)),
    }


@check(
    "PORT-3",
    "deployment-distinct",
    "every KV endpoint of a deployment gets its own port",
    needs=("ports",),
    strategy=lambda adapter: _deployment_examples(),
    examples=({"base": 30000, "tp": [2, 1], "replicas": 2},),
)
def deployment_distinct(ctx: Context, example: Example) -> None:
    owners: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for stage, tp in enumerate(example["tp"]):
        for replica in range(example["replicas"]):
            for rank in range(tp):
                try:
                    number = ctx.adapter.kv_port(example["base"], stage, rank, replica)
                except Exception:
                    continue  # a refusal is allowed; PORT-1 checks it is not wrong
                owners[number].append((stage, replica, rank))
    clashes = {p: o for p, o in owners.items() if len(o) > 1}
    expect(
        not clashes,
        f"deployment {example}: (stage, replica, rank) endpoints share ports: "
        + "; ".join(f"{p}: {o}" for p, o in sorted(clashes.items())[:3])
        + " [PORT-3]",
    )
