"""The head slice of an edge and the marker that keeps it from being applied twice.

The heads an edge carries are a contiguous range of the sender's head shard: when the
two stages' TP sizes divide one another, one of ``num_slices`` equal slices; otherwise
(TP4 -> TP6) a range that no equal slice names [SLICE-1, PLAN-6]. The slice can be cut
by the sender (sender-side slicing: only the slice travels) or by the receiver
(receiver-side slicing: the whole shard travels and the receiver cuts); the two give
identical bits [SLICE-2]. The payload carries a ``tp_head_slice`` marker saying which
slice, for which rank, and whether it has been applied, so that it is applied exactly
once [SLICE-3]. The marker keeps the first release's form (``offset_in_shard``,
``num_slices``) wherever it applies; a range that is no equal slice is named by
``heads`` instead, and an edge between stages with token shards names its tokens
[SLICE-4].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.errors import FormError
from kvspec.core.forms import build
from kvspec.core.require import require_choice, require_int, show
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "SLICE-1",
        "An edge carries a slice of the sender's heads",
        "The heads on edge s->t are a contiguous range of sender s's head shard, in the "
        "sender's head order. When they are an equal slice, they are slice offset_in_shard "
        "of num_slices: heads [offset*n/num_slices, (offset+1)*n/num_slices) of its n heads "
        "(num_slices = 1: the whole shard), and the marker says so in these two fields. "
        "Otherwise the marker carries heads = [a, b), the range within the shard, and no "
        "offset_in_shard or num_slices, so a reader of the first release's form refuses it "
        "instead of misreading it.",
        obligations=(
            must(
                "sender-side, edge s->t carries slice offset_in_shard of num_slices equal slices "
                "of the sender's heads, in order"
            ),
            must("an edge carries exactly its layers, not the sender's whole layer range"),
            must(
                "when an edge's heads are no equal slice, its marker names them as heads [a, b) "
                "of the sender's shard, and sender and receiver cut exactly those"
            ),
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
    Clause(
        "SLICE-4",
        "A payload names the tokens it carries",
        "When either stage has token shards [CP-1], the marker of a payload carries tokens: "
        "the edge's token set as [start, stop) ranges of global token positions, ascending. "
        "Tokens are always cut by the sender; the payload's token axis holds exactly those "
        "tokens in ascending order, and the receiver places each at its position among its "
        "own tokens. A payload whose marker names other tokens than its edge's, or whose token "
        "count differs from them, is refused.",
        obligations=(
            must(
                "the receiver places a payload's tokens at their positions among its own "
                "tokens, by the marker's token ranges"
            ),
            refuses("a payload whose marker names other tokens than its edge carries"),
        ),
    ),
)

Side = Literal["sender", "receiver"]
SIDES: tuple[str, ...] = ("sender", "receiver")


@dataclass(frozen=True)
class HeadSlice:
    """The ``tp_head_slice`` marker of one payload [SLICE-1, SLICE-3, SLICE-4].

    ``side`` says who applied the slice (``None`` while it is not applied yet);
    ``target_rank`` is the receiver's stage-local rank. The heads are slice
    ``offset_in_shard`` of ``num_slices`` or, when no equal slice names them, ``heads``
    (``(start, stop)`` within the sender's shard) with the other two None [SLICE-1].
    ``tokens`` are the edge's token ranges when a stage has token shards [SLICE-4].
    """

    target_rank: int
    from_tp: int
    to_tp: int
    offset_in_shard: int | None
    num_slices: int | None
    applied: bool = False
    side: Side | None = None
    heads: tuple[int, int] | None = None
    tokens: Tokens | None = None

    def __post_init__(self) -> None:
        require_int("target_rank", self.target_rank, minimum=0)
        require_int("from_tp", self.from_tp, minimum=1)
        require_int("to_tp", self.to_tp, minimum=1)
        if self.heads is None:
            require_int("num_slices", self.num_slices, minimum=1)
            require_int("offset_in_shard", self.offset_in_shard, minimum=0)
            assert self.offset_in_shard is not None and self.num_slices is not None
            if self.offset_in_shard >= self.num_slices:
                raise ValueError(
                    f"offset_in_shard must be in 0..{self.num_slices - 1} (num_slices="
                    f"{self.num_slices}), got {self.offset_in_shard} [SLICE-1]"
                )
        else:
            if self.offset_in_shard is not None or self.num_slices is not None:
                raise ValueError(
                    "a marker names its heads either as offset_in_shard of num_slices or as "
                    f"heads [a, b), not both; got heads={show(self.heads)}, offset_in_shard="
                    f"{show(self.offset_in_shard)}, num_slices={show(self.num_slices)} [SLICE-1]"
                )
            if not isinstance(self.heads, list | tuple) or len(self.heads) != 2:
                raise ValueError(f"heads must be [start, stop], got {show(self.heads)} [SLICE-1]")
            start = require_int("heads start", self.heads[0], minimum=0)
            stop = require_int("heads stop", self.heads[1], minimum=start + 1)
            object.__setattr__(self, "heads", (start, stop))
        if self.tokens is not None and not isinstance(self.tokens, Tokens):
            object.__setattr__(self, "tokens", Tokens.from_list(self.tokens))
        if not isinstance(self.applied, bool):
            raise ValueError(f"applied must be a bool, got {show(self.applied)}")
        if self.applied:
            require_choice("side", self.side, SIDES)
        elif self.side is not None:
            raise ValueError(f"an unapplied slice has side=None, got side={show(self.side)}")

    def head_range(self, shard_heads: int) -> range:
        """The heads to keep of a shard of ``shard_heads`` heads, relative to the shard."""
        if self.heads is not None:
            start, stop = self.heads
        else:
            assert self.offset_in_shard is not None and self.num_slices is not None
            width = shard_heads // self.num_slices
            start, stop = self.offset_in_shard * width, (self.offset_in_shard + 1) * width
        return range(start, stop)

    def to_dict(self) -> dict[str, Any]:
        """The compatible ``metadata['tp_head_slice']`` dict: the first release's keys, with
        ``heads`` in place of the slice and ``tokens`` only where they apply."""
        data: dict[str, Any] = {
            "target_rank": self.target_rank,
            "from_tp": self.from_tp,
            "to_tp": self.to_tp,
        }
        if self.heads is None:
            data.update(offset_in_shard=self.offset_in_shard, num_slices=self.num_slices)
        data.update(applied=self.applied, side=self.side)
        if self.heads is not None:
            data["heads"] = list(self.heads)
        if self.tokens is not None:
            data["tokens"] = self.tokens.to_list()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HeadSlice:
        """Parse a ``tp_head_slice`` dict; unknown or missing keys are refused."""
        if not isinstance(data, Mapping):
            raise FormError(f"tp_head_slice must be a dict, got {show(data)} [SLICE-3]")
        expected = set(cls.__dataclass_fields__)
        keys = set(data)
        slice_keys = {"offset_in_shard", "num_slices"}
        required = {"target_rank", "from_tp", "to_tp"} | (set() if "heads" in keys else slice_keys)
        if keys - expected or not required <= keys or ("heads" in keys and keys & slice_keys):
            unknown = ", ".join(sorted(show(k, 30) for k in list(keys - expected)[:8]))
            raise FormError(
                f"tp_head_slice keys must be drawn from {sorted(expected)} and include "
                "target_rank, from_tp, to_tp, offset_in_shard, num_slices; got unknown keys "
                f"[{unknown}], missing {sorted(required - keys)} (a marker has "
                "either offset_in_shard and num_slices or heads [a, b), not both) [SLICE-3]"
            )
        values = dict(data)
        values.setdefault("offset_in_shard", None)
        values.setdefault("num_slices", None)
        if "tokens" in values and values["tokens"] is not None:
            values["tokens"] = Tokens.from_list(values["tokens"])
        return build(None, lambda: cls(**values))


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


def cut_heads(tensor: torch.Tensor, marker: HeadSlice, *, head_axis: int) -> torch.Tensor:
    """The marker's heads of a whole shard along ``head_axis``: its equal slice, or its
    ``heads`` range [SLICE-1]. Returns a view."""
    if marker.heads is None:
        assert marker.offset_in_shard is not None and marker.num_slices is not None
        return slice_heads(tensor, marker.offset_in_shard, marker.num_slices, head_axis=head_axis)
    start, stop = marker.heads
    if stop > tensor.shape[head_axis]:
        raise ValueError(
            f"cannot cut heads {start}..{stop - 1} from a shard of {tensor.shape[head_axis]} "
            f"heads (shape {tuple(tensor.shape)}, head axis {head_axis}) [SLICE-1]"
        )
    return tensor.narrow(head_axis, start, stop - start)


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
    return cut_heads(tensor, marker, head_axis=head_axis), replace(
        marker, applied=True, side="receiver"
    )
