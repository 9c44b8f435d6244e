"""Mutants of reassembling a request's chunks [CHUNK-1, CHUNK-2].

Each reassembles a complete, agreeing set correctly and forgives one kind of wrong set
— by trusting the first chunk, filling, deduplicating or stopping early.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.transport.chunks import reassemble
from kvspec.transport.payload import CACHE_FIELDS, SCALE_FIELDS, Chunk, Payload


def _by_token(chunks) -> list[Payload]:
    return sorted(chunks, key=lambda p: (p.chunk.token_start, p.chunk.chunk_id))


@mutant("CHUNK-1.1")
class ChunkFactsFromFirst(ReferenceAdapter):
    """Takes request id, block size and tp_head_slice from the first chunk, comparing none."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        if not ordered:
            return super().reassemble(chunks)
        first = ordered[0]
        same = [
            replace(
                c,
                request_id=first.request_id,
                block_size=first.block_size,
                head_slice=first.head_slice,
            )
            for c in ordered
        ]
        return super().reassemble(same)


@mutant("CHUNK-1.2")
class MissingChunkLayerZeroFilled(ReferenceAdapter):
    """Fills a layer a chunk lacks (but the first chunk has) with zeros."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        if not ordered:
            return super().reassemble(chunks)
        layers = ordered[0].layers
        fixed = []
        for c in ordered:
            missing = [i for i in layers if i not in c.layers]
            if missing and c.layers:
                fields: dict[str, Any] = {}
                for name in (*CACHE_FIELDS, *SCALE_FIELDS):
                    values = getattr(c, name)
                    source = getattr(ordered[0], name)
                    if values is None or source is None:
                        continue
                    fields[name] = tuple(
                        (
                            source[i].clone()
                            if name in SCALE_FIELDS
                            else torch.zeros(
                                (c.seq_len, *source[i].shape[1:]), dtype=source[i].dtype
                            )
                        )
                        if i in missing and source[i] is not None
                        else t
                        for i, t in enumerate(values)
                    )
                c = replace(c, **fields)
            fixed.append(c)
        return super().reassemble(fixed)


@mutant("CHUNK-1.3")
class ChunkScalesFromFirst(ReferenceAdapter):
    """Keeps the first chunk's fp8 scales and never compares the later chunks'."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        if not ordered or ordered[0].key_scale is None:
            return super().reassemble(chunks)
        first = ordered[0]
        same = [
            replace(c, key_scale=first.key_scale, value_scale=first.value_scale)
            if c.layers == first.layers
            else c
            for c in ordered
        ]
        return super().reassemble(same)


@mutant("CHUNK-2.1")
class ReassemblesInArrivalOrder(ReferenceAdapter):
    """Concatenates chunks as they arrived."""

    def reassemble(self, chunks):
        relabelled = []
        start = 0
        for i, chunk in enumerate(chunks):
            relabelled.append(
                replace(
                    chunk,
                    chunk=replace(
                        chunk.chunk, chunk_id=i, token_start=start, final=i == len(chunks) - 1
                    ),
                )
            )
            start += chunk.seq_len
        return reassemble(relabelled)


@mutant("CHUNK-2.2")
class BoundaryBlockListedTwice(ReferenceAdapter):
    """Concatenates the chunks' block ids as they are: a block two chunks share at an
    unaligned boundary appears twice."""

    def reassemble(self, chunks):
        whole = super().reassemble(chunks)
        ids = tuple(b for c in _by_token(chunks) for b in c.block_ids)
        return replace(whole, block_ids=ids)


@mutant("CHUNK-2.3")
class OnlyEndsChecked(ReferenceAdapter):
    """Checks for the first and the final chunk and concatenates whatever lies between."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        if ordered and ordered[0].chunk.token_start == 0 and ordered[-1].chunk.final:
            start = 0
            fixed = []
            for i, c in enumerate(ordered):
                fixed.append(replace(c, chunk=Chunk(i, start, final=i == len(ordered) - 1)))
                start += c.seq_len
            if [c.chunk.chunk_id for c in ordered] != list(range(len(ordered))):
                return super().reassemble(fixed)
        return super().reassemble(chunks)


@mutant("CHUNK-2.4")
class FinalNotRequired(ReferenceAdapter):
    """Reassembles whatever contiguous chunks arrived, without waiting for the final one."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        if ordered and not any(c.chunk.final for c in ordered):
            ordered[-1] = replace(ordered[-1], chunk=replace(ordered[-1].chunk, final=True))
            return super().reassemble(ordered)
        return super().reassemble(chunks)


@mutant("CHUNK-2.5")
class RepeatsDeduplicated(ReferenceAdapter):
    """Keeps one chunk per chunk id, so a repeated (or re-sent, longer) chunk passes."""

    def reassemble(self, chunks):
        by_id: dict[int, Payload] = {}
        for c in chunks:
            by_id.setdefault(c.chunk.chunk_id, c)
        kept = list(by_id.values())
        ordered = _by_token(kept)
        fixed, start = [], 0
        for c in ordered:
            if c.chunk.token_start < start:  # overlap: keep only the new tokens
                skip = start - c.chunk.token_start
                fields: dict[str, Any] = {
                    name: tuple(None if t is None else t[skip:] for t in getattr(c, name))
                    for name in CACHE_FIELDS
                }
                c = replace(
                    c, seq_len=c.seq_len - skip, chunk=replace(c.chunk, token_start=start), **fields
                )
            fixed.append(c)
            start = c.chunk.token_start + c.seq_len
        return super().reassemble(fixed)


@mutant("CHUNK-2.6")
class StopsAtFinal(ReferenceAdapter):
    """Stops at the final chunk and drops anything that came after it."""

    def reassemble(self, chunks):
        ordered = _by_token(chunks)
        finals = [i for i, c in enumerate(ordered) if c.chunk.final]
        if finals:
            return super().reassemble(ordered[: finals[0] + 1])
        return super().reassemble(chunks)


@mutant("CHUNK-2.3", "CHUNK-2.5", "CHUNK-2.6", unclear=True)
class ReassemblyRefusedWithoutProblem(ReferenceAdapter):
    """Refuses a chunk set that is incomplete or can never be valid, as it must, with
    "incomplete or inconsistent chunk set", naming no missing token range, chunk id or
    repeated chunk, where the clause asks for every problem named."""

    def reassemble(self, chunks):
        try:
            return super().reassemble(chunks)
        except ValueError:
            raise ValueError("incomplete or inconsistent chunk set") from None
