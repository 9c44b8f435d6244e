"""Checks of who sends to whom [PLAN-2, PLAN-3, PLAN-4]."""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, fail, within_domain
from kvspec.model import ModelShape
from kvspec.ownership import rank_ownership
from kvspec.plan import edge_between
from kvspec.stage import StageLayout
from kvspec.strategies import TransferCase, transfer_cases


def case_examples(adapter: Adapter, **kwargs) -> st.SearchStrategy[Example]:
    """Valid transfer cases, using only the replica policies the adapter implements."""
    policies = adapter.policies or ("lowest",)
    return transfer_cases(policies=policies, **kwargs).map(TransferCase.to_dict)


def _case(tp_s: int, tp_t: int, heads: int, layers: int = 2, **kw) -> Example:
    pp_s, pp_t = kw.get("pp_s", 1), kw.get("pp_t", 1)
    return TransferCase(
        StageLayout(tp_s, pp_s), StageLayout(tp_t, pp_t), ModelShape(layers, heads, 2)
    ).to_dict()


ROUTING_PINS: tuple[Example, ...] = (
    _case(4, 2, 2),  # GQA replicas on the sender: each head must be taken once, not merged twice
    _case(8, 2, 4),  # TP8 -> TP2 with 4 heads
    _case(2, 8, 4),  # fan-out into replicated heads
    _case(2, 4, 8),  # fan-out, two heads per slice: a slice cut twice loses one
    _case(1, 2, 2),  # a TP1 sender: legacy keys are for two single-rank stages only
    _case(2, 2, 8, layers=5, pp_s=2, pp_t=3),  # uneven pipeline partitions on both sides
    TransferCase(StageLayout(4), StageLayout(8), ModelShape.mla(2, 4)).to_dict(),
)


def _strategy(adapter: Adapter) -> st.SearchStrategy[Example]:
    return case_examples(adapter)


def _sources(ctx: Context, case: TransferCase, dst: int) -> list[int]:
    sources = list(ctx.adapter.sources(case, dst))
    bad = [s for s in sources if s not in case.source.ranks()]
    expect(
        not bad,
        f"{case.describe()}: target rank {dst} lists source ranks {bad}, outside 0.."
        f"{case.source.world_size - 1} [STAGE-1]",
    )
    return sources


@check(
    "PLAN-2",
    "exact-cover",
    "every owned (head, layer) arrives once, from an owner",
    needs=("routing",),
    strategy=_strategy,
    examples=ROUTING_PINS,
)
def exact_cover(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    for dst in case.target.ranks():
        receiver = rank_ownership(case.target, case.model, dst)
        sources = _sources(ctx, case, dst)
        expect(
            len(sources) == len(set(sources)),
            f"{case.describe()}: target rank {dst} lists a source twice: {sources} [PLAN-2]",
        )
        delivered: Counter[tuple[int, int]] = Counter()
        senders: dict[tuple[int, int], list[int]] = {}
        for src in sources:
            sender = rank_ownership(case.source, case.model, src)
            try:
                edge = edge_between(sender, receiver, case.model)
            except ValueError as error:
                fail(f"{case.describe()}: target rank {dst} lists source {src}: {error}")
            for cell in ((h, lay) for h in edge.heads for lay in edge.layers):
                delivered[cell] += 1
                senders.setdefault(cell, []).append(src)
        twice = sorted(cell for cell, n in delivered.items() if n > 1)
        expect(
            not twice,
            f"{case.describe()}: target rank {dst} receives (head, layer) {twice[:1]} from "
            f"source ranks {senders[twice[0]] if twice else []}; each (head, layer) must come "
            "from exactly one sender (replicas merged twice?) [PLAN-2]",
        )
        missing = sorted(
            (h, lay) for h in receiver.heads for lay in receiver.layers if (h, lay) not in delivered
        )
        expect(
            not missing,
            f"{case.describe()}: target rank {dst} (heads {list(receiver.heads)}, layers "
            f"{receiver.layers.start}..{receiver.layers.stop - 1}) never receives (head, layer) "
            f"{missing[:3]}{' ...' if len(missing) > 3 else ''} from sources {sources} [PLAN-2]",
        )


@check(
    "PLAN-3",
    "inverse",
    "t lists s iff s lists t; both ascending",
    needs=("routing",),
    strategy=_strategy,
    examples=ROUTING_PINS,
)
def inverse(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    by_target = {(s, t) for t in case.target.ranks() for s in _sources(ctx, case, t)}
    by_source = set()
    for src in case.source.ranks():
        targets = list(ctx.adapter.targets(case, src))
        expect(
            targets == sorted(set(targets)),
            f"{case.describe()}: source rank {src} lists targets {targets}, not ascending "
            "without repeats [PLAN-3]",
        )
        by_source |= {(src, t) for t in targets}
    only_source = sorted(by_source - by_target)
    only_target = sorted(by_target - by_source)
    expect(
        not only_source and not only_target,
        f"{case.describe()}: (source, target) pairs listed by the sender only: {only_source}; "
        f"by the receiver only: {only_target} [PLAN-3]",
    )
    for dst in case.target.ranks():
        sources = _sources(ctx, case, dst)
        expect(
            sources == sorted(sources),
            f"{case.describe()}: target rank {dst} lists sources {sources}, not ascending [PLAN-3]",
        )


@check(
    "PLAN-4",
    "named-policy",
    "replicas are chosen as the named policy says",
    needs=("routing",),
    strategy=_strategy,
    examples=ROUTING_PINS,
    missing=lambda a: None if a.policies else "the adapter names no policy (Adapter.policies)",
)
def named_policy(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    plan = case.plan()
    for dst in case.target.ranks():
        got = list(ctx.adapter.sources(case, dst))
        expect(
            got == list(plan.sources_of(dst)),
            f"{case.describe()}: under policy {case.policy!r} target rank {dst} takes its heads "
            f"from source ranks {list(plan.sources_of(dst))} [PLAN-4]; the implementation "
            f"uses {got}",
        )
