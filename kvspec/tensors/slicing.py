"""The head slice of an edge and the marker that keeps it from being applied twice.

Because the two stages' TP sizes divide one another [PLAN-1], the heads an edge
carries are always one of ``num_slices`` equal slices of the sender's head shard
[SLICE-1]. The slice can be cut by the sender (sender-side slicing: only the slice
travels) or by the receiver (receiver-side slicing: the whole shard travels and the
receiver cuts); the two give identical bits [SLICE-2]. The payload carries a
``tp_head_slice`` marker saying which slice, for which rank, and whether it has been
applied, so that it is applied exactly once [SLICE-3].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, replace
from typing import Any, Literal

import torch

from kvspec._checks import require_choice, require_int, show
from kvspec.clause import Clause, must, refuses

CLAUSES = (
    Clause(
        "SLICE-1",
        "An edge carries an equal slice of the sender's heads",
        "The heads on edge s->t are slice offset_in_shard of num_slices equal slices of "
        "sender s's head shard: heads [offset*n/num_slices, (offset+1)*n/num_slices) of its "
        "n heads, in the sender's head order. num_slices = 1 means the whole shard.",
        obligations=(
            must(
                "sender-side, edge s->t carries slice offset_in_shard of num_slices equal slices "
                "of the sender's heads, in order"
            ),
            must("an edge carries exactly its layers, not the sender's whole layer range"),
        ),
    ),
    Clause(
        "SLICE-2",
        "Sender-side and receiver-side slicing agree",
        "Under sender-side slicing the sender sends exactly the edge's slice; under "
        "receiver-side slicing it sends its whole head shard for the edge's layers and the "
        "receiver cuts the slice. Both give bit-identical receiver shards.",
        obligations=(
            must("receiver-side, the sender sends its whole head shard for the edge's layers"),
            must("sender-side and receiver-side slicing give bit-identical receiver shards"),
        ),
    ),
    Clause(
        "SLICE-3",
        "A slice is applied exactly once, by its addressee",
        "Every payload carries a tp_head_slice marker (applied, side, target_rank, from_tp, "
        "to_tp, offset_in_shard, num_slices). A receiver applies an unapplied slice and marks "
        "it applied by the receiver; an applied slice is never cut again. A payload whose "
        "target_rank is another rank is refused.",
        obligations=(
            must(
                "an unapplied slice is cut once, at its marker's offset, and marked applied by the "
                "receiver"
            ),
            must(
                "an applied slice, whether the sender or the receiver applied it, is never cut "
                "again"
            ),
            refuses("a payload whose marker names another target rank, applied or not"),
        ),
    ),
)

Side = Literal["sender", "receiver"]
SIDES: tuple[str, ...] = ("sender", "receiver")


@dataclass(frozen=True)
class HeadSlice:
    """The ``tp_head_slice`` marker of one payload [SLICE-1, SLICE-3].

    ``side`` says who applied the slice (``None`` while it is not applied yet);
    ``target_rank`` is the receiver's stage-local rank.
    """

    target_rank: int
    from_tp: int
    to_tp: int
    offset_in_shard: int
    num_slices: int
    applied: bool = False
    side: Side | None = None

    def __post_init__(self) -> None:
        require_int("target_rank", self.target_rank, minimum=0)
        require_int("from_tp", self.from_tp, minimum=1)
        require_int("to_tp", self.to_tp, minimum=1)
        require_int("num_slices", self.num_slices, minimum=1)
        require_int("offset_in_shard", self.offset_in_shard, minimum=0)
        if self.offset_in_shard >= self.num_slices:
            raise ValueError(
                f"offset_in_shard must be in 0..{self.num_slices - 1} (num_slices="
                f"{self.num_slices}), got {self.offset_in_shard} [SLICE-1]"
            )
        if not isinstance(self.applied, bool):
            raise ValueError(f"applied must be a bool, got {show(self.applied)}")
        if self.applied:
            require_choice("side", self.side, SIDES)
        elif self.side is not None:
            raise ValueError(f"an unapplied slice has side=None, got side={show(self.side)}")

    def to_dict(self) -> dict[str, Any]:
        """The compatible ``metadata['tp_head_slice']`` dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HeadSlice:
        """Parse a ``tp_head_slice`` dict; unknown or missing keys are refused."""
        if not isinstance(data, Mapping):
            raise ValueError(f"tp_head_slice must be a dict, got {show(data)} [SLICE-3]")
        expected = set(cls.__dataclass_fields__)
        required = [n for n, f in cls.__dataclass_fields__.items() if f.default is MISSING]
        keys = set(data)
        if keys - expected or not set(required) <= keys:
            unknown = ", ".join(sorted(show(k, 30) for k in list(keys - expected)[:8]))
            raise ValueError(
                f"tp_head_slice keys must be drawn from {sorted(expected)} and include "
                f"{', '.join(required)}; got unknown keys [{unknown}], missing "
                f"{[n for n in required if n not in keys]} [SLICE-3]"
            )
        return cls(**data)


def slice_heads(
    tensor: torch.Tensor, offset_in_shard: int, num_slices: int, *, head_axis: int
) -> torch.Tensor:
    """Slice ``offset_in_shard`` of ``num_slices`` equal slices of the head axis [SLICE-1].

    Returns a view; the head count must be divisible by ``num_slices``.
    """
    heads = tensor.shape[head_axis]
    if heads % num_slices != 0:
        raise ValueError(
            f"cannot cut {num_slices} equal slices from {heads} heads "
            f"(shape {tuple(tensor.shape)}, head axis {head_axis}) [SLICE-1]"
        )
    if not 0 <= offset_in_shard < num_slices:
        raise ValueError(f"offset_in_shard must be in 0..{num_slices - 1}, got {offset_in_shard}")
    width = heads // num_slices
    return tensor.narrow(head_axis, offset_in_shard * width, width)


def apply_head_slice(
    tensor: torch.Tensor, marker: HeadSlice, *, my_rank: int, head_axis: int
) -> tuple[torch.Tensor, HeadSlice]:
    """Receiver side of [SLICE-3]: cut the slice once, refuse a payload for another rank.

    An already-applied marker returns ``tensor`` unchanged, so calling this twice is the
    same as calling it once.
    """
    if marker.target_rank != my_rank:
        raise ValueError(
            f"payload is marked for target rank {marker.target_rank} but arrived at rank "
            f"{my_rank}; refusing it [SLICE-3]"
        )
    if marker.applied:
        return tensor, marker
    sliced = slice_heads(tensor, marker.offset_in_shard, marker.num_slices, head_axis=head_axis)
    return sliced, replace(marker, applied=True, side="receiver")
