"""Transfer plans: which sender rank sends which heads and layers to which receiver rank.

A plan is made for one (source layout, target layout, model) and a replica-choice
policy. For every receiver rank and every pipeline stage of the source whose layers
overlap the receiver's, the receiver's heads are taken from the source TP ranks that
own them; when a head is replicated on several source ranks, the policy picks one
[PLAN-4]. The result covers every (head, layer) a receiver owns exactly once [PLAN-2].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec._checks import require_choice, require_int, require_rank
from kvspec.clause import Clause, must, refuses
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import RankOwnership, check_heads, head_replicas, stage_ownership
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "PLAN-1",
        "TP sizes divide one another",
        "A transfer between a stage at TP s and one at TP t requires s % t == 0 or "
        "t % s == 0 (PP sizes are free). Then every edge carries the sender's whole head "
        "shard or one of its equal slices [SLICE-1], which the tp_head_slice marker can "
        "state. Other pairs are refused with both sizes in the error.",
        obligations=(
            refuses("TP sizes s and t with s % t != 0 and t % s != 0"),
            must(
                "every pair of dividing TP sizes, with any PP sizes and a model valid for both, is "
                "accepted"
            ),
        ),
    ),
    Clause(
        "PLAN-2",
        "Exact cover",
        "For every receiver rank, every (head, layer) it owns is carried by exactly one edge "
        "into it, and that edge's sender owns the (head, layer). No edge carries a head or "
        "layer its receiver does not own. There is at most one edge per (sender, receiver).",
        obligations=(
            must("every (head, layer) a receiver owns arrives on an edge into it"),
            must("no (head, layer) arrives twice: replicas are never merged twice"),
            must("every edge's sender owns the heads and layers the edge carries"),
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
        "When a head is held by several source ranks [HEAD-2], the sender is chosen by a "
        "named policy: 'lowest' takes the lowest TP rank holding the head; 'balanced' "
        "numbers the receivers that need the head from one source pipeline stage in "
        "ascending rank order and gives the k-th of them replica k mod (number of replicas). "
        "Every policy satisfies PLAN-2 and PLAN-3; an unknown policy name is refused.",
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
        "An edge of h heads and l layers moves h * l * seq_len * head_dim * itemsize * k "
        "bytes for a request of seq_len tokens, k = 2 for MHA/GQA (K and V) and 1 for MLA. "
        "Under receiver-side slicing it moves num_slices times that [SLICE-2].",
        obligations=(
            must(
                "sender-side, an edge moves heads x layers x seq_len x head_dim x itemsize x "
                "(2, or 1 for MLA) bytes"
            ),
            must("receiver-side, an edge moves num_slices times that"),
        ),
    ),
)

POLICIES: tuple[str, ...] = ("lowest", "balanced")
"""The named replica-choice policies [PLAN-4]."""


@dataclass(frozen=True)
class ReplicaChoice:
    """What a replica policy sees when it picks the sender of one head [PLAN-4].

    ``replicas`` are the TP ranks of source pipeline stage ``source_pp_rank`` that hold
    ``head``; ``consumer_index`` is the receiver's index (ascending rank order) among the
    receivers that need the head from that stage; ``receiver_rank`` and
    ``receiver_tp_rank`` name the receiver.
    """

    head: int
    replicas: range
    consumer_index: int
    receiver_rank: int
    receiver_tp_rank: int
    source_pp_rank: int


ReplicaRule = Callable[[ReplicaChoice], int]
"""A replica policy as a function: the TP rank (one of ``replicas``) that sends the head."""

SPEC_RULES: dict[str, ReplicaRule] = {
    "lowest": lambda c: c.replicas[0],
    "balanced": lambda c: c.replicas[c.consumer_index % len(c.replicas)],
}
"""The spec's named policies as rules [PLAN-4]."""


@dataclass(frozen=True)
class Edge:
    """One sender-to-receiver transfer of a request's KV [PLAN-2, SLICE-1, PLAN-5].

    ``src`` and ``dst`` are stage-local ranks; ``heads`` and ``layers`` are global
    ids. ``offset_in_shard`` / ``num_slices`` locate ``heads`` in the sender's shard.
    """

    src: int
    dst: int
    heads: range
    layers: range
    offset_in_shard: int
    num_slices: int
    bytes_per_token: int

    def nbytes(self, seq_len: int, *, slicing: str = "sender") -> int:
        """Bytes this edge moves for a request of ``seq_len`` tokens [PLAN-5]."""
        require_int("seq_len", seq_len, minimum=0)
        require_choice("slicing", slicing, ("sender", "receiver"))
        scale = self.num_slices if slicing == "receiver" else 1
        return self.bytes_per_token * seq_len * scale

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (ranges as ``[start, stop)`` pairs)."""
        return {
            "src": self.src,
            "dst": self.dst,
            "heads": [self.heads.start, self.heads.stop],
            "layers": [self.layers.start, self.layers.stop],
            "offset_in_shard": self.offset_in_shard,
            "num_slices": self.num_slices,
            "bytes_per_token": self.bytes_per_token,
        }


@dataclass(frozen=True)
class TransferPlan:
    """Every edge of a transfer from ``source`` to ``target`` for ``model`` [PLAN-1..5]."""

    source: StageLayout
    target: StageLayout
    model: ModelShape
    policy: str
    edges: tuple[Edge, ...]

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

    def nbytes(self, seq_len: int, *, slicing: str = "sender") -> int:
        """Bytes all edges move for one request of ``seq_len`` tokens [PLAN-5]."""
        return sum(e.nbytes(seq_len, slicing=slicing) for e in self.edges)

    def minimum_nbytes(self, seq_len: int) -> int:
        """Bytes every receiver must get at least: all it owns, once [PLAN-2]."""
        per_head_layer = self.model.bytes_per_token_per_head_layer * seq_len
        return sum(
            len(r.heads) * len(r.layers) * per_head_layer
            for r in stage_ownership(self.target, self.model)
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form of the plan, for JSON output and golden vectors."""
        return {
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy,
            "edges": [e.to_dict() for e in self.edges],
        }


def check_tp_pair(source_tp: int, target_tp: int) -> None:
    """Refuse TP sizes that do not divide one another [PLAN-1]."""
    require_int("source tp", source_tp, minimum=1)
    require_int("target tp", target_tp, minimum=1)
    if source_tp % target_tp and target_tp % source_tp:
        raise ValueError(
            f"source TP {source_tp} and target TP {target_tp} do not divide one another "
            f"({source_tp} % {target_tp} = {source_tp % target_tp}, "
            f"{target_tp} % {source_tp} = {target_tp % source_tp}); one TP size must be a "
            f"multiple of the other so every edge is an equal slice of a sender's heads [PLAN-1]"
        )


def check_plannable(source_tp: int, target_tp: int, num_kv_heads: int) -> None:
    """Refuse a TP pair [PLAN-1] or head count [HEAD-1, HEAD-2] that cannot be planned.

    Every broken rule is reported in one error, not only the first.
    """
    problems = []
    for check, args in (
        (check_tp_pair, (source_tp, target_tp)),
        (check_heads, (num_kv_heads, source_tp)),
        (check_heads, (num_kv_heads, target_tp)),
    ):
        try:
            check(*args)
        except ValueError as error:
            if str(error) not in problems:
                problems.append(str(error))
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(f"{len(problems)} problems:\n  " + "\n  ".join(problems))


def plan_transfer(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    *,
    policy: str = "lowest",
    rule: ReplicaRule | None = None,
) -> TransferPlan:
    """The transfer plan from ``source`` to ``target`` for ``model`` [PLAN-1..5].

    ``policy`` names one of :data:`POLICIES`, or, with ``rule``, a policy of one's own:
    the rule picks the sending TP rank of each replicated head and must return one of
    the replicas it is shown [PLAN-4]. Every policy gives a plan that satisfies PLAN-2
    and PLAN-3.

    Both stages must run the same model; check that first with
    :func:`kvspec.topology.model.check_compatible` when each stage has its own description.
    """
    if rule is None:
        require_choice("policy", policy, POLICIES)
        rule = SPEC_RULES[policy]
    elif not isinstance(policy, str) or not policy:
        raise ValueError(f"a policy given as a rule needs a name, got {policy!r} [PLAN-4]")
    check_plannable(source.tp, target.tp, model.num_kv_heads)
    senders = stage_ownership(source, model)
    receivers = stage_ownership(target, model)
    sender_at = {(s.pp_rank, s.tp_rank): s for s in senders}
    source_pp_layers = [senders[p * source.tp].layers for p in range(source.pp)]
    consumer_index = _consumer_index(receivers, source_pp_layers)

    edges = []
    for receiver in receivers:
        for pp_rank, stage_layers in enumerate(source_pp_layers):
            layers = _intersect(stage_layers, receiver.layers)
            if not layers:
                continue
            # The source TP rank chosen to send each of this receiver's heads.
            chosen = {
                _choose(
                    policy,
                    rule,
                    ReplicaChoice(
                        head=head,
                        replicas=head_replicas(model.num_kv_heads, source.tp, head),
                        consumer_index=consumer_index[(pp_rank, head)][receiver.rank],
                        receiver_rank=receiver.rank,
                        receiver_tp_rank=receiver.tp_rank,
                        source_pp_rank=pp_rank,
                    ),
                )
                for head in receiver.heads
            }
            edges.extend(
                edge_between(sender_at[(pp_rank, tp_rank)], receiver, model)
                for tp_rank in sorted(chosen)
            )
    edges.sort(key=lambda e: (e.src, e.dst))
    return TransferPlan(source, target, model, policy, tuple(edges))


def _choose(policy: str, rule: ReplicaRule, choice: ReplicaChoice) -> int:
    """The source TP rank that sends ``choice.head`` to its receiver; refused unless it is
    one of the head's replicas [PLAN-4]."""
    chosen = rule(choice)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or chosen not in choice.replicas:
        raise ValueError(
            f"policy {policy!r} chose source TP rank {chosen!r} for head {choice.head} of "
            f"target rank {choice.receiver_rank}, but only TP ranks "
            f"{choice.replicas.start}..{choice.replicas.stop - 1} hold it [PLAN-4]"
        )
    return chosen


def _consumer_index(
    receivers: tuple[RankOwnership, ...], source_pp_layers: list[range]
) -> dict[tuple[int, int], dict[int, int]]:
    """For each (source PP rank, head): receiver rank -> its index among that head's consumers."""
    index: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    for receiver in receivers:  # ascending rank order
        for pp_rank, stage_layers in enumerate(source_pp_layers):
            if _intersect(stage_layers, receiver.layers):
                for head in receiver.heads:
                    consumers = index[(pp_rank, head)]
                    consumers[receiver.rank] = len(consumers)
    return index


def edge_between(sender: RankOwnership, receiver: RankOwnership, model: ModelShape) -> Edge:
    """The edge from ``sender`` to ``receiver``: every head and layer both own [PLAN-2, SLICE-1].

    When a sender is chosen for some of a receiver's heads it is chosen for all the
    heads they share (a sender holds one head when heads are replicated [HEAD-2]), so
    the edge is the intersection of the two ranks' ownership. Refuses ranks that share
    nothing.
    """
    heads = _intersect(sender.heads, receiver.heads)
    layers = _intersect(sender.layers, receiver.layers)
    if not heads or not layers:
        raise ValueError(
            f"source rank {sender.rank} (heads {_span(sender.heads)}, layers "
            f"{_span(sender.layers)}) shares nothing with target rank {receiver.rank} (heads "
            f"{_span(receiver.heads)}, layers {_span(receiver.layers)}) [PLAN-2]"
        )
    num_slices, remainder = divmod(len(sender.heads), len(heads))
    offset, misaligned = divmod(heads.start - sender.heads.start, len(heads))
    if remainder or misaligned:
        raise ValueError(
            f"heads {_span(heads)} are not an equal slice of source rank {sender.rank}'s heads "
            f"{_span(sender.heads)}; the two TP sizes must divide one another [PLAN-1, SLICE-1]"
        )
    return Edge(
        src=sender.rank,
        dst=receiver.rank,
        heads=heads,
        layers=layers,
        offset_in_shard=offset,
        num_slices=num_slices,
        bytes_per_token=len(heads) * len(layers) * model.bytes_per_token_per_head_layer,
    )


def _span(r: range) -> str:
    return f"{r.start}..{r.stop - 1}"


def _intersect(a: range, b: range) -> range:
    return range(max(a.start, b.start), min(a.stop, b.stop))
