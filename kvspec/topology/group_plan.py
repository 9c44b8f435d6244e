"""Plans of hybrid models, layer group by layer group, and the bytes each edge moves per
group [GROUP-3, PLAN-5].

A per-token group (full attention, sliding window, chunked, draft) is planned as a uniform
model of its own heads and head_dim over the two layouts [PLAN-1..6], an MLA group's
sparse indexer riding with its latent [INDEX-1], keeping on each edge
only the group's layers and, for a sliding window or a chunked local-attention layer,
the tokens its receiver needs [WINDOW-1, LOCAL-1]. A
state group is planned by its reads [STATE-2]. Each group keeps its own head count,
never the target's back-computed from a rank's local heads (vllm-ascend#11885, #11886;
field/research/hybrids.md §6).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import itemsize
from kvspec.core.require import require_int
from kvspec.topology.groups import FullAttention, StateGroup
from kvspec.topology.indexer import index_entry_bytes
from kvspec.topology.model import Attention, ModelShape
from kvspec.topology.plan import ReplicaRule, plan_transfer, replica_rule
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import StateRead, part_itemsize, plan_state_reads
from kvspec.topology.tokens import Tokens
from kvspec.topology.windows import receiver_tokens

CLAUSES = (
    Clause(
        "GROUP-3",
        "Bytes of an edge, per layer group",
        "A hybrid transfer is planned group by group. An edge of a per-token group moves "
        "h x l x T x head_dim x itemsize x k bytes [PLAN-5] with the group's own h and "
        "head_dim, l the edge's layers of that group and T its tokens of the group (a "
        "sliding window's [WINDOW-1], a chunked layer's [LOCAL-1]). An edge of a state group "
        "moves the sum of its reads' "
        "lengths times the state's itemsize [STATE-2], the same for every request length. A "
        "layout that cannot hold one group's heads or state units is refused, naming the "
        "group.",
        obligations=(
            must("a per-token group's edge moves h x l x T x head_dim x itemsize x k bytes"),
            must("a state group's edge moves its reads' bytes, the same for every request length"),
            refuses("a layout that cannot hold one group's heads, while it holds the others'"),
        ),
    ),
)


@dataclass(frozen=True)
class GroupEdge:
    """What one sender sends one receiver of one layer group [GROUP-3].

    ``heads`` and ``tokens`` are for per-token groups (``tokens`` None: every token);
    ``reads`` for state groups [STATE-2].
    """

    group: int
    src: int
    dst: int
    layers: tuple[int, ...]
    nbytes: int
    heads: range | None = None
    tokens: Tokens | None = None
    reads: tuple[StateRead, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "group": self.group,
            "src": self.src,
            "dst": self.dst,
            "layers": list(self.layers),
            "nbytes": self.nbytes,
        }
        if self.heads is not None:
            data["heads"] = [self.heads.start, self.heads.stop]
        if self.tokens is not None:
            data["tokens"] = self.tokens.to_list()
        if self.reads:
            data["reads"] = len(self.reads)
        return data


@dataclass(frozen=True)
class GroupPlan:
    """Every edge of every layer group of one request's transfer [GROUP-3]."""

    source: StageLayout
    target: StageLayout
    model: ModelShape
    policy: str
    seq_len: int
    block_size: int
    edges: tuple[GroupEdge, ...]
    source_block_size: int | None = None
    """The sender's block size [WINDOW-2]; None: ``block_size``, one for both."""

    @property
    def sender_block_size(self) -> int:
        """The block size the sender's windows are aligned to [WINDOW-2]."""
        return self.block_size if self.source_block_size is None else self.source_block_size

    @property
    def receiver_block_size(self) -> int:
        """The block size the receiver's windows are aligned to: ``block_size`` [WINDOW-2]."""
        return self.block_size

    def nbytes(self) -> int:
        """Bytes every edge of every group moves."""
        return sum(e.nbytes for e in self.edges)

    def bytes_by_group(self) -> dict[int, int]:
        """Bytes each group moves, every group listed (0 for one that moves nothing)."""
        totals = dict.fromkeys(range(len(self.model.layer_groups)), 0)
        for e in self.edges:
            totals[e.group] += e.nbytes
        return totals

    def bytes_per_edge(self) -> dict[tuple[int, int, int], int]:
        """(group, src, dst) -> bytes [GROUP-3]."""
        return {(e.group, e.src, e.dst): e.nbytes for e in self.edges}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy,
            "seq_len": self.seq_len,
            "block_size": self.block_size,
            **(
                {"source_block_size": self.source_block_size}
                if self.source_block_size not in (None, self.block_size)
                else {}
            ),
            "bytes_by_group": {str(g): n for g, n in self.bytes_by_group().items()},
            "edges": [e.to_dict() for e in self.edges],
        }


def group_view(model: ModelShape, group: FullAttention) -> ModelShape:
    """A per-token group as a uniform model of all the model's layers [GROUP-3]."""
    return ModelShape(
        model.num_layers,
        group.num_kv_heads,
        group.head_dim,
        cast(Attention, group.attention),  # __post_init__ allows only 'mha' and 'mla'
        model.dtype,
        model.scale_format,
    )


def plan_groups(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    *,
    seq_len: int,
    block_size: int = 16,
    policy: str = "lowest",
    rule: ReplicaRule | None = None,
    source_dp: int = 0,
    target_dp: int = 0,
    source_block_size: int | None = None,
    target_block_size: int | None = None,
) -> GroupPlan:
    """The plan of every layer group of one ``seq_len``-token request [GROUP-3, WINDOW-1,
    LOCAL-1, STATE-2]; ``block_size`` aligns sliding windows and chunks.

    ``source_block_size`` and ``target_block_size`` (each ``block_size`` when None) give
    the two stages their own: a window or chunk edge carries the receiver's tokens,
    aligned to its blocks, and a plan whose receiver needs tokens the sender has evicted
    is refused [WINDOW-2]; a hybrid's block size per TP is
    :func:`kvspec.topology.block_size.hybrid_block_size` [BLOCK-1].

    ``policy`` and ``rule`` choose every group's replicas as :func:`plan_transfer` does
    [PLAN-4]: a per-token group's heads and a state group's units alike, so a declared
    rule (an engine's, :mod:`kvspec.topology.field_policies`) reaches every group.
    """
    rule = replica_rule(policy, rule)
    require_int("seq_len", seq_len, minimum=0)
    require_int("block_size", block_size, minimum=1)
    sender = block_size if source_block_size is None else source_block_size
    block_size = block_size if target_block_size is None else target_block_size
    require_int("source_block_size", sender, minimum=1)
    require_int("target_block_size", block_size, minimum=1)
    edges: list[GroupEdge] = []
    for index, group in enumerate(model.layer_groups):
        try:
            if isinstance(group, FullAttention):
                edges.extend(
                    _token_edges(
                        source,
                        target,
                        model,
                        index,
                        group,
                        seq_len,
                        (sender, block_size),
                        (policy, rule),
                        source_dp,
                        target_dp,
                    )
                )
            else:
                edges.extend(
                    _state_edges(
                        source, target, model, index, group, (policy, rule), source_dp, target_dp
                    )
                )
        except ValueError as error:
            raise ValueError(
                f"layer group {index} ({group.describe()}): {error} [GROUP-3]"
            ) from None
    edges.sort(key=lambda e: (e.group, e.src, e.dst))
    return GroupPlan(
        source,
        target,
        model,
        policy,
        seq_len,
        block_size,
        tuple(edges),
        None if sender == block_size else sender,
    )


def _token_edges(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    index: int,
    group: FullAttention,
    seq_len: int,
    blocks: tuple[int, int],
    replicas: tuple[str, ReplicaRule],
    source_dp: int,
    target_dp: int,
) -> list[GroupEdge]:
    view = group_view(model, group)
    policy, rule = replicas
    plan = plan_transfer(
        source,
        target,
        view,
        policy=policy,
        rule=rule,
        seq_len=seq_len,
        source_dp=source_dp,
        target_dp=target_dp,
    )
    mine = set(model.group_layers(index))
    # The receiver's window, which the sender must still hold [WINDOW-1, LOCAL-1, WINDOW-2].
    window = receiver_tokens(
        group, seq_len, source_block_size=blocks[0], target_block_size=blocks[1]
    )
    edges = []
    for edge in plan.edges:
        layers = tuple(layer for layer in edge.layers if layer in mine)
        tokens = edge.tokens
        if window is not None:
            tokens = window if tokens is None else tokens.intersect(window)
        count = seq_len if tokens is None else len(tokens)
        if not layers or count == 0:
            continue
        per_cell = group.kv_tensors * group.head_dim * itemsize(model.dtype)
        # The indexer has no head axis: each receiver gets every token's whole entry with
        # its latent, from the same sender [INDEX-1].
        indexer = index_entry_bytes(group.index_head_dim) if group.index_head_dim else 0
        edges.append(
            GroupEdge(
                index,
                edge.src,
                edge.dst,
                layers,
                len(edge.heads) * len(layers) * count * per_cell + len(layers) * count * indexer,
                heads=edge.heads,
                tokens=tokens,
            )
        )
    return edges


def _state_edges(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    index: int,
    group: StateGroup,
    replicas: tuple[str, ReplicaRule],
    source_dp: int,
    target_dp: int,
) -> list[GroupEdge]:
    policy, rule = replicas
    reads = plan_state_reads(
        source,
        target,
        model,
        index,
        policy=policy,
        rule=rule,
        source_dp=source_dp,
        target_dp=target_dp,
    )
    by_pair: dict[tuple[int, int], list[StateRead]] = defaultdict(list)
    for read in reads:
        by_pair[(read.src, read.dst)].append(read)
    return [
        GroupEdge(
            index,
            src,
            dst,
            tuple(sorted({r.layer for r in pair})),
            sum(r.length * part_itemsize(group, r.part, model) for r in pair),
            reads=tuple(pair),
        )
        for (src, dst), pair in sorted(by_pair.items())
    ]
