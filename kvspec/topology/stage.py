"""Stage layouts: how many ranks a stage runs, how they are grouped, how they are numbered.

A stage runs the model on ``tp`` ranks in each of ``pp`` pipeline stages [STAGE-1].
Inside one pipeline stage the ``tp`` ranks may form ``dp`` attention data-parallel
groups of ``cp`` context-parallel groups of ``attn_tp = tp / (dp * cp)`` attention-TP
ranks, numbered as SGLang numbers them [STAGE-2]; ``dcp`` decode-context-parallel
ranks may further share each head's tokens [CP-3], and a named rule says which tokens
each token shard holds [CP-1]. Which heads, layers and tokens each rank owns is in
:mod:`kvspec.topology.ownership`; this module only fixes the ranks and their groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.forms import dataclass_form
from kvspec.core.require import require_int, require_rank
from kvspec.topology.tokens import CPRule

CLAUSES = (
    Clause(
        "STAGE-1",
        "Stage-local rank numbering",
        "A stage has tp >= 1 tensor-parallel and pp >= 1 pipeline-parallel ranks. Its "
        "stage-local rank is pp_rank * tp + tp_rank, so the ranks are 0..tp*pp-1. A rank, "
        "tp_rank or pp_rank outside its range is refused.",
        obligations=(
            must(
                "stage-local rank r holds what TP rank r % tp of PP rank r // tp holds (rank = "
                "pp_rank * tp + tp_rank)"
            ),
            refuses("a rank outside 0..tp*pp-1 (one past the end, or negative)"),
            refuses("a stage of tp < 1 or pp < 1"),
        ),
    ),
    Clause(
        "STAGE-2",
        "Attention groups inside a pipeline stage",
        "The tp ranks of a pipeline stage form dp >= 1 attention data-parallel groups, each "
        "of cp >= 1 context-parallel groups of attn_tp = tp / (dp * cp) attention-TP ranks: "
        "tp_rank = (dp_rank * cp + cp_rank) * attn_tp + attn_tp_rank, so the stage-local rank "
        "is pp_rank * tp + (dp_rank * cp + cp_rank) * attn_tp + attn_tp_rank [SGLang 0.5.23 "
        "runtime_context.derive_attention_ranks]. A rank holds the heads HEAD-1..3 give its "
        "attention-TP rank among attn_tp ranks. dp * cp must divide tp; anything else is "
        "refused with the values.",
        obligations=(
            must(
                "a rank's (dp_rank, cp_rank, attn_tp_rank) follow tp_rank = (dp_rank * cp + "
                "cp_rank) * attn_tp + attn_tp_rank"
            ),
            must("a rank holds the heads HEAD-1..3 give its attention-TP rank among attn_tp ranks"),
            refuses("dp * cp that does not divide tp"),
        ),
    ),
)


@dataclass(frozen=True)
class RankCoords:
    """Where a stage-local rank sits [STAGE-1, STAGE-2, CP-3]."""

    pp_rank: int
    tp_rank: int
    dp_rank: int
    cp_rank: int
    attn_tp_rank: int
    dcp_rank: int

    @property
    def coords(self) -> tuple[int, int]:
        return self.pp_rank, self.tp_rank


@dataclass(frozen=True)
class StageLayout:
    """The parallel layout of one stage [STAGE-1].

    ``layer_partition``, when given, is the number of layers each pipeline stage
    holds (one entry per PP rank, first to last); otherwise the default rule of
    [LAYER-1] applies. It is checked against a model's layer count by
    :func:`kvspec.topology.ownership.layer_ranges`.

    ``dp`` attention data-parallel groups of ``cp`` context-parallel groups share the
    ``tp`` ranks of a pipeline stage [STAGE-2]; ``dcp`` decode-context-parallel ranks
    share each head's tokens inside an attention-TP group [CP-3]; ``cp_rule`` names how
    tokens are split over the ``cp * dcp`` token shards [CP-1]. The defaults (all 1)
    are the first release's layout.
    """

    tp: int = 1
    pp: int = 1
    layer_partition: tuple[int, ...] | None = None
    cp: int = 1
    dcp: int = 1
    cp_rule: str = "contiguous"
    dp: int = 1

    def __post_init__(self) -> None:
        require_int("tp", self.tp, minimum=1)
        require_int("pp", self.pp, minimum=1)
        require_int("dp", self.dp, minimum=1)
        require_int("cp", self.cp, minimum=1)
        require_int("dcp", self.dcp, minimum=1)
        object.__setattr__(self, "cp_rule", str(CPRule.parse(self.cp_rule)))
        if self.tp % (self.dp * self.cp):
            raise ValueError(
                f"dp {self.dp} x cp {self.cp} = {self.dp * self.cp} does not divide tp {self.tp}: "
                f"the attention groups split each pipeline stage's {self.tp} ranks, so tp must "
                f"be a multiple of dp * cp [STAGE-2]"
            )
        if self.attn_tp % self.dcp:
            raise ValueError(
                f"dcp {self.dcp} does not divide the attention-TP size {self.attn_tp} "
                f"(tp {self.tp} / (dp {self.dp} x cp {self.cp})): decode context parallelism "
                "reuses attention-TP ranks [CP-3]"
            )
        if self.layer_partition is not None:
            partition = tuple(self.layer_partition)
            object.__setattr__(self, "layer_partition", partition)
            if len(partition) != self.pp:
                raise ValueError(
                    f"layer_partition {list(partition)} has {len(partition)} entries; "
                    f"it needs one per pipeline stage (pp={self.pp})"
                )
            for i, count in enumerate(partition):
                require_int(f"layer_partition[{i}]", count, minimum=1)

    @property
    def world_size(self) -> int:
        """Number of ranks in the stage: ``tp * pp``."""
        return self.tp * self.pp

    @property
    def attn_tp(self) -> int:
        """Attention-TP ranks per context-parallel group: ``tp / (dp * cp)`` [STAGE-2]."""
        return self.tp // (self.dp * self.cp)

    @property
    def token_shards(self) -> int:
        """Token shards: ``cp * dcp`` [CP-1, CP-3]; 1 without context parallelism."""
        return self.cp * self.dcp

    @property
    def rule(self) -> CPRule:
        """The token-distribution rule [CP-1]."""
        return CPRule.parse(self.cp_rule)

    @property
    def min_tokens(self) -> int:
        """The fewest tokens a request of this stage may have [CP-2]: its rule's minimum
        over its token shards (0 when any length splits)."""
        return self.rule.min_tokens(self.token_shards)

    def locate(self, rank: int) -> RankCoords:
        """Every coordinate of a stage-local rank [STAGE-1, STAGE-2, CP-3]."""
        pp_rank, tp_rank = self.coords(rank)
        group, attn_tp_rank = divmod(tp_rank, self.attn_tp)
        dp_rank, cp_rank = divmod(group, self.cp)
        return RankCoords(pp_rank, tp_rank, dp_rank, cp_rank, attn_tp_rank, attn_tp_rank % self.dcp)

    def token_shard(self, rank: int) -> int:
        """The token shard a rank holds: ``cp_rank * dcp + dcp_rank`` [CP-3]."""
        where = self.locate(rank)
        return where.cp_rank * self.dcp + where.dcp_rank

    def check_block_size(self, block_size: int) -> None:
        """Refuse a cache block size the stage's token rule cannot live in [CP-2]."""
        if self.token_shards > 1:
            self.rule.check_block_size(block_size)

    def dp_ranks(self, dp_rank: int) -> tuple[int, ...]:
        """The stage-local ranks of attention-DP group ``dp_rank``, ascending [STAGE-2]."""
        require_rank("dp_rank", dp_rank, self.dp)
        width = self.tp // self.dp
        return tuple(
            pp_rank * self.tp + dp_rank * width + i
            for pp_rank in range(self.pp)
            for i in range(width)
        )

    def ranks(self) -> range:
        """All stage-local ranks, ``0..tp*pp-1`` [STAGE-1]."""
        return range(self.world_size)

    def rank(self, pp_rank: int, tp_rank: int) -> int:
        """The stage-local rank of (pp_rank, tp_rank): ``pp_rank * tp + tp_rank`` [STAGE-1]."""
        require_rank("pp_rank", pp_rank, self.pp)
        require_rank("tp_rank", tp_rank, self.tp)
        return pp_rank * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int]:
        """``(pp_rank, tp_rank)`` of a stage-local rank [STAGE-1]."""
        require_rank("rank", rank, self.world_size)
        return divmod(rank, self.tp)

    @property
    def first_release(self) -> bool:
        """Whether the layout uses only the first release's axes (dp = cp = dcp = 1)."""
        return self.dp == 1 and self.cp == 1 and self.dcp == 1

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form: ``{"tp", "pp", "layer_partition"}``, plus ``dp``, ``cp``,
        ``dcp`` and ``cp_rule`` when the layout has attention groups or token shards."""
        partition = None if self.layer_partition is None else list(self.layer_partition)
        data: dict[str, Any] = {"tp": self.tp, "pp": self.pp, "layer_partition": partition}
        if self.dp != 1:
            data["dp"] = self.dp
        if self.token_shards > 1:
            data.update(cp=self.cp, dcp=self.dcp, cp_rule=self.cp_rule)
        return data

    @classmethod
    def from_dict(cls, data: object, *, where: str = "StageLayout") -> StageLayout:
        """Inverse of :meth:`to_dict`; every key but ``tp`` may be omitted, an unknown key
        or any other value is refused with :class:`~kvspec.core.errors.FormError`."""
        return dataclass_form(cls, data, where=where, required=("tp",), lists=("layer_partition",))

    def describe(self) -> str:
        """Short human form, e.g. ``TP8``, ``PP2xTP2`` or ``TP8 DP2 CP2 interleave:16``."""
        base = f"TP{self.tp}" if self.pp == 1 else f"PP{self.pp}xTP{self.tp}"
        if self.dp > 1:
            base += f" DP{self.dp}"
        if self.cp > 1:
            base += f" CP{self.cp}"
        if self.dcp > 1:
            base += f" DCP{self.dcp}"
        if self.token_shards > 1:
            base += f" {self.cp_rule}"
        if self.layer_partition is not None:
            base += f" layers={list(self.layer_partition)}"
        return base
