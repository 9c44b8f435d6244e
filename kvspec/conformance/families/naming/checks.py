"""Checks of connector keys and ports [KEY-1..4, PORT-1..3].

Keys and ports are how two ends find each other without talking; an injectivity bug
there is silent corruption (two requests under one key) or a bind failure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, within_domain
from kvspec.conformance.checks.expectations import (
    REFUSED,
    expect,
    expect_refused,
    fail,
    unless_refused,
)
from kvspec.conformance.draws import ROUTING_PINS, case_examples, policy_in_domain, spec_plan
from kvspec.naming.keys import legacy_key, rank_aware_key, recv_keys, send_keys
from kvspec.naming.ports import PortScheme, port, port_coords, rank_port
from kvspec.testing.strategies import request_ids
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

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
        {"request_id": "r", "from_stage": 3, "chunk_id": 12, "from_rank": 0, "to_rank": 10},
    ),
    covers=("KEY-1.1", "KEY-1.2"),
)
def rank_aware_format(ctx: Context, example: Example) -> None:
    got = ctx.adapter.rank_aware_key(**example)
    want = rank_aware_key(**example)
    digits = [str(example[f]) for f in _FIELDS]
    canonical = isinstance(got, str) and got.endswith("_" + "_".join(digits))
    expect(
        got == want,
        f"key of {example} is {got!r}; the spec's is {want!r} "
        f"[{'KEY-1.1' if canonical else 'KEY-1.2'}: integers in canonical decimal, "
        "fields in the order request_id, from_stage, chunk_id, from_rank, to_rank]",
    )


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
    covers=("KEY-2.1",),
)
def legacy_format(ctx: Context, example: Example) -> None:
    got = ctx.adapter.legacy_key(**example)
    want = legacy_key(**example)
    expect(got == want, f"legacy key of {example} is {got!r}; the spec's is {want!r} [KEY-2.1]")


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
    if draw(st.booleans()):  # two long ids of the domain that differ only at their end
        prefix = "r" * draw(st.sampled_from([64, 100, 128, 250, 256, 300]))
        first = {**first, "request_id": prefix + "a", "from_stage": numbers[1]}
        second = {**first, "request_id": prefix + "b"}
        legacy = {**legacy, "request_id": prefix + "c"}
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
        {
            "first": {
                "request_id": "x" * 200 + "1",
                "from_stage": 0,
                "chunk_id": 0,
                "from_rank": 0,
                "to_rank": 0,
            },
            "second": {
                "request_id": "x" * 200 + "2",
                "from_stage": 0,
                "chunk_id": 0,
                "from_rank": 0,
                "to_rank": 0,
            },
            "legacy": {"request_id": "x" * 200 + "3", "from_stage": 0, "to_stage": 1},
        },
    ),
    covers=("KEY-3.3", "KEY-3.4"),
)
def injective(ctx: Context, example: Example) -> None:
    made: dict[object, list[str]] = defaultdict(list)
    for label in ("first", "second"):  # refusing is always allowed; crashing is not (breaks)
        key = unless_refused(
            lambda: ctx.adapter.rank_aware_key(**example[label]),  # noqa: B023 (called at once)
            obligation="KEY-3.3",
            what=f"the rank-aware key of {example[label]}",
        )
        made[key].append(f"rank-aware {example[label]}")
    legacy = unless_refused(
        lambda: ctx.adapter.legacy_key(**example["legacy"]),
        obligation="KEY-3.4",
        what=f"the legacy key of {example['legacy']}",
    )
    made[legacy].append(f"legacy {example['legacy']}")
    made.pop(REFUSED, None)
    clashes = {k: v for k, v in made.items() if len(v) > 1}
    legacy_head = any("omni_" in str(example[lab]["request_id"]) for lab in ("first", "second"))
    expect(
        not clashes,
        "different inputs give the same key: "
        + "; ".join(f"{str(k)[:80]!r} <- {' and '.join(v)[:300]}" for k, v in clashes.items())
        + (
            " — a rank-aware request id beginning with a legacy key's head must be refused "
            "[KEY-3.3]"
            if legacy_head
            else " — distinct inputs of the domain give distinct keys [KEY-3.4]"
        ),
    )


_BAD_REQUEST_IDS: tuple[object, ...] = ("", "a\nb", "req\x00", "tab\there", 5, None)
_BAD_NUMBERS: tuple[object, ...] = (-1, True, 1.0, "0_5", "1", None, -10)


def _outside_key_domain(args: Example) -> list[tuple[str, str, str, Example]]:
    """Valid rank-aware and legacy key fields with one field outside the domain, for every
    field and every bad value: (obligation, kind, field, arguments) [KEY-3]."""
    found = []
    for kind, fields in (("rank_aware", _FIELDS), ("legacy", ("from_stage", "to_stage"))):
        base = {"request_id": args["request_id"], **{f: args[f] for f in fields}}
        for bad in _BAD_REQUEST_IDS:
            found.append(("KEY-3.1", kind, "request_id", {**base, "request_id": bad}))
        for field in fields:
            for bad in _BAD_NUMBERS:
                found.append(("KEY-3.2", kind, field, {**base, field: bad}))
    return found


@check(
    "KEY-3",
    "refuses-outside-domain",
    "empty or unprintable request ids and fields that are not integers >= 0 are refused",
    needs=("keys",),
    strategy=lambda adapter: st.fixed_dictionaries(
        {
            "request_id": st.sampled_from(["req-1", "a_b", "chatcmpl-7f3a", "5"]),
            **{f: st.integers(0, 12) for f in (*_FIELDS, "to_stage")},
        }
    ),
    covers=("KEY-3.1", "KEY-3.2"),
)
def refuses_outside_key_domain(ctx: Context, example: Example) -> None:
    for obligation, kind, field, args in _outside_key_domain(example):
        make = ctx.adapter.rank_aware_key if kind == "rank_aware" else ctx.adapter.legacy_key

        def key(make: Callable[..., str] = make, args: Example = args) -> str:
            return make(**args)

        expect_refused(
            obligation,
            f"a {kind} key with {field}={args[field]!r} ({args})",
            key,
            naming=(args[field],),
            accepted={"kind": kind, **args},
        )


@check(
    "KEY-4",
    "send-equals-recv",
    "the keys s sends t are the keys t expects from s",
    needs=("edge-keys",),
    strategy=lambda adapter: case_examples(adapter),
    # TP1 -> TP1 is the legacy key's case: both ends must agree on it [KEY-2]; a TP1 stage
    # with PP has several ranks, so it is not [KEY-2.2].
    examples=(
        *ROUTING_PINS,
        TransferCase(StageLayout(1), StageLayout(1), ModelShape(2, 2, 2)).to_dict(),
        TransferCase(StageLayout(1, 2), StageLayout(1), ModelShape(2, 2, 2)).to_dict(),
        TransferCase(StageLayout(1), StageLayout(1, 2), ModelShape(4, 2, 2)).to_dict(),
    ),
    covers=("KEY-4.1", "KEY-4.2", "KEY-2.2", "DP-1.2"),
)
def send_equals_recv(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    policy_in_domain(ctx, case)
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
        f"but never sent {sorted(expected - sent)[:3]} [KEY-4.1]",
    )
    keys = [k for _, _, k in sent]
    shared = sorted({k for k in keys if keys.count(k) > 1})
    expect(
        not shared,
        f"{case.describe()}: edges share the key(s) {shared[:3]}; all keys of one chunk of one "
        "request are distinct [KEY-4.2]",
    )
    plan = spec_plan(ctx.adapter, case)
    want = {(e.src, e.dst) for e in plan.edges}
    if {(s, d) for s, d, _ in sent} != want and ctx.adapter.policies:
        fail(
            f"{case.describe()}: keys name edges {sorted({(s, d) for s, d, _ in sent})}, the plan "
            f"has {sorted(want)} [KEY-4.1]"
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
    single = case.source.world_size == 1 and case.target.world_size == 1
    if case.source.dp > 1 or case.target.dp > 1:
        why = (
            f"(a request on DP ranks {case.source_dp} -> {case.target_dp} is named by the "
            "stage-local ranks of those groups, not ranks within a group) [DP-1.2, KEY-1.1]"
        )
    elif single:
        why = "[KEY-2.1]"
    else:
        why = "(only two single-rank stages use the legacy key) [KEY-2.2, KEY-1.1]"
    expect(
        not foreign or not ctx.adapter.policies,
        f"{case.describe()}: keys {foreign[:3]} are not the spec's keys for this plan {why}; "
        f"the spec's are {sorted(reference)[:3]}",
    )


def _port_examples(adapter: Adapter) -> st.SearchStrategy[Example]:
    return st.fixed_dictionaries(
        {
            "base": st.integers(1, 60000),
            "stage": st.integers(0, 15),
            "rank": st.integers(0, 63),
            "replica": st.integers(0, 40),
        }
    ).filter(_valid_port)


def _valid_port(args: Example) -> bool:
    try:
        port("kv", **args)
    except ValueError:
        return False
    return True


@check(
    "PORT-1",
    "formula",
    "kv port = base + 100 + replica*1024 + rank*16 + stage where valid",
    needs=("ports",),
    strategy=_port_examples,
    examples=(
        {"base": 50000, "stage": 1, "rank": 3, "replica": 1},
        {"base": 20000, "stage": 15, "rank": 63, "replica": 2},
    ),
    covers=("PORT-1.1",),
)
def formula(ctx: Context, example: Example) -> None:
    want = port("kv", **example)
    got = ctx.adapter.kv_port(**example)
    expect(got == want, f"KV port of {example} is {got}; the spec's is {want} [PORT-1.1]")


@st.composite
def _dp_port_examples(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A rank of a stage with attention-DP groups, under a scheme with or without a
    dp_stride, whose port lies in the domain [PORT-1, STAGE-2]."""
    dp = draw(st.sampled_from([d for d in adapter.domain.dp_sizes if d > 1] or [2]))
    tp = dp * draw(st.sampled_from([1, 2, 4]))
    layout = StageLayout(tp, draw(st.integers(1, 2)), dp=dp)
    scheme = draw(st.sampled_from([PortScheme(), PortScheme(dp_stride=4096)]))
    example = {
        "base": draw(st.integers(1, 20000)),
        "stage": draw(st.integers(0, 15)),
        "layout": layout.to_dict(),
        "rank": draw(st.integers(0, layout.world_size - 1)),
        "replica": draw(st.integers(0, 2)),
        "dp_stride": scheme.dp_stride,
    }
    return example


@check(
    "PORT-1",
    "dp-term",
    "a rank of an attention-DP stage binds its group's term with a dp_stride",
    needs=("dp-ports",),
    strategy=_dp_port_examples,
    examples=(
        {
            "base": 20000,
            "stage": 1,
            "layout": StageLayout(8, dp=2).to_dict(),
            "rank": 5,
            "replica": 0,
            "dp_stride": 4096,
        },
    ),
    missing=lambda a: None if max(a.domain.dp_sizes) > 1 else "the domain has no attention DP",
    covers=("PORT-1.2",),
)
def dp_term(ctx: Context, example: Example) -> None:
    layout = StageLayout.from_dict(example["layout"])
    scheme = PortScheme(dp_stride=example["dp_stride"])
    args = {k: example[k] for k in ("base", "stage", "rank", "replica")}
    want = rank_port("kv", layout=layout, scheme=scheme, **args)
    got = ctx.adapter.stage_port(layout=layout, scheme=scheme, **args)
    dp_rank, local = port_coords(layout, example["rank"], scheme)
    how = (
        f"dp_rank {dp_rank} and rank {local} within its group"
        if scheme.dp_stride
        else f"its stage-local rank {example['rank']}"
    )
    expect(
        got == want,
        f"{layout.describe()}, {scheme.describe()}: rank {example['rank']} "
        f"({', '.join(f'{k} {v}' for k, v in args.items() if k != 'rank')}) binds {want}, by "
        f"{how} [PORT-1.2]; the implementation says {got}",
    )


def _past_dp_span(example: Example) -> list[tuple[str, Example, PortScheme, tuple[object, ...]]]:
    """The example's rank with a replica whose ports run into the next DP rank's: under a
    dp_stride of 2048 and of 4096, replica dp_stride // 1024, whose span is at least the
    stride [PORT-2.6]."""
    layout = StageLayout.from_dict(example["layout"])
    found = []
    for stride in (2048, 4096):
        replica = stride // 1024
        args = {**example, "replica": replica, "dp_stride": stride}
        what = f"replica {replica}: replica*1024 + rank*16 + stage >= dp_stride {stride}"
        found.append((what, args, PortScheme(dp_stride=stride), (replica, stride)))
    return [f for f in found if layout.dp > 1]


@check(
    "PORT-2",
    "refuses-dp-span",
    "a replica whose ports run into the next DP rank's: refused",
    needs=("dp-ports",),
    strategy=_dp_port_examples,
    examples=(
        {
            "base": 20000,
            "stage": 0,
            "layout": StageLayout(4, dp=2).to_dict(),
            "rank": 0,
            "replica": 0,
            "dp_stride": 4096,
        },
    ),
    missing=lambda a: None if max(a.domain.dp_sizes) > 1 else "the domain has no attention DP",
    covers=("PORT-2.6",),
)
def refuses_dp_span(ctx: Context, example: Example) -> None:
    layout = StageLayout.from_dict(example["layout"])
    for what, args, scheme, offending in _past_dp_span(example):
        call = {k: args[k] for k in ("base", "stage", "rank", "replica")}

        def stage_port(call: Example = call, scheme: PortScheme = scheme) -> int:
            return ctx.adapter.stage_port(layout=layout, scheme=scheme, **call)

        expect_refused(
            "PORT-2.6",
            f"the KV port of rank {call['rank']} of {layout.describe()} under "
            f"{scheme.describe()} ({what})",
            stage_port,
            naming=offending,
            accepted=call,
        )


def _outside_port_domain(args: Example) -> list[tuple[str, str, Example, tuple[object, ...]]]:
    """Valid port arguments with one step outside the domain of [PORT-2], of every kind:
    (obligation, what, arguments, the offending values a refusal names)."""
    found: list[tuple[str, str, Example, tuple[object, ...]]] = []
    stage = {**args, "stage": 16 + args["stage"] % 4, "rank": min(args["rank"], 62)}
    found.append(
        ("PORT-2.1", f"stage {stage['stage']} >= rank_stride 16", stage, (stage["stage"],))
    )
    rank = {**args, "rank": 64 + args["rank"] % 4}
    found.append(
        ("PORT-2.2", f"rank {rank['rank']}: rank*16 + stage >= 1024", rank, (rank["rank"],))
    )
    high = 65536 - 100 - args["replica"] * 1024 - args["rank"] * 16 - args["stage"]
    over = {**args, "base": high + args["base"] % 16}
    port = 65536 + args["base"] % 16  # the KV purpose's offset of 100 included
    found.append(("PORT-2.3", f"port {port}, past 65535", over, (port, over["base"])))
    for field in ("base", "stage", "rank", "replica"):
        found.append(("PORT-2.4", f"{field} -1", {**args, field: -1}, (-1,)))
        for bad in (float(args[field]), str(args[field]), None):
            found.append(("PORT-2.5", f"{field} {bad!r}", {**args, field: bad}, (bad,)))
    return found


@check(
    "PORT-2",
    "refuses-outside-domain",
    "arguments that could collide, negative or non-integer ones, ports past 65535: refused",
    needs=("ports",),
    strategy=_port_examples,
    examples=({"base": 50000, "stage": 0, "rank": 0, "replica": 0},),
    covers=tuple(f"PORT-2.{i}" for i in range(1, 6)),
)
def refuses_outside_domain(ctx: Context, example: Example) -> None:
    for obligation, what, args, offending in _outside_port_domain(example):

        def kv_port(args: Example = args) -> int:
            return ctx.adapter.kv_port(**args)

        expect_refused(
            obligation,
            f"the KV port of {args} ({what})",
            kv_port,
            naming=offending,
            accepted=args,
        )


_ANY_ADAPTER = Adapter()


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
    covers=("PORT-3.1",),
)
def deployment_distinct(ctx: Context, example: Example) -> None:
    owners: dict[object, list[tuple[int, int, int]]] = defaultdict(list)
    for stage, tp in enumerate(example["tp"]):
        for replica in range(example["replicas"]):
            for rank in range(tp):
                number = unless_refused(
                    lambda: ctx.adapter.kv_port(example["base"], stage, rank, replica),  # noqa: B023
                    obligation="PORT-3.1",
                    what=f"the port of stage {stage} replica {replica} rank {rank}",
                )
                if number is REFUSED:
                    continue  # a refusal is allowed (a crash is not); PORT-1 checks it is not wrong
                owners[number].append((stage, replica, rank))
    clashes = {p: o for p, o in owners.items() if len(o) > 1}
    expect(
        not clashes,
        f"deployment {example}: (stage, replica, rank) endpoints share ports: "
        + "; ".join(f"{p}: {o}" for p, o in sorted(clashes.items())[:3])
        + " [PORT-3.1]",
    )
