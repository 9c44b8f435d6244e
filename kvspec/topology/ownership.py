"""Which rank owns which KV heads, which layers and which tokens.

Heads are split over the attention-TP ranks of a stage [HEAD-1, STAGE-2], or
replicated when there are fewer heads than ranks [HEAD-2]; MLA's latent is one head
held by every TP rank [HEAD-3]. Layers are split over the PP ranks in contiguous
partitions [LAYER-1, LAYER-2]. Tokens are split over the token shards by the stage's
rule [CP-1]; decode context parallelism gives the ranks that replicate a head
disjoint tokens [CP-3]. A request lives on one attention-DP group of each stage; the
ranks of the others hold nothing of it [DP-1]. :func:`rank_ownership` combines all of
it for one stage-local rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int, require_rank
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "HEAD-1",
        "Heads split over TP ranks",
        "With H total KV heads and tp ranks, H >= tp requires H % tp == 0; TP rank r owns "
        "the contiguous heads [r*H/tp, (r+1)*H/tp).",
        obligations=(
            must("with H >= tp, TP rank r owns the contiguous heads [r*H/tp, (r+1)*H/tp)"),
            refuses("H >= tp with H % tp != 0"),
        ),
    ),
    Clause(
        "HEAD-2",
        "Heads replicated when H < tp",
        "With H < tp, tp % H == 0 is required; TP rank r owns the single head r // (tp/H), "
        "so each head is replicated on tp/H consecutive ranks. Any (H, tp) that satisfies "
        "neither HEAD-1 nor HEAD-2 is refused with both numbers in the error.",
        obligations=(
            must("with H < tp, TP rank r owns the single head r // (tp/H)"),
            refuses("H < tp with tp % H != 0"),
        ),
    ),
    Clause(
        "HEAD-3",
        "MLA latent on every TP rank",
        "An MLA latent (one head, [MODEL-2]) is identical on every TP rank of a pipeline "
        "stage, i.e. HEAD-2 with H = 1; a receiver needs each layer of it from exactly one "
        "sender.",
        obligations=(
            must("every TP rank of a pipeline stage holds the whole MLA latent of its layers"),
            must("a receiver takes each layer of the latent from exactly one sender"),
        ),
    ),
    Clause(
        "LAYER-1",
        "Default layer partition",
        "With n layers over pp pipeline ranks (n >= pp is required), each partition gets "
        "n // pp layers and the remainder n % pp is added one layer each to partitions -2, "
        "-3, ... (counting from the end); the last partition never gets an extra layer. "
        "Partitions are contiguous and in order.",
        obligations=(
            must(
                "n // pp layers each, the remainder added one each to partitions -2, -3, ...; "
                "contiguous and in order"
            ),
            refuses("fewer layers than pipeline ranks"),
        ),
    ),
    Clause(
        "LAYER-2",
        "Explicit layer partition",
        "An explicit partition gives one positive layer count per PP rank; the counts must "
        "sum to num_layers. PP rank p owns the contiguous layers after those of ranks 0..p-1.",
        obligations=(
            must(
                "PP rank p owns the contiguous layers after those of ranks 0..p-1 of the explicit "
                "partition"
            ),
            refuses("an explicit partition whose counts do not sum to num_layers"),
            refuses("an explicit partition with a count below 1"),
            refuses("an explicit partition with another number of entries than pp"),
        ),
    ),
    Clause(
        "CP-3",
        "Decode context parallelism shares a head's tokens among its replicas",
        "With dcp > 1, dcp divides attn_tp and a rank's DCP rank is attn_tp_rank % dcp "
        "(consecutive attention-TP ranks form a DCP group) [vLLM 0.33 parallel_state, SGLang "
        "0.5.23 dcp_rank = tp_rank % dcp_size]. DCP needs every head held by at least dcp "
        "ranks: H * dcp <= attn_tp (MLA: H = 1) [vLLM 0.33 config/model.py]. A rank's token "
        "shard is cp_rank * dcp + dcp_rank of cp * dcp shards [CP-1], so the ranks of a DCP "
        "group that hold one head hold disjoint tokens, and a head's replicas together hold "
        "all its tokens. Anything else is refused with the values.",
        obligations=(
            must("a rank's token shard is cp_rank * dcp + dcp_rank, dcp_rank = attn_tp_rank % dcp"),
            must(
                "the ranks of a DCP group that hold a head hold disjoint tokens, and the head's "
                "replicas together hold all of them"
            ),
            refuses("dcp that does not divide the attention-TP size"),
            refuses("dcp greater than the ranks holding each head (H * dcp > attn_tp)"),
        ),
    ),
)


def check_heads(num_kv_heads: int, tp: int) -> None:
    """Refuse an (H, tp) pair that is neither split [HEAD-1] nor replicated [HEAD-2] evenly."""
    require_int("num_kv_heads", num_kv_heads, minimum=1)
    require_int("tp", tp, minimum=1)
    if num_kv_heads >= tp and num_kv_heads % tp != 0:
        raise ValueError(
            f"{num_kv_heads} KV heads cannot be split over TP {tp}: with heads >= tp, "
            f"heads % tp must be 0, but {num_kv_heads} % {tp} = {num_kv_heads % tp} [HEAD-1]"
        )
    if num_kv_heads < tp and tp % num_kv_heads != 0:
        raise ValueError(
            f"{num_kv_heads} KV heads cannot be replicated over TP {tp}: with heads < tp, "
            f"tp % heads must be 0, but {tp} % {num_kv_heads} = {tp % num_kv_heads} [HEAD-2]"
        )


def check_dcp(num_kv_heads: int, layout: StageLayout) -> None:
    """Refuse DCP that the heads cannot feed: each head needs dcp ranks [CP-3]."""
    if layout.dcp > 1 and num_kv_heads * layout.dcp > layout.attn_tp:
        held = max(1, layout.attn_tp // num_kv_heads)
        raise ValueError(
            f"dcp {layout.dcp} needs every KV head held by at least {layout.dcp} attention-TP "
            f"ranks, but {num_kv_heads} heads over attention-TP {layout.attn_tp} are held by "
            f"{held} rank(s) each (heads x dcp = {num_kv_heads * layout.dcp} > "
            f"{layout.attn_tp}); use dcp <= {held} [CP-3]"
        )


def check_layout(layout: StageLayout, model: ModelShape) -> None:
    """Refuse a layout that cannot hold the model's heads [HEAD-1, HEAD-2, STAGE-2, CP-3]."""
    check_heads(model.num_kv_heads, layout.attn_tp)
    check_dcp(model.num_kv_heads, layout)


def owned_heads(num_kv_heads: int, tp: int, tp_rank: int) -> range:
    """The global KV heads TP rank ``tp_rank`` holds [HEAD-1, HEAD-2, HEAD-3]."""
    check_heads(num_kv_heads, tp)
    require_rank("tp_rank", tp_rank, tp)
    if num_kv_heads >= tp:
        per_rank = num_kv_heads // tp
        return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
    head = tp_rank // (tp // num_kv_heads)
    return range(head, head + 1)


def head_replicas(num_kv_heads: int, tp: int, head: int) -> range:
    """The TP ranks that hold ``head``: one rank [HEAD-1] or tp/H consecutive ones [HEAD-2]."""
    check_heads(num_kv_heads, tp)
    require_rank("head", head, num_kv_heads)
    if num_kv_heads >= tp:
        rank = head // (num_kv_heads // tp)
        return range(rank, rank + 1)
    copies = tp // num_kv_heads
    return range(head * copies, (head + 1) * copies)


def default_layer_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per PP rank under the default rule [LAYER-1].

    >>> default_layer_partition(61, 2)
    (31, 30)
    >>> default_layer_partition(10, 4)
    (2, 3, 3, 2)
    """
    require_int("num_layers", num_layers, minimum=1)
    require_int("pp", pp, minimum=1)
    if num_layers < pp:
        raise ValueError(
            f"{num_layers} layers cannot be partitioned over PP {pp}: every pipeline rank "
            f"needs at least one layer, so num_layers must be >= pp [LAYER-1]"
        )
    counts = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        counts[-2 - i] += 1
    return tuple(counts)


def layer_partition(layout: StageLayout, num_layers: int) -> tuple[int, ...]:
    """Layers per PP rank: the layout's explicit partition [LAYER-2] or the default [LAYER-1]."""
    if layout.layer_partition is None:
        return default_layer_partition(num_layers, layout.pp)
    total = sum(layout.layer_partition)
    if total != num_layers:
        raise ValueError(
            f"layer_partition {list(layout.layer_partition)} covers {total} layers but the "
            f"model has num_layers={num_layers}; the counts must sum to {num_layers} [LAYER-2]"
        )
    return layout.layer_partition


def layer_ranges(layout: StageLayout, num_layers: int) -> tuple[range, ...]:
    """The contiguous layer range of each PP rank, in order [LAYER-1, LAYER-2]."""
    ranges = []
    start = 0
    for count in layer_partition(layout, num_layers):
        ranges.append(range(start, start + count))
        start += count
    return tuple(ranges)


@dataclass(frozen=True)
class RankOwnership:
    """What one stage-local rank holds of a request: its coordinates, heads, layers and
    tokens.

    ``tokens`` is None when the stage has no token shards (the rank holds every token)
    or when no request length was given. A rank of another attention-DP group than the
    request's holds nothing of it: ``active`` is False and its ranges are empty [DP-1].
    """

    rank: int
    pp_rank: int
    tp_rank: int
    heads: range
    layers: range
    tokens: Tokens | None = None
    dp_rank: int = 0
    active: bool = True

    def token_count(self, seq_len: int) -> int:
        """How many of a ``seq_len``-token request's tokens the rank holds."""
        return seq_len if self.tokens is None else len(self.tokens)


def rank_ownership(
    layout: StageLayout,
    model: ModelShape,
    rank: int,
    *,
    seq_len: int | None = None,
    dp_rank: int | None = None,
) -> RankOwnership:
    """What stage-local ``rank`` owns [STAGE-1, STAGE-2, HEAD-1..3, LAYER-1..2, CP-1, CP-3].

    With ``seq_len``, a stage with token shards gives the rank's tokens of a request
    that long; with ``dp_rank`` (the request's attention-DP group), a rank of another
    group owns nothing [DP-1].
    """
    where = layout.locate(rank)
    check_dcp(model.num_kv_heads, layout)
    if dp_rank is not None:
        require_rank("dp_rank", dp_rank, layout.dp)
        if where.dp_rank != dp_rank:
            return RankOwnership(
                rank,
                where.pp_rank,
                where.tp_rank,
                range(0),
                range(0),
                Tokens(),
                where.dp_rank,
                active=False,
            )
    tokens = None
    if seq_len is not None and layout.token_shards > 1:
        tokens = layout.rule.tokens(layout.token_shard(rank), layout.token_shards, seq_len)
    return RankOwnership(
        rank=rank,
        pp_rank=where.pp_rank,
        tp_rank=where.tp_rank,
        heads=owned_heads(model.num_kv_heads, layout.attn_tp, where.attn_tp_rank),
        layers=layer_ranges(layout, model.num_layers)[where.pp_rank],
        tokens=tokens,
        dp_rank=where.dp_rank,
    )


def stage_ownership(
    layout: StageLayout,
    model: ModelShape,
    *,
    seq_len: int | None = None,
    dp_rank: int | None = None,
) -> tuple[RankOwnership, ...]:
    """:func:`rank_ownership` for every rank of the stage, in rank order."""
    check_layout(layout, model)
    layer_ranges(layout, model.num_layers)  # validate once, before the per-rank loop
    if seq_len is not None:
        require_int("seq_len", seq_len, minimum=0)
        if layout.token_shards > 1:
            layout.rule.check_request(layout.token_shards, seq_len)
    return tuple(
        rank_ownership(layout, model, rank, seq_len=seq_len, dp_rank=dp_rank)
        for rank in layout.ranks()
    )
