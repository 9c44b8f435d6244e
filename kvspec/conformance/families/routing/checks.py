"""Checks of who sends to whom [PLAN-2, PLAN-3, PLAN-4, HEAD-3, DP-1].

Cases are drawn inside the adapter's domain, under the policies it names (the spec's,
or rules of its own declared in ``Adapter.policy_rules`` [PLAN-4]).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, within_domain
from kvspec.conformance.checks.expectations import expect, fail, refused
from kvspec.conformance.draws import ROUTING_PINS, case_examples, pinned_case, policy_in_domain
from kvspec.conformance.tiers import DIFFERS
from kvspec.topology.case import TransferCase
from kvspec.topology.ownership import RankOwnership
from kvspec.topology.plan import POLICIES, Edge, edge_between
from kvspec.topology.tokens import Tokens

POLICY_PINS: tuple[Example, ...] = (
    pinned_case(8, 4, 2, policy="balanced"),  # four receivers share two heads of four replicas
    pinned_case(4, 8, 2, policy="balanced"),  # more receivers of a head than it has replicas
    pinned_case(4, 2, 1, layers=3, pp_s=1, pp_t=3, policy="balanced"),  # receivers in PP stages
    pinned_case(4, 4, 2, layers=4, pp_s=2, pp_t=2, policy="balanced"),
    pinned_case(4, 2, 1, layers=4, pp_s=2, pp_t=2, policy="balanced"),  # each source stage its own
)


def _strategy(adapter: Adapter) -> st.SearchStrategy[Example]:
    return case_examples(adapter)


def _sources(ctx: Context, case: TransferCase, dst: int) -> list[int]:
    sources = list(ctx.adapter.sources(case, dst))
    bad = [s for s in sources if s not in case.source.ranks()]
    expect(
        not bad,
        f"{case.describe()}: target rank {dst} lists source ranks {bad}, outside 0.."
        f"{case.source.world_size - 1} [PLAN-2.3]",
    )
    return sources


def _cover(
    receiver: RankOwnership, edges: list[Edge], seq_len: int | None
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]], dict[tuple[int, int], list]]:
    """Cells (head, layer, token) an edge set delivers twice and never, for ``receiver``;
    a token of -1 stands for every token when no stage has token shards."""
    twice: list[tuple[int, int, int]] = []
    missing: list[tuple[int, int, int]] = []
    senders: dict[tuple[int, int], list] = {}
    if receiver.tokens is not None:
        mine: Tokens | None = receiver.tokens
    elif seq_len is not None:
        mine = Tokens.span(0, seq_len)
    else:
        mine = None
    for head in receiver.heads:
        for layer in receiver.layers:
            carried = [e for e in edges if head in e.heads and layer in e.layers]
            senders[(head, layer)] = [e.src for e in carried]
            if mine is None:
                if len(carried) > 1:
                    twice.append((head, layer, -1))
                elif not carried:
                    missing.append((head, layer, -1))
                continue
            seen: set[int] = set()
            for e in carried:
                tokens = e.tokens.tokens() if e.tokens is not None else mine.tokens()
                twice += [(head, layer, t) for t in tokens if t in seen]
                seen.update(tokens)
            missing += [(head, layer, t) for t in mine.tokens() if t not in seen]
    return twice, missing, senders


def _cell(cell: tuple[int, int, int]) -> str:
    head, layer, token = cell
    return f"(head {head}, layer {layer}" + (")" if token < 0 else f", token {token})")


@check(
    "PLAN-2",
    "exact-cover",
    "every owned (head, layer, token) arrives once, from an owner",
    needs=("routing",),
    strategy=_strategy,
    examples=ROUTING_PINS,
    covers=("PLAN-2.1", "PLAN-2.2", "PLAN-2.3", "PLAN-2.4", "HEAD-3.2", "DP-1.1"),
)
def exact_cover(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    policy_in_domain(ctx, case)
    mla = " (an MLA latent: each layer from exactly one sender) [HEAD-3.2]" * (
        case.model.attention == "mla"
    )
    dp = case.source.dp > 1 or case.target.dp > 1
    differs: str | None = None  # a replica's second delivery, where every replica writes
    for dst in case.target.ranks():
        receiver = case.owner("target", dst)
        sources = _sources(ctx, case, dst)
        expect(
            len(sources) == len(set(sources)),
            f"{case.describe()}: target rank {dst} lists a source twice: {sources} [PLAN-2.4]",
        )
        edges = []
        for src in sources:
            sender = case.owner("source", src)
            if dp and not (sender.active and receiver.active):
                fail(
                    f"{case.describe()}: target rank {dst} (DP group {receiver.dp_rank}) lists "
                    f"source {src} (DP group {sender.dp_rank}); the request lives on DP ranks "
                    f"{case.source_dp} -> {case.target_dp}, and only those groups' ranks send "
                    "and receive it [DP-1.1]"
                )
            try:
                edges.append(edge_between(sender, receiver, case.model))
            except ValueError as error:
                fail(f"{case.describe()}: target rank {dst} lists source {src}: {error} [PLAN-2.3]")
        twice, missing, senders = _cover(receiver, edges, case.seq_len)
        by_replicas = bool(twice) and _replicas_only(ctx, case, twice, senders)
        expect(
            not twice or by_replicas,
            f"{case.describe()}: target rank {dst} receives {_cell(twice[0]) if twice else ''} "
            f"from source ranks {senders[twice[0][:2]] if twice else []}; each (head, layer, "
            f"token) must come from exactly one sender (replicas merged twice?) [PLAN-2.2]{mla}",
        )
        if by_replicas and differs is None:
            differs = (
                f"{case.describe()}: target rank {dst} receives {_cell(twice[0])} from source "
                f"ranks {senders[twice[0][:2]]}, each a replica holding it: the adapter declares "
                "replicas_write='every' (every replica writes identical bytes, the receiver "
                "counts them), a legitimate choice where kvspec has exactly one sender "
                f"[PLAN-2.2]{mla}"
            )
        holds = "" if receiver.tokens is None else f", tokens {receiver.tokens.describe()}"
        expect(
            not missing,
            f"{case.describe()}: target rank {dst} (heads {list(receiver.heads)}, layers "
            f"{receiver.layers.start}..{receiver.layers.stop - 1}{holds}) never receives "
            f"{', '.join(_cell(c) for c in missing[:3])}{' ...' if len(missing) > 3 else ''} "
            f"from sources {sources} [PLAN-2.1]{mla}",
        )
    if differs is not None:  # after every receiver's cover: a missing cell is worse
        fail(differs, tier=DIFFERS)


@check(
    "PLAN-3",
    "inverse",
    "t lists s iff s lists t; both ascending",
    needs=("routing",),
    strategy=_strategy,
    examples=ROUTING_PINS,
    covers=("PLAN-3.1", "PLAN-3.2"),
)
def inverse(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    policy_in_domain(ctx, case)
    by_target = {(s, t) for t in case.target.ranks() for s in _sources(ctx, case, t)}
    by_source = set()
    for src in case.source.ranks():
        targets = list(ctx.adapter.targets(case, src))
        expect(
            targets == sorted(set(targets)),
            f"{case.describe()}: source rank {src} lists targets {targets}, not ascending "
            "without repeats [PLAN-3.2]",
        )
        by_source |= {(src, t) for t in targets}
    only_source = sorted(by_source - by_target)
    only_target = sorted(by_target - by_source)
    expect(
        not only_source and not only_target,
        f"{case.describe()}: (source, target) pairs listed by the sender only: {only_source}; "
        f"by the receiver only: {only_target} [PLAN-3.1]",
    )
    for dst in case.target.ranks():
        sources = _sources(ctx, case, dst)
        expect(
            sources == sorted(sources),
            f"{case.describe()}: target rank {dst} lists sources {sources}, not ascending "
            "[PLAN-3.2]",
        )


def _has_policy(adapter: Adapter) -> str | None:
    return None if adapter.policies else "the adapter names no policy (Adapter.policies)"


@st.composite
def _policy_cases(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A case of the domain, under one of the adapter's policies."""
    example = draw(case_examples(adapter))
    return {**example, "policy": draw(st.sampled_from(adapter.drawn_policies))}


@check(
    "PLAN-4",
    "named-policy",
    "replicas are chosen as the named (or declared) policy says",
    needs=("routing",),
    strategy=_policy_cases,
    examples=ROUTING_PINS + POLICY_PINS,
    missing=_has_policy,
    covers=("PLAN-4.1", "PLAN-4.2", "PLAN-4.5"),
)
def named_policy(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    policy_in_domain(ctx, case)
    rule = ctx.adapter.policy_rules.get(case.policy)
    obligation = "PLAN-4.5" if rule else f"PLAN-4.{POLICIES.index(case.policy) + 1}"
    try:
        plan = case.plan(rule)
        again = case.plan(rule)
    except ValueError as error:
        fail(f"{case.describe()}: the declared rule of policy {case.policy!r}: {error} [PLAN-4.5]")
    expect(
        plan == again,
        f"{case.describe()}: the declared rule of policy {case.policy!r} chose other senders "
        "on a second run; a policy is deterministic [PLAN-4.5]",
    )
    differs: str | None = None  # extra replicas also sending, where every replica writes
    for dst in case.target.ranks():
        got = list(ctx.adapter.sources(case, dst))
        want = list(plan.sources_of(dst))
        extra = _extra_replicas(ctx, case, dst, want, got)
        expect(
            got == want or bool(extra),
            f"{case.describe()}: under policy {case.policy!r} target rank {dst} takes its heads "
            f"from source ranks {want} [{obligation}]; the implementation uses {got}",
        )
        if extra and differs is None:
            differs = (
                f"{case.describe()}: under policy {case.policy!r} target rank {dst} takes its "
                f"heads from source ranks {got}, the rule's {want} and the replicas {extra} "
                "holding its heads: the adapter declares replicas_write='every' (every replica "
                "writes identical bytes, the receiver counts them), a legitimate choice where "
                f"the named rule keeps one sender per head [{obligation}]"
            )
    if differs is not None:  # after every receiver: a misroute elsewhere is worse
        fail(differs, tier=DIFFERS)


def _extra_replicas(
    ctx: Context, case: TransferCase, dst: int, want: list[int], got: list[int]
) -> list[int]:
    """The sources of ``got`` beyond the rule's ``want`` when the only departure is that
    replicas holding the receiver's cells also send: the adapter declares
    ``replicas_write`` ``"every"``, ``got`` keeps every sender of ``want`` and repeats none,
    and each extra source is a rank of the request's group sharing heads and layers (and
    tokens) with the receiver, by kvspec's ownership. Empty otherwise (a misroute)."""
    if ctx.adapter.replicas_write != "every" or got == want:
        return []
    if len(got) != len(set(got)) or not set(want) <= set(got):
        return []
    receiver = case.owner("target", dst)
    extra = [src for src in got if src not in want]
    for src in extra:
        if src not in case.source.ranks():
            return []
        sender = case.owner("source", src)
        if not (sender.active and receiver.active):
            return []
        try:
            edge_between(sender, receiver, case.model)
        except ValueError:  # a sender that holds none of the receiver's cells
            return []
    return extra


@check(
    "PLAN-4",
    "deterministic",
    "one configuration routes the same way on every call, in any order",
    needs=("routing",),
    strategy=_policy_cases,
    examples=POLICY_PINS,
    covers=("PLAN-4.3",),
)
def deterministic(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    policy_in_domain(ctx, case)
    ranks = list(case.target.ranks())
    first = {dst: list(ctx.adapter.sources(case, dst)) for dst in ranks}
    targets = {src: list(ctx.adapter.targets(case, src)) for src in case.source.ranks()}
    again = {dst: list(ctx.adapter.sources(case, dst)) for dst in reversed(ranks)}
    targets_again = {src: list(ctx.adapter.targets(case, src)) for src in case.source.ranks()}
    changed = [dst for dst in ranks if first[dst] != again[dst]]
    expect(
        not changed,
        f"{case.describe()}: target rank {changed[:1]} takes its heads from "
        f"{first[changed[0]] if changed else []} on one call and "
        f"{again[changed[0]] if changed else []} on the next; replica choice is a "
        "deterministic function of the configuration [PLAN-4.3]",
    )
    moved = [src for src in targets if targets[src] != targets_again[src]]
    expect(
        not moved,
        f"{case.describe()}: source rank {moved[:1]} lists other targets on a second call "
        "[PLAN-4.3]",
    )


UNKNOWN_POLICIES: tuple[str, ...] = ("random", "Lowest", "balance", "lowest ", "round_robin", "")
"""Policy names one typo away from a real one, or none at all [PLAN-4]."""


def _replicated_domain(adapter: Adapter) -> str | None:
    if not adapter.policies:
        return "the adapter names no policy (Adapter.policies)"
    if not adapter.domain.replicated_heads and "mla" not in adapter.domain.attention:
        return "the adapter's domain has no replicated heads, so no replica is ever chosen"
    return None


@st.composite
def _unknown_policy_cases(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A case whose source holds some head on several TP ranks, under an unknown policy."""
    example = draw(
        case_examples(adapter).filter(
            lambda e: TransferCase.from_dict(e).model.num_kv_heads < e["source"]["tp"]
        )
    )
    known = set(adapter.policies) | set(adapter.policy_rules)
    name = draw(st.sampled_from([p for p in UNKNOWN_POLICIES if p not in known]))
    return {**example, "policy": name}


@check(
    "PLAN-4",
    "refuses-unknown-policy",
    "a policy name the implementation does not have is refused, not read as another",
    needs=("routing",),
    strategy=_unknown_policy_cases,
    examples=tuple({**pin, "policy": "balance"} for pin in ROUTING_PINS[:2]),
    missing=_replicated_domain,
    covers=("PLAN-4.4",),
)
def refuses_unknown_policy(ctx: Context, example: Example) -> None:
    case = TransferCase.from_dict(example)
    within_domain(ctx, case)
    answers = {}
    for dst in case.target.ranks():
        asked: dict[str, list[int]] = {}

        def route(dst: int = dst, asked: dict[str, list[int]] = asked) -> list[int]:
            return asked.setdefault("got", list(ctx.adapter.sources(case, dst)))

        if refused(
            route,
            obligation="PLAN-4.4",
            what=f"{case.describe()}: target {dst} routed under the unknown {case.policy!r}",
            naming=(case.policy,),
        ):
            return
        answers[dst] = asked["got"]
    fail(
        f"{case.describe()}: routing under the unknown policy {case.policy!r} was accepted "
        f"(sources {answers}); a policy name the implementation does not have must be "
        "refused, not read as another [PLAN-4.4]"
    )


def _replicas_only(
    ctx: Context,
    case: TransferCase,
    twice: list[tuple[int, int, int]],
    senders: dict[tuple[int, int], list],
) -> bool:
    """Whether the adapter declares that every replica writes (``replicas_write``
    ``"every"``) and every sender of every cell delivered more than once is a source rank
    that holds that cell (head, layer and token), by kvspec's ownership of the source
    layout: a replica's identical bytes, not a merge of different ones."""
    if ctx.adapter.replicas_write != "every":
        return False
    for head, layer, token in twice:
        for src in senders[(head, layer)]:
            owner = case.owner("source", src)
            holds_token = token < 0 or owner.tokens is None or token in owner.tokens.tokens()
            if head not in owner.heads or layer not in owner.layers or not holds_token:
                return False
    return True
