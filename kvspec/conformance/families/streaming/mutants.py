"""Mutants of layer-wise streaming [STREAM-1].

Each gets one thing wrong the way a connector's first streaming patch might: the pipeline
partition rule reused for groups, group keys that collide across chunks, parts placed by
the order they arrived in.
"""

from __future__ import annotations

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.naming.keys import rank_aware_key


@mutant("STREAM-1.1")
class LargerGroupsLast(ReferenceAdapter):
    """Gives the extra layers to the last groups (the larger last)."""

    def layer_groups(self, num_layers, groups):
        sizes = [len(r) for r in super().layer_groups(num_layers, groups)][::-1]
        out, start = [], 0
        for size in sizes:
            out.append(range(start, start + size))
            start += size
        return out


@mutant("STREAM-1.2")
class GroupKeysCollide(ReferenceAdapter):
    """Names group g of chunk c with chunk id c + g: group 1 of chunk 0 is group 0 of chunk 1."""

    def stream_key(self, request_id, from_stage, chunk_id, group, groups, from_rank, to_rank):
        return rank_aware_key(request_id, from_stage, chunk_id + group, from_rank, to_rank)


@mutant("STREAM-1.3")
class PartsPairedByArrival(ReferenceAdapter):
    """Takes the i-th part to arrive as the part of the i-th source in rank order."""

    def merge_layers(self, case, dst, group, received):
        sources = sorted(src for src, _ in received)
        relabelled = [(src, part) for src, (_, part) in zip(sources, received, strict=True)]
        return super().merge_layers(case, dst, group, relabelled)
