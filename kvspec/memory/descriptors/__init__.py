"""DESC: the exact byte ranges a pull connector posts to realise one edge of a transfer plan.

A pull connector (NIXL, Mooncake, SGLang's) never sees tensors: each rank registers
memory regions and the receiver posts *descriptors* ``(src region, src offset, dst
region, dst offset, length)`` against them. For one edge of a transfer plan
[PLAN-2], the two ranks' registered caches (layout, block size, heads and layers they
hold, the regions) and the request's block ids on each side, :func:`plan_descriptors`
gives the list that writes the receiver's share exactly once from the right bytes
[DESC-1], never leaves a registered region [DESC-2], coalesced into maximal runs so
that its count is the minimum for the layout pair [DESC-3]. :func:`judge_descriptors`
judges any other list by its effect — any list that writes the same bytes from the
same bytes passes — and reports its count against that minimum;
:func:`execute_descriptors` carries a list out on byte buffers.

This package is the DESC family's rules (:data:`CLAUSES`, below) and its public names,
each from the module of its concern:

- :mod:`~kvspec.memory.descriptors.registered`: a :class:`Descriptor`, and a rank's
  :class:`RegisteredCache` — its regions and the byte address of every field of every
  (layer, block, slot, head) in them [DESC-2, LAYOUT-5];
- :mod:`~kvspec.memory.descriptors.planning`: the spec's list for one edge, the share's
  tokens on both ranks (:func:`share_positions`), its bytes paired and coalesced into
  maximal runs (:func:`plan_descriptors`, :func:`plan_runs`) [DESC-1..3];
- :mod:`~kvspec.memory.descriptors.judging`: any list judged by its effect
  (:func:`judge_descriptors`) [DESC-1, DESC-2];
- :mod:`~kvspec.memory.descriptors.execution`: a list carried out on byte buffers
  (:func:`region_buffers`, :func:`execute_descriptors`).
"""

from __future__ import annotations

from kvspec.core.clause import Clause, must, refuses
from kvspec.memory.descriptors.execution import execute_descriptors, region_buffers
from kvspec.memory.descriptors.judging import DescriptorVerdict, judge_descriptors
from kvspec.memory.descriptors.planning import (
    DescriptorPlan,
    Runs,
    SharePositions,
    plan_descriptors,
    plan_runs,
    share_positions,
)
from kvspec.memory.descriptors.planning import _coalesce as _coalesce  # the DESC mutants' slips
from kvspec.memory.descriptors.registered import Descriptor, RegisteredCache

__all__ = [
    "CLAUSES",
    "Descriptor",
    "DescriptorPlan",
    "DescriptorVerdict",
    "RegisteredCache",
    "Runs",
    "SharePositions",
    "execute_descriptors",
    "judge_descriptors",
    "plan_descriptors",
    "plan_runs",
    "region_buffers",
    "share_positions",
]


CLAUSES = (
    Clause(
        "DESC-1",
        "A descriptor list writes the receiver's share exactly once",
        "For one edge of a transfer plan, a request's token range and both ranks' registered "
        "caches (their regions, layout, block size, the heads and layers each holds, and the "
        "request's block ids on each side), a descriptor (src region, src offset, dst region, "
        "dst offset, length) copies length bytes. A list realises the edge when every byte of "
        "the receiver's share — each field of each (layer, token, head) the edge carries, in "
        "the receiver's blocks — is written exactly once, from the sender's byte that holds "
        "the same (layer, token, head, field, byte), and no other byte of the receiver is "
        "written: not another request's block, not a slot past the range in a last block, not "
        "another head or layer. The two ranks' layouts, block sizes (larger or smaller, with a "
        "partial last block) and head counts may differ. Where a stage splits requests by "
        "tokens [CP-1], the edge carries the range's tokens that are in its token set "
        "[PLAN-6], and a rank's cache holds its own tokens in ascending order: each token "
        "lives at its position among that rank's tokens, not at its position in the request. "
        "A list is judged by this effect alone: any order and any granularity with the same "
        "effect is right.",
        obligations=(
            must(
                "every byte of the receiver's share is written from the sender's byte holding "
                "the same (layer, token, head, field, byte)"
            ),
            must("no byte of the receiver is written twice"),
            must(
                "no byte outside the receiver's share is written (other blocks, slots past the "
                "range, other heads or layers)"
            ),
            must(
                "the list is right when the two ranks' layouts, block sizes (either larger, with "
                "a partial last block) and head counts differ"
            ),
        ),
    ),
    Clause(
        "DESC-2",
        "Descriptors stay inside the registered regions",
        "Every range of a list lies inside its registered region on both sides: offset >= 0, "
        "length >= 1, offset + length <= the region's registered size. A request whose block "
        "ids need bytes past the end of a registered region (the region is smaller than the "
        "cache the layout describes, or the ids are wrong) is refused before any descriptor "
        "is produced, naming the ids, the bytes they need and the region's size: a range is "
        "never clipped, and never posted past the region.",
        obligations=(
            must("every range lies inside its registered region, on both sides"),
            refuses("block ids whose bytes lie past the end of a registered region"),
        ),
    ),
    Clause(
        "DESC-3",
        "The spec's list is minimal",
        "The spec's list coalesces the share into maximal runs: bytes that are consecutive in "
        "both the sender's and the receiver's region are one descriptor. No list with the same "
        "effect has fewer descriptors, so its count is the minimum for that layout pair, and "
        "a connector's count is reported against it. A connector that declares its lists "
        "coalesced is held to that minimum: no two of its ranges may be contiguous in both "
        "regions.",
        obligations=(
            must(
                "a list declared coalesced has no two ranges contiguous in both regions: its "
                "count is the minimum"
            ),
        ),
    ),
)
