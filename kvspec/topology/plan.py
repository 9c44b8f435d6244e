"""Transfer plans: which sender rank sends which heads, layers and tokens to which receiver.

A plan is made for one (source layout, target layout, model), a replica-choice policy
and, where the stages split requests by tokens or serve them on attention-DP groups,
one request: its length and the DP rank the router chose on each side [PLAN-6, DP-1].
For every receiver rank, every pipeline stage of the source whose layers overlap the
receiver's and every token shard of the source whose tokens overlap the receiver's,
the receiver's heads are taken from the source ranks that own them; when a head is
replicated on several of them, the policy picks one [PLAN-4]. An edge carries the
intersection of what its two ranks hold, so no TP pair need divide [PLAN-1, PLAN-6],
and the result covers every (head, layer, token) a receiver owns exactly once [PLAN-2].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.core.clause import Clause, accepts, must, refuses
from kvspec.core.require import require_choice, require_int, require_rank
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import (
    RankOwnership,
    check_layout,
    head_replicas,
    layer_ranges,
    rank_ownership,
    stage_ownership,
)
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "PLAN-1",
        "Any two layouts valid alone are planned",
        "A transfer from one stage layout to another is planned whenever each side alone can "
        "hold the model: its heads fit its attention-TP size [HEAD-1, HEAD-2, STAGE-2] and its "
        "decode context parallelism has the replicas it needs [CP-3]. TP sizes need not divide "
        "one another (TP4 -> TP6 with 12 heads is planned by head-range intersection "
        "[PLAN-6]); either side, or both, may have token shards [CP-1], attention-DP groups "
        "[DP-1] or pipeline stages. A plan is refused only where one side cannot hold the "
        "model, and the error names that side and the rule.",
        obligations=(
            refuses(
                "a pair where one side alone cannot hold the model (its heads or its DCP), "
                "while the other can"
            ),
            accepts(
                "every pair of layouts each valid alone is accepted: non-dividing TP pairs, "
                "token shards on either side, attention-DP groups, any PP sizes"
            ),
        ),
    ),
    Clause(
        "PLAN-2",
        "Exact cover",
        "For every receiver rank, every (head, layer, token) it owns is carried by exactly "
        "one edge into it, and that edge's sender owns the (head, layer, token). No edge "
        "carries a head, layer or token its receiver does not own. There is at most one edge "
        "per (sender, receiver).",
        obligations=(
            must("every (head, layer, token) a receiver owns arrives on an edge into it"),
            must("no (head, layer, token) arrives twice: replicas are never merged twice"),
            must("every edge's sender owns the heads, layers and tokens the edge carries"),
            must("a receiver lists each of its senders once"),
        ),
    ),
    Clause(
        "PLAN-3",
        "Inverse consistency",
        "A receiver lists sender s among its sources if and only if s lists the receiver "
        "among its targets; both lists are in ascending rank order.",
        obligations=(
            must("a receiver lists sender s if and only if s lists the receiver"),
            must("sources and targets are listed in ascending rank order"),
        ),
    ),
    Clause(
        "PLAN-4",
        "Replica choice is a named, deterministic policy",
        "When a head is held by several source ranks [HEAD-2], the sender is chosen among "
        "those that hold it and the receiver's tokens' shard [CP-3] by a named policy: "
        "'lowest' takes the lowest TP rank holding the head; 'balanced' numbers the receivers "
        "that need the head from one source pipeline stage (and token shard) in ascending "
        "rank order and gives the k-th of them replica k mod (number of replicas). Every "
        "policy satisfies PLAN-2 and PLAN-3; an unknown policy name is refused.",
        obligations=(
            must("'lowest' takes a replicated head from the lowest TP rank holding it"),
            must(
                "'balanced' gives the k-th receiver of a head (ascending, per source pipeline "
                "stage) replica k mod (number of replicas)"
            ),
            must(
                "the choice is deterministic: one configuration gives the same senders on every "
                "call, in any order of calls"
            ),
            refuses("a policy name that is not one of the implementation's policies"),
            must(
                "a declared (field) policy picks a rank holding the head, the same one every time, "
                "and routing follows it"
            ),
        ),
    ),
    Clause(
        "PLAN-5",
        "Bytes of an edge",
        "An edge of h heads, l layers and T tokens moves h * l * T * head_dim * itemsize * k "
        "bytes, k = 2 for MHA/GQA (K and V) and 1 for MLA; T is seq_len when neither side has "
        "token shards, else the size of the edge's token set. Under receiver-side slicing it "
        "moves the sender's whole head shard: (sender's heads / h) times that [SLICE-2].",
        obligations=(
            must(
                "sender-side, an edge moves heads x layers x tokens x head_dim x itemsize x "
                "(2, or 1 for MLA) bytes"
            ),
            must("receiver-side, an edge moves the sender's whole head shard of those cells"),
        ),
    ),
    Clause(
        "PLAN-6",
        "Plans pair ranges by intersection",
        "The edge from sender s to receiver t carries the heads, layers and tokens both hold: "
        "the intersection of their head ranges, layer ranges and token sets [CP-1]. Its heads "
        "are a contiguous range of the sender's, an equal slice of them only when the TP "
        "sizes happen to allow it [SLICE-1]. A plan whose stages have token shards is made "
        "for one request length, since token sets depend on it.",
        obligations=(
            must(
                "an edge carries the intersection of its two ranks' head ranges, also when "
                "neither TP size divides the other"
            ),
            must("an edge carries the intersection of its two ranks' token sets"),
            must(
                "a plan with token shards is the plan of its request's length: another length "
                "gives other token sets"
            ),
        ),
    ),
    Clause(
        "DP-1",
        "A request lives on one attention-DP group of each stage",
        "The router chooses the request's DP rank on each side (an input of the plan). The "
        "plan has edges only from ranks of the source's chosen group to ranks of the "
        "target's chosen group, planned as between stages of tp / dp ranks; ranks of other "
        "groups send and receive nothing of the request. Keys and ports name stage-local "
        "ranks, which carry the DP group [STAGE-2, KEY-1, PORT-1]. A DP rank outside "
        "0..dp-1 is refused.",
        obligations=(
            must(
                "edges run only from the source DP group the router chose to the target DP "
                "group it chose"
            ),
            must("the keys of a request on DP rank d name stage-local ranks of group d"),
            refuses("a DP rank outside 0..dp-1 on either side"),
        ),
    ),
)

POLICIES: tuple[str, ...] = ("lowest", "balanced")
"""The named replica-choice policies [PLAN-4]."""


@dataclass(frozen=True)
class ReplicaChoice:
    """What a replica policy sees when it picks the sender of one head [PLAN-4].

    ``replicas`` are the TP ranks of source pipeline stage ``source_pp_rank`` that hold
    ``head`` (and, with token shards, the shard the choice is for [CP-3]; a range that
    may step); ``consumer_index`` is the receiver's index (ascending rank order) among
    the receivers that need the head from that stage and shard; ``receiver_rank`` and
    ``receiver_tp_rank`` name the receiver. ``source_attn_tp`` and ``target_attn_tp``
    are the two stages' attention-TP sizes, which the field's rules are stated in
    (SGLang's ``rank // ratio``, vLLM's ``tp_rank * P // D``:
    kvspec/topology/field_policies.py); 0 in a choice built without them.
    """

    head: int
    replicas: range
    consumer_index: int
    receiver_rank: int
    receiver_tp_rank: int
    source_pp_rank: int
    source_attn_tp: int = 0
    target_attn_tp: int = 0


ReplicaRule = Callable[[ReplicaChoice], int]
"""A replica policy as a function: the TP rank (one of ``replicas``) that sends the head."""

SPEC_RULES: dict[str, ReplicaRule] = {
    "lowest": lambda c: c.replicas[0],
    "balanced": lambda c: c.replicas[c.consumer_index % len(c.replicas)],
}
"""The spec's named policies as rules [PLAN-4]."""


def replica_rule(policy: str, rule: ReplicaRule | None = None) -> ReplicaRule:
    """The rule that implements ``policy`` [PLAN-4]: one of :data:`POLICIES` by name, or,
    with ``rule``, a policy of one's own (a field rule of
    :mod:`kvspec.topology.field_policies`, an adapter's ``policy_rules``), which needs a
    name. Every planner takes its replica choice from here, so a declared rule reaches
    each of them: the uniform plan, a hybrid's layer groups and its state reads."""
    if rule is None:
        require_choice("policy", policy, POLICIES)
        return SPEC_RULES[policy]
    if not isinstance(policy, str) or not policy:
        raise ValueError(f"a policy given as a rule needs a name, got {policy!r} [PLAN-4]")
    return rule


def choose_replica(policy: str, rule: ReplicaRule, choice: ReplicaChoice) -> int:
    """The source TP rank that sends ``choice.head`` to its receiver under ``rule`` (the
    rule of ``policy``); refused unless it is one of the head's replicas [PLAN-4]."""
    chosen = rule(choice)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or chosen not in choice.replicas:
        shown = list(choice.replicas) if len(choice.replicas) <= 8 else choice.replicas
        raise ValueError(
            f"policy {policy!r} chose source TP rank {chosen!r} for head {choice.head} of "
            f"target rank {choice.receiver_rank}, but only TP ranks {shown} hold it [PLAN-4]"
        )
    return chosen


@dataclass(frozen=True)
class Edge:
    """One sender-to-receiver transfer of a request's KV [PLAN-2, PLAN-6, SLICE-1, PLAN-5].

    ``src`` and ``dst`` are stage-local ranks; ``heads`` and ``layers`` are global
    ids. The heads are ``head_offset ..`` of the sender's ``shard_heads`` heads; when
    they are an equal slice, ``offset_in_shard`` / ``num_slices`` say which (else both
    are None) [SLICE-1]. ``tokens`` is the edge's token set, None when neither stage has
    token shards (every token of the request) [PLAN-6].
    """

    src: int
    dst: int
    heads: range
    layers: range
    offset_in_shard: int | None
    num_slices: int | None
    bytes_per_token: int
    tokens: Tokens | None = None
    head_offset: int = 0
    shard_heads: int = 0

    def token_count(self, seq_len: int) -> int:
        """Tokens the edge carries of a ``seq_len``-token request."""
        return seq_len if self.tokens is None else len(self.tokens)

    def nbytes(self, seq_len: int, *, slicing: str = "sender") -> int:
        """Bytes this edge moves for a request of ``seq_len`` tokens [PLAN-5]."""
        require_int("seq_len", seq_len, minimum=0)
        require_choice("slicing", slicing, ("sender", "receiver"))
        per_token = self.bytes_per_token
        if slicing == "receiver":
            per_token = per_token // len(self.heads) * self.shard_heads
        return per_token * self.token_count(seq_len)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (ranges as ``[start, stop)`` pairs; ``heads_in_shard`` and
        ``shard_heads`` instead of the slice when the heads are no equal slice; ``tokens``
        as ``[[start, stop], ...]`` when the stages have token shards)."""
        data: dict[str, Any] = {
            "src": self.src,
            "dst": self.dst,
            "heads": [self.heads.start, self.heads.stop],
            "layers": [self.layers.start, self.layers.stop],
        }
        if self.offset_in_shard is None:
            data["heads_in_shard"] = [self.head_offset, self.head_offset + len(self.heads)]
            data["shard_heads"] = self.shard_heads
        else:
            data["offset_in_shard"] = self.offset_in_shard
            data["num_slices"] = self.num_slices
        data["bytes_per_token"] = self.bytes_per_token
        if self.tokens is not None:
            data["tokens"] = self.tokens.to_list()
        return data


@dataclass(frozen=True)
class TransferPlan:
    """Every edge of a transfer from ``source`` to ``target`` for ``model`` [PLAN-1..6, DP-1].

    ``seq_len`` is the request length the plan is for when a stage has token shards
    (None otherwise: the plan holds for every length); ``source_dp`` and ``target_dp``
    are the attention-DP groups the router chose.
    """

    source: StageLayout
    target: StageLayout
    model: ModelShape
    policy: str
    edges: tuple[Edge, ...]
    seq_len: int | None = None
    source_dp: int = 0
    target_dp: int = 0

    def edges_from(self, src: int) -> tuple[Edge, ...]:
        """Edges sender ``src`` sends, in ascending receiver order."""
        require_rank("source rank", src, self.source.world_size)
        return tuple(e for e in self.edges if e.src == src)

    def edges_to(self, dst: int) -> tuple[Edge, ...]:
        """Edges receiver ``dst`` receives, in ascending sender order."""
        require_rank("target rank", dst, self.target.world_size)
        return tuple(sorted((e for e in self.edges if e.dst == dst), key=lambda e: e.src))

    def edge(self, src: int, dst: int) -> Edge:
        """The edge from ``src`` to ``dst``; refused when the plan has none."""
        for e in self.edges_to(dst):
            if e.src == src:
                return e
        raise ValueError(
            f"the plan has no edge from source rank {src} to target rank {dst}; "
            f"target rank {dst} receives from {list(self.sources_of(dst))}"
        )

    def targets_of(self, src: int) -> tuple[int, ...]:
        """Receivers of sender ``src``, ascending [PLAN-3]."""
        return tuple(e.dst for e in self.edges_from(src))

    def sources_of(self, dst: int) -> tuple[int, ...]:
        """Senders of receiver ``dst``, ascending [PLAN-3]."""
        return tuple(e.src for e in self.edges_to(dst))

    def owner(self, side: str, rank: int) -> RankOwnership:
        """What ``rank`` of the ``source`` or ``target`` side holds of the plan's request."""
        require_choice("side", side, ("source", "target"))
        layout = self.source if side == "source" else self.target
        dp_rank = self.source_dp if side == "source" else self.target_dp
        return rank_ownership(layout, self.model, rank, seq_len=self.seq_len, dp_rank=dp_rank)

    def check_length(self, seq_len: int) -> None:
        """Refuse a request length other than the one a token-sharded plan is for [PLAN-6]."""
        require_int("seq_len", seq_len, minimum=0)
        if self.seq_len is not None and seq_len != self.seq_len:
            raise ValueError(
                f"this plan is for a request of {self.seq_len} tokens (its stages split requests "
                f"by tokens), not {seq_len}; make the plan of that length [PLAN-6]"
            )

    def nbytes(self, seq_len: int, *, slicing: str = "sender") -> int:
        """Bytes all edges move for one request of ``seq_len`` tokens [PLAN-5]."""
        self.check_length(seq_len)
        return sum(e.nbytes(seq_len, slicing=slicing) for e in self.edges)

    def minimum_nbytes(self, seq_len: int) -> int:
        """Bytes every receiver must get at least: all it owns, once [PLAN-2]."""
        self.check_length(seq_len)
        per_head_layer = self.model.bytes_per_token_per_head_layer
        return sum(
            len(r.heads) * len(r.layers) * r.token_count(seq_len) * per_head_layer
            for r in (self.owner("target", rank) for rank in self.target.ranks())
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form of the plan, for JSON output and golden vectors."""
        data: dict[str, Any] = {
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy,
            "edges": [e.to_dict() for e in self.edges],
        }
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        if self.source.dp > 1 or self.target.dp > 1:
            data.update(source_dp=self.source_dp, target_dp=self.target_dp)
        return data


def layout_problems(source: StageLayout, target: StageLayout, model: ModelShape) -> list[str]:
    """Why each side cannot hold the model, one line per problem, naming the side [PLAN-1]."""
    problems = []
    for side, layout in (("source", source), ("target", target)):
        try:
            check_layout(layout, model)
        except ValueError as error:
            problems.append(f"{side} {layout.describe()}: {error}")
    return problems


def check_layouts(source: StageLayout, target: StageLayout, model: ModelShape) -> None:
    """Refuse a pair in which either side alone cannot hold the model; every problem is
    reported, each naming its side [PLAN-1]."""
    problems = layout_problems(source, target, model)
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(f"{len(problems)} problems:\n  " + "\n  ".join(problems))


def check_plannable(source_tp: int, target_tp: int, num_kv_heads: int) -> None:
    """Refuse a head count that one of two plain TP sizes cannot hold [PLAN-1, HEAD-1,
    HEAD-2]; any two TP sizes are otherwise plannable."""
    require_int("source tp", source_tp, minimum=1)
    require_int("target tp", target_tp, minimum=1)
    model = ModelShape(1, require_int("num_kv_heads", num_kv_heads, minimum=1), 1)
    check_layouts(StageLayout(source_tp), StageLayout(target_tp), model)


def plan_transfer(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    *,
    policy: str = "lowest",
    rule: ReplicaRule | None = None,
    seq_len: int | None = None,
    source_dp: int = 0,
    target_dp: int = 0,
) -> TransferPlan:
    """The transfer plan from ``source`` to ``target`` for ``model`` [PLAN-1..6, DP-1].

    ``policy`` names one of :data:`POLICIES`, or, with ``rule``, a policy of one's own:
    the rule picks the sending TP rank of each replicated head and must return one of
    the replicas it is shown [PLAN-4]. Every policy gives a plan that satisfies PLAN-2
    and PLAN-3. ``seq_len`` is required when a stage has token shards (the plan is for
    one request length) and ignored otherwise; ``source_dp`` and ``target_dp`` are the
    attention-DP groups the router chose for the request [DP-1].

    Both stages must run the same model; check that first with
    :func:`kvspec.topology.model.check_compatible` when each stage has its own description.
    """
    if model.hybrid:
        raise ValueError(
            f"{model.describe()} has layer groups or an indexer; such a model is planned group "
            "by group "
            "(kvspec.topology.group_plan.plan_groups) [GROUP-3]"
        )
    rule = replica_rule(policy, rule)
    check_layouts(source, target, model)
    for name, layout, dp_rank in (("source", source, source_dp), ("target", target, target_dp)):
        try:
            require_rank(f"{name} DP rank", dp_rank, layout.dp)
        except ValueError as error:
            raise ValueError(f"{error} ({name} {layout.describe()}) [DP-1]") from None
    if source.token_shards == 1 and target.token_shards == 1:
        seq_len = None  # every length has the same plan
    elif seq_len is None:
        raise ValueError(
            f"{source.describe()} -> {target.describe()} splits requests by tokens, so a plan "
            "is made for one request length; give seq_len [PLAN-6]"
        )
    senders = stage_ownership(source, model, seq_len=seq_len, dp_rank=source_dp)
    receivers = [  # ranks holding none of the request receive nothing [CP-1, DP-1]
        r
        for r in stage_ownership(target, model, seq_len=seq_len, dp_rank=target_dp)
        if r.active and (r.tokens is None or r.tokens)
    ]
    shards = _shard_tokens(source, seq_len)
    source_pp_layers = layer_ranges(source, model.num_layers)
    consumer_index = _consumer_index(receivers, source_pp_layers, shards)

    edges: list[Edge] = []
    for receiver in receivers:
        chosen: set[int] = set()
        for pp_rank, shard in _pairs(receiver, source_pp_layers, shards):
            for head in receiver.heads:
                replicas = _replicas(source, model, source_dp, shard, head)
                tp_rank = choose_replica(
                    policy,
                    rule,
                    ReplicaChoice(
                        head=head,
                        replicas=replicas,
                        consumer_index=consumer_index[(pp_rank, shard, head)][receiver.rank],
                        receiver_rank=receiver.rank,
                        receiver_tp_rank=receiver.tp_rank,
                        source_pp_rank=pp_rank,
                        source_attn_tp=source.attn_tp,
                        target_attn_tp=target.attn_tp,
                    ),
                )
                chosen.add(source.rank(pp_rank, tp_rank))
        edges.extend(edge_between(senders[src], receiver, model) for src in sorted(chosen))
    edges.sort(key=lambda e: (e.src, e.dst))
    return TransferPlan(source, target, model, policy, tuple(edges), seq_len, source_dp, target_dp)


def _shard_tokens(layout: StageLayout, seq_len: int | None) -> list[Tokens | None]:
    """Each token shard's tokens of the request (one shard of every token without CP)."""
    if layout.token_shards == 1 or seq_len is None:
        return [None]
    return [layout.rule.tokens(s, layout.token_shards, seq_len) for s in range(layout.token_shards)]


def _pairs(
    receiver: RankOwnership, source_pp_layers: tuple[range, ...], shards: list[Tokens | None]
) -> list[tuple[int, int]]:
    """(source PP rank, source token shard) pairs holding some layer and token of ``receiver``."""
    found = []
    for pp_rank, stage_layers in enumerate(source_pp_layers):
        if not _intersect(stage_layers, receiver.layers):
            continue
        for shard, tokens in enumerate(shards):
            if tokens is None or (
                tokens and (receiver.tokens is None or tokens.intersect(receiver.tokens))
            ):
                found.append((pp_rank, shard))
    return found


def _replicas(layout: StageLayout, model: ModelShape, dp_rank: int, shard: int, head: int) -> range:
    """The TP ranks of the request's DP group that hold ``head`` and token shard ``shard``
    [HEAD-2, STAGE-2, CP-3]; a range that steps by ``dcp`` under DCP."""
    holders = head_replicas(model.num_kv_heads, layout.attn_tp, head)
    cp_rank, dcp_rank = divmod(shard, layout.dcp)
    first = holders.start + (dcp_rank - holders.start) % layout.dcp
    base = (dp_rank * layout.cp + cp_rank) * layout.attn_tp
    return range(base + first, base + holders.stop, layout.dcp)


def _consumer_index(
    receivers: list[RankOwnership],
    source_pp_layers: tuple[range, ...],
    shards: list[Tokens | None],
) -> dict[tuple[int, int, int], dict[int, int]]:
    """For each (source PP rank, token shard, head): receiver rank -> its index among that
    head's consumers."""
    index: dict[tuple[int, int, int], dict[int, int]] = defaultdict(dict)
    for receiver in receivers:  # ascending rank order
        for pp_rank, shard in _pairs(receiver, source_pp_layers, shards):
            for head in receiver.heads:
                consumers = index[(pp_rank, shard, head)]
                consumers[receiver.rank] = len(consumers)
    return index


def edge_between(sender: RankOwnership, receiver: RankOwnership, model: ModelShape) -> Edge:
    """The edge from ``sender`` to ``receiver``: every head, layer and token both own
    [PLAN-2, PLAN-6, SLICE-1].

    When a sender is chosen for some of a receiver's heads it is chosen for all the
    heads they share (a sender holds one head when heads are replicated [HEAD-2]), so
    the edge is the intersection of the two ranks' ownership. Refuses ranks that share
    nothing.
    """
    heads = _intersect(sender.heads, receiver.heads)
    layers = _intersect(sender.layers, receiver.layers)
    tokens = _common_tokens(sender.tokens, receiver.tokens)
    if not heads or not layers or (tokens is not None and not tokens):
        shared = "" if tokens is None else f", tokens {_tokens(sender)} / {_tokens(receiver)}"
        raise ValueError(
            f"source rank {sender.rank} (heads {_span(sender.heads)}, layers "
            f"{_span(sender.layers)}) shares nothing with target rank {receiver.rank} (heads "
            f"{_span(receiver.heads)}, layers {_span(receiver.layers)}){shared} [PLAN-2]"
        )
    head_offset = heads.start - sender.heads.start
    shard_heads = len(sender.heads)
    offset: int | None
    num_slices: int | None
    if shard_heads % len(heads) == 0 and head_offset % len(heads) == 0:
        offset, num_slices = head_offset // len(heads), shard_heads // len(heads)
    else:
        offset = num_slices = None  # a range of the sender's heads, no equal slice [PLAN-6]
    return Edge(
        src=sender.rank,
        dst=receiver.rank,
        heads=heads,
        layers=layers,
        offset_in_shard=offset,
        num_slices=num_slices,
        bytes_per_token=len(heads) * len(layers) * model.bytes_per_token_per_head_layer,
        tokens=tokens,
        head_offset=head_offset,
        shard_heads=shard_heads,
    )


def _common_tokens(a: Tokens | None, b: Tokens | None) -> Tokens | None:
    """The tokens two ranks share; None (every token) when neither has token shards."""
    if a is None:
        return b
    if b is None:
        return a
    return a.intersect(b)


def _tokens(owner: RankOwnership) -> str:
    return "all" if owner.tokens is None else owner.tokens.describe()


def _span(r: range) -> str:
    return f"{r.start}..{r.stop - 1}" if len(r) else "none"


def _intersect(a: range, b: range) -> range:
    return range(max(a.start, b.start), min(a.stop, b.stop))
