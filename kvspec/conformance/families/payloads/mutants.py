"""Mutants of merging senders' payloads into one receiver shard [PAYLOAD-2, PAYLOAD-3].

Each merges agreeing, well-formed payloads correctly; it only smooths over one kind of
disagreement — normalising, casting or borrowing from the first shard — instead of
refusing it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import torch_dtype
from kvspec.transport.payload import CACHE_FIELDS, SCALE_FIELDS, TENSOR_FIELDS, Payload

Received = list[tuple[int, Payload]]


def _resized(payload: Payload, num_layers: int) -> Payload:
    """The payload's layer lists cut or padded (with None) to ``num_layers``."""

    def fit(values):
        if values is None:
            return None
        values = tuple(values[:num_layers])
        return values + (None,) * (num_layers - len(values))

    return replace(payload, **{name: fit(getattr(payload, name)) for name in TENSOR_FIELDS})


def _lowest(received: Received) -> Payload:
    return min(received, key=lambda pair: pair[0])[1]


@mutant("PAYLOAD-2.1")
class NumLayersNotComparedWithModel(ReferenceAdapter):
    """Reads as many layers as the model has, whatever num_layers the payloads state."""

    def merge(self, case, dst, received):
        n = case.model.num_layers
        return super().merge(case, dst, [(s, _resized(p, n)) for s, p in received])


@mutant("PAYLOAD-2.2")
class DropsLayersOutsideEdge(ReferenceAdapter):
    """Keeps only the layers of each payload's edge and drops any other it carries."""

    def merge(self, case, dst, received):
        plan = self.plan(case)
        fixed = []
        for src, p in received:
            if src in plan.sources_of(dst):
                layers = set(plan.edge(src, dst).layers)
                p = replace(
                    p,
                    **{
                        name: tuple(t if i in layers else None for i, t in enumerate(values))
                        for name in TENSOR_FIELDS
                        if (values := getattr(p, name)) is not None
                    },
                )
            fixed.append((src, p))
        return super().merge(case, dst, fixed)


@mutant("PAYLOAD-3.1")
class MergedMarkerCopiedFromFirst(ReferenceAdapter):
    """Gives the merged payload the lowest source's tp_head_slice marker, unchanged."""

    def merge(self, case, dst, received):
        merged = super().merge(case, dst, received)
        return replace(merged, head_slice=_lowest(list(received)).head_slice)


@mutant("PAYLOAD-3.1")
class ShardsPlacedInArrivalOrder(ReferenceAdapter):
    """Places the k-th payload to arrive where the k-th source's shard goes."""

    def merge(self, case, dst, received):
        received = list(received)
        sources = sorted(s for s, _ in received)
        return super().merge(
            case, dst, [(s, p) for s, (_, p) in zip(sources, received, strict=True)]
        )


@mutant("PAYLOAD-3.2")
class MergesWithoutAgreement(ReferenceAdapter):
    """Merges shards of different requests, trusting the first one's request id."""

    def merge(self, case, dst, received):
        first = _lowest(list(received))
        same = [(src, replace(p, request_id=first.request_id)) for src, p in received]
        return super().merge(case, dst, same)


@mutant("PAYLOAD-3.3")
class MergeTruncatesSeqLen(ReferenceAdapter):
    """Merges the tokens every shard has: a shard a token short shortens the result."""

    def merge(self, case, dst, received):
        received = list(received)
        seq = min(p.seq_len for _, p in received)

        def cut(p: Payload) -> Payload:
            fields: dict[str, Any] = {
                name: tuple(None if t is None else t[:seq] for t in values)
                for name in CACHE_FIELDS
                if (values := getattr(p, name)) is not None
            }
            return replace(p, seq_len=seq, **fields)

        return super().merge(case, dst, [(s, cut(p)) for s, p in received])


@mutant("PAYLOAD-3.4")
class NumLayersFromLowestShard(ReferenceAdapter):
    """Takes num_layers from the lowest source's shard and fits the others' lists to it."""

    def merge(self, case, dst, received):
        received = list(received)
        n = _lowest(received).num_layers
        return super().merge(case, dst, [(s, _resized(p, n)) for s, p in received])


@mutant("PAYLOAD-3.5")
class DtypeFromLowestShard(ReferenceAdapter):
    """Reads every shard's bits as the lowest source's dtype when their sizes match."""

    def merge(self, case, dst, received):
        received = list(received)
        dtype = _lowest(received).dtype
        fixed = []
        for s, p in received:
            if p.dtype != dtype and torch_dtype(p.dtype).itemsize == torch_dtype(dtype).itemsize:
                fields = {
                    name: tuple(None if t is None else t.view(torch_dtype(dtype)) for t in values)
                    for name in CACHE_FIELDS
                    if (values := getattr(p, name)) is not None
                }
                p = replace(p, dtype=dtype, **fields)
            fixed.append((s, p))
        return super().merge(case, dst, fixed)


@mutant("PAYLOAD-3.6")
class BlockSizeNotCompared(ReferenceAdapter):
    """Never compares the shards' block sizes (the merged payload keeps the first's)."""

    def merge(self, case, dst, received):
        received = list(received)
        size = _lowest(received).block_size
        return super().merge(case, dst, [(s, replace(p, block_size=size)) for s, p in received])


@mutant("PAYLOAD-3.7")
class ChunkNotCompared(ReferenceAdapter):
    """Never compares the shards' chunk markers (the merged payload keeps the first's)."""

    def merge(self, case, dst, received):
        received = list(received)
        chunk = _lowest(received).chunk
        return super().merge(case, dst, [(s, replace(p, chunk=chunk)) for s, p in received])


def _missing_zero_filled(plan, dst, received) -> tuple[list, set[int]]:
    """The shards with each layer their edge carries but they lack filled with zeros (a
    preallocated receiver's buffer), and the layers so filled."""
    fixed, filled = [], set()
    for src, p in received:
        if src in plan.sources_of(dst):
            missing = [i for i in plan.edge(src, dst).layers if i not in p.layers]
            if missing and p.layers:
                first = p.layers[0]
                fields = {}
                for name in TENSOR_FIELDS:
                    values = getattr(p, name)
                    if values is None or values[first] is None:
                        continue
                    filler = (
                        values[first].clone()
                        if name in SCALE_FIELDS
                        else torch.zeros_like(values[first])
                    )
                    fields[name] = tuple(
                        filler if i in missing else t for i, t in enumerate(values)
                    )
                p = replace(p, **fields)
                filled.update(missing)
        fixed.append((src, p))
    return fixed, filled


@mutant("PAYLOAD-3.8")
class MissingLayerFilledWithZeros(ReferenceAdapter):
    """Fills a layer missing on one shard with zeros, as a receiver that preallocates does."""

    def merge(self, case, dst, received):
        fixed, _ = _missing_zero_filled(self.plan(case), dst, received)
        return super().merge(case, dst, fixed)


@mutant("PAYLOAD-3.8")
class LayerOneShardLacksDropped(ReferenceAdapter):
    """Merges the layers that arrived whole and leaves out a layer one shard lacks though
    another has it (the receiver keeps what every sender delivered), instead of refusing:
    the merged payload silently holds a shorter layer list (the clause: a layer present on
    one shard and missing on another that should carry it is refused)."""

    def merge(self, case, dst, received):
        fixed, filled = _missing_zero_filled(self.plan(case), dst, received)
        merged = super().merge(case, dst, fixed)
        if not filled:
            return merged
        return merged.with_layers(
            lambda values: tuple(None if i in filled else t for i, t in enumerate(values))
        )


@mutant("PAYLOAD-3.9")
class BlockIdsOfFirstArrival(ReferenceAdapter):
    """Gives the merged payload the block ids of the first shard to arrive."""

    def merge(self, case, dst, received):
        received = list(received)
        merged = super().merge(case, dst, received)
        return replace(merged, block_ids=received[0][1].block_ids)
