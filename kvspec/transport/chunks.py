"""Chunked delivery: a request's KV on one edge, sent as several token ranges.

Chunked prefill and streaming send a request's KV in pieces. Each piece is a
:class:`~kvspec.transport.payload.Payload` whose :class:`~kvspec.transport.payload.Chunk` says which
tokens it holds [CHUNK-1]; its key names its chunk id [KEY-1]. The receiver
reassembles them by token position, never by arrival order, and says exactly what
is missing or wrong when it cannot [CHUNK-2].

Chunking and merging commute: reassembling each sender's chunks and then merging
the senders gives the same shard as merging chunk by chunk and then reassembling.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int
from kvspec.memory.paged import blocks_needed, blocks_of
from kvspec.tensors.dtypes import bit_equal
from kvspec.transport.payload import CACHE_FIELDS, SCALE_FIELDS, Chunk, Payload

CLAUSES = (
    Clause(
        "CHUNK-1",
        "Chunks are token ranges of one edge's payload",
        "A chunk holds tokens [token_start, token_start + seq_len) of one edge's payload "
        "(with token shards, positions along the edge's token set [SLICE-4]). "
        "The chunks of one request on one edge agree on request_id, num_layers, dtype, "
        "block_size, tp_head_slice, present layers, head shape and (fp8) scales. Sorted by "
        "token_start they have ids 0..n-1, the first starts at token 0, each starts where the "
        "previous stopped, and exactly the last is final. A chunk of no tokens may only be "
        "the only chunk.",
        obligations=(
            refuses(
                "chunks that disagree on request_id, num_layers, dtype, block_size or tp_head_slice"
            ),
            refuses("chunks that disagree on present layers or head shape"),
            refuses("chunks whose fp8 scales for one layer differ"),
        ),
    ),
    Clause(
        "CHUNK-2",
        "Reassembly ignores arrival order and names what is wrong",
        "A complete set of chunks is reassembled by concatenating them on the token axis in "
        "token order, so every arrival order gives the same payload, equal to the unchunked "
        "one. Otherwise reassembly is refused with every problem named: missing token ranges, "
        "missing chunk ids, no final chunk (not yet arrived); overlapping or repeated chunks, "
        "chunks past the final one, disagreeing chunks (never valid).",
        obligations=(
            must("a complete set reassembles, in any arrival order, to the unchunked payload"),
            must("a block that two chunks share at a boundary is listed once in block_ids"),
            refuses("a set missing a chunk at the start or in the middle"),
            refuses("a set without its final chunk"),
            refuses("a repeated or overlapping chunk"),
            refuses("a chunk past the final one"),
        ),
    ),
)


@dataclass(frozen=True)
class Coverage:
    """What a set of chunks lacks and what is wrong with it [CHUNK-2].

    ``missing`` may still arrive; ``conflicts`` never become valid.
    """

    missing: tuple[str, ...]
    conflicts: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.missing and not self.conflicts


def _tokens(p: Payload) -> str:
    start = p.chunk.token_start
    return f"tokens {start}..{start + p.seq_len - 1}" if p.seq_len else f"no tokens at {start}"


def _name(p: Payload) -> str:
    return f"chunk {p.chunk.chunk_id} ({_tokens(p)})"


def _disagreements(chunks: list[Payload]) -> list[str]:
    first = chunks[0]
    facts = {
        "request_id": lambda p: p.request_id,
        "num_layers": lambda p: p.num_layers,
        "dtype": lambda p: p.dtype,
        "block_size": lambda p: p.block_size,
        "tp_head_slice": lambda p: p.head_slice,
        "layers": lambda p: p.layers,
        "[heads, head_dim]": lambda p: [p.heads, p.head_dim],
        "K/V tensors per layer": lambda p: p.kv_tensors,
        "device": lambda p: p.device,
    }
    found = []
    for fact, read in facts.items():
        values = {p.chunk.chunk_id: read(p) for p in chunks}
        if any(read(p) != read(first) for p in chunks):
            shown = ", ".join(f"chunk {i}: {v!r}" for i, v in sorted(values.items()))
            found.append(f"chunks disagree on {fact} ({shown})")
    if found or first.key_scale is None:
        return found
    for p in chunks[1:]:
        for name in SCALE_FIELDS:
            for layer, (a, b) in enumerate(
                zip(getattr(first, name), getattr(p, name) or (), strict=True)
            ):
                if a is not None and b is not None and not bit_equal(a, b):
                    found.append(
                        f"chunk {p.chunk.chunk_id} has {name}[{layer}] = {b.item()!r}, chunk "
                        f"{first.chunk.chunk_id} {a.item()!r}; a layer has one scale [DTYPE-3]"
                    )
    return found


def coverage(chunks: Iterable[Payload]) -> Coverage:
    """Which tokens and chunk ids are missing, and which chunks conflict [CHUNK-1, CHUNK-2]."""
    ordered = sorted(chunks, key=lambda p: (p.chunk.token_start, p.chunk.chunk_id, p.seq_len))
    if not ordered:
        return Coverage(("every chunk: none has arrived",), ())
    missing: list[str] = []
    conflicts = _disagreements(ordered)
    counts = Counter(p.chunk.chunk_id for p in ordered)
    for chunk_id, n in sorted(counts.items()):
        if n > 1:
            spans = ", ".join(_tokens(p) for p in ordered if p.chunk.chunk_id == chunk_id)
            conflicts.append(f"chunk {chunk_id} arrived {n} times ({spans})")
    if len(ordered) > 1:
        conflicts += [f"{_name(p)} carries no tokens" for p in ordered if p.seq_len == 0]
    finals = [p for p in ordered if p.chunk.final]
    if len(finals) > 1:
        conflicts.append("several chunks are final: " + ", ".join(_name(p) for p in finals))
    if finals:
        end = finals[0].chunk.token_start + finals[0].seq_len
        conflicts += [
            f"{_name(p)} lies past the end of the final {_name(finals[0])}"
            for p in ordered
            if p.chunk.token_start + p.seq_len > end
        ]
    cursor, reach_by = 0, None  # tokens 0..cursor-1 are covered; reach_by got there
    for p in ordered:
        start, stop = p.chunk.token_start, p.chunk.token_start + p.seq_len
        if start > cursor:
            missing.append(f"tokens {cursor}..{start - 1}")
        elif (
            start < cursor
            and p.seq_len
            and reach_by is not None
            and reach_by.chunk.chunk_id != p.chunk.chunk_id  # a repeat is reported above
        ):
            last = min(cursor, stop) - 1
            conflicts.append(f"{_name(reach_by)} and {_name(p)} overlap on tokens {start}..{last}")
        if stop > cursor:
            cursor, reach_by = stop, p
    if not finals:
        missing.append(f"the final chunk (tokens from {cursor} on)")
    ids = [p.chunk.chunk_id for p in ordered]
    if ids != sorted(ids):
        conflicts.append(f"chunk ids do not follow token order: {ids}")
    else:
        absent, count = _absent_ids(ids)
        if count:
            more = f" and {count - len(absent)} more" if count > len(absent) else ""
            missing.append(f"chunk ids {absent}{more}")
    return Coverage(tuple(missing), tuple(conflicts))


def _absent_ids(ids: list[int], shown: int = 10) -> tuple[list[int], int]:
    """The first ``shown`` ids missing from ``0..max(ids)``, and how many are missing in all,
    found from the gaps between the ids: never a container as large as an id."""
    present = sorted(set(ids))
    count = present[-1] + 1 - len(present)
    absent: list[int] = []
    expected = 0
    for chunk_id in present:
        while expected < chunk_id and len(absent) < shown:
            absent.append(expected)
            expected += 1
        if len(absent) == shown:
            break
        expected = chunk_id + 1
    return absent, count


def reassemble(chunks: Iterable[Payload]) -> Payload:
    """The whole request's payload from a complete set of chunks, in any order [CHUNK-2].

    ``block_ids`` are concatenated in token order; a block shared by two chunks at a
    boundary that is not block-aligned is listed once.
    """
    chunks = list(chunks)
    report = coverage(chunks)
    if not report.complete:
        request = chunks[0].request_id if chunks else "?"
        raise ValueError(
            f"cannot reassemble request {request!r} from {len(chunks)} chunk(s): "
            + "; ".join([f"missing {m}" for m in report.missing] + list(report.conflicts))
            + " [CHUNK-2]"
        )
    ordered = sorted(chunks, key=lambda p: p.chunk.token_start)
    first = ordered[0]
    if len(ordered) == 1:
        return replace(first, chunk=Chunk())

    def joined(name: str) -> tuple[torch.Tensor | None, ...]:
        columns = zip(*(getattr(p, name) for p in ordered), strict=True)
        return tuple(None if parts[0] is None else torch.cat(parts) for parts in columns)

    block_ids = list(first.block_ids)
    for p in ordered[1:]:
        ids = list(p.block_ids)
        shared = p.chunk.token_start % p.block_size != 0
        if shared and ids and block_ids and ids[0] == block_ids[-1]:
            ids = ids[1:]
        block_ids += ids
    return replace(
        first,
        key_cache=joined(CACHE_FIELDS[0]),
        value_cache=joined(CACHE_FIELDS[1]),
        seq_len=sum(p.seq_len for p in ordered),
        block_ids=tuple(block_ids),
        chunk=Chunk(),
    )


def split_chunks(payload: Payload, sizes: Iterable[int]) -> tuple[Payload, ...]:
    """Cut a whole-request payload into chunks of ``sizes`` tokens, ids 0.. [CHUNK-1].

    Tensors are views. ``block_ids``, when given, must list one block per
    ``block_size`` tokens; each chunk gets the blocks its tokens lie in.
    """
    sizes = list(sizes)
    if payload.chunk != Chunk():
        raise ValueError(f"only a whole request is split; this payload is {payload.chunk}")
    for i, size in enumerate(sizes):
        require_int(f"chunk size [{i}]", size, minimum=1)
    if sum(sizes) != payload.seq_len or not sizes:
        raise ValueError(
            f"chunk sizes {sizes} sum to {sum(sizes)}, the payload has seq_len "
            f"{payload.seq_len} [CHUNK-1]"
        )
    bs = payload.block_size
    blocks = blocks_needed(payload.seq_len, bs)
    if payload.block_ids and len(payload.block_ids) != blocks:
        raise ValueError(
            f"block_ids lists {len(payload.block_ids)} blocks but {payload.seq_len} tokens "
            f"of block_size {bs} fill {blocks}; cannot tell which blocks each chunk holds"
        )
    out, start = [], 0
    for i, size in enumerate(sizes):
        stop = start + size

        def cut(values: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
            return tuple(None if t is None else t[start:stop] for t in values)  # noqa: B023

        ids = tuple(blocks_of(payload.block_ids, bs, range(start, stop)))
        out.append(
            replace(
                payload,
                key_cache=cut(payload.key_cache),
                value_cache=cut(payload.value_cache),
                seq_len=size,
                block_ids=ids,
                chunk=Chunk(chunk_id=i, token_start=start, final=i == len(sizes) - 1),
            )
        )
        start = stop
    return tuple(out)
