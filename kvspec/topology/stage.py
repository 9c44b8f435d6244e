"""Stage layouts: how many TP and PP ranks a stage runs, and how they are numbered.

A stage runs the model on ``tp`` tensor-parallel ranks in each of ``pp`` pipeline
stages [STAGE-1]. Which heads and layers each rank owns is in
:mod:`kvspec.topology.ownership`; this module only fixes the ranks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec._checks import require_int, require_rank
from kvspec.clause import Clause, must, refuses

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
)


@dataclass(frozen=True)
class StageLayout:
    """The parallel layout of one stage [STAGE-1].

    ``layer_partition``, when given, is the number of layers each pipeline stage
    holds (one entry per PP rank, first to last); otherwise the default rule of
    [LAYER-1] applies. It is checked against a model's layer count by
    :func:`kvspec.topology.ownership.layer_ranges`.
    """

    tp: int = 1
    pp: int = 1
    layer_partition: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        require_int("tp", self.tp, minimum=1)
        require_int("pp", self.pp, minimum=1)
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

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form: ``{"tp", "pp", "layer_partition"}``."""
        partition = None if self.layer_partition is None else list(self.layer_partition)
        return {"tp": self.tp, "pp": self.pp, "layer_partition": partition}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageLayout:
        """Inverse of :meth:`to_dict`; ``pp`` and ``layer_partition`` may be omitted."""
        partition = data.get("layer_partition")
        return cls(data["tp"], data.get("pp", 1), None if partition is None else tuple(partition))

    def describe(self) -> str:
        """Short human form, e.g. ``TP8`` or ``PP2xTP2``."""
        base = f"TP{self.tp}" if self.pp == 1 else f"PP{self.pp}xTP{self.tp}"
        if self.layer_partition is not None:
            base += f" layers={list(self.layer_partition)}"
        return base
