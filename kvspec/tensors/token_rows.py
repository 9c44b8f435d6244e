"""A request's tokens taken from, and put into, a tensor along its token axis [CP-1,
PLAN-6]: a token set (:class:`~kvspec.topology.tokens.Tokens`) is arithmetic; this is
where it meets tensors, as a view when the set is one range and as one gather or
scatter of raw bits otherwise (every dtype, fp8 included, bit for bit [DTYPE-2])."""

from __future__ import annotations

import torch

from kvspec.tensors.dtypes import bits_view
from kvspec.topology.tokens import Tokens


def take_tokens(tensor: torch.Tensor, positions: Tokens, *, axis: int) -> torch.Tensor:
    """The entries of ``tensor`` at ``positions`` along ``axis``: a view when they are one
    range, a gathered copy otherwise."""
    if len(positions.ranges) == 1:
        r = positions.ranges[0]
        return tensor.narrow(axis, r.start, len(r))
    if not positions.ranges:
        return tensor.narrow(axis, 0, 0)
    index = torch.tensor(positions.tokens(), dtype=torch.long, device=tensor.device)
    # Gathered as raw bits: every dtype (fp8 included) on every device, bit for bit.
    return bits_view(tensor).index_select(axis, index).view(tensor.dtype)


def put_tokens(target: torch.Tensor, positions: Tokens, values: torch.Tensor, *, axis: int) -> None:
    """Write ``values`` into ``target`` at ``positions`` along ``axis``, in order."""
    if len(positions.ranges) == 1:
        r = positions.ranges[0]
        target.narrow(axis, r.start, len(r)).copy_(values)
        return
    if positions.ranges:
        index = torch.tensor(positions.tokens(), dtype=torch.long, device=target.device)
        bits_view(target).index_copy_(axis, index, bits_view(values.to(target.device)))
