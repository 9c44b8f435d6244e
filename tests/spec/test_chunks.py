"""CHUNK-1..2: chunks reassemble the same in any order; what is missing or wrong is named."""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.tensors.slicing import HeadSlice
from kvspec.testing.strategies import chunk_sizes, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.transport.chunks import coverage, reassemble, split_chunks
from kvspec.transport.payload import (
    Chunk,
    Payload,
    merge_payloads,
    payload_equal,
    payload_from_shipment,
)

BLOCK = 2
FP8 = TransferCase(StageLayout(2), StageLayout(4), ModelShape(2, 4, 2, dtype="float8_e4m3fn"))


def whole_payloads(case: TransferCase, seq_len: int, *, seed: int = 0, device: str = "cpu"):
    """``[(src, dst, payload)]`` of one request, each sender's blocks numbered from 100*src."""
    plan = case.plan()
    full = random_request_kv(case.model, seq_len, seed=seed, device=device)
    blocks = -(-seq_len // BLOCK)
    found = []
    for src, local in enumerate(shard(full, case.source, case.model)):
        for shipment in send(plan, src, local):
            ids = range(100 * src, 100 * src + blocks)
            payload = payload_from_shipment(plan, shipment, "r", block_size=BLOCK, block_ids=ids)
            found.append((src, shipment.edge.dst, payload))
    return plan, found


@given(
    case=transfer_cases(max_layers=4),
    seq_len=st.integers(1, 7),
    data=st.data(),
)
@example(case=FP8, seq_len=5, data=None)
def test_any_arrival_order_reassembles_the_request(
    device: str, case: TransferCase, seq_len: int, data
) -> None:
    """CHUNK-2: reassemble(shuffled split(p)) == p, block ids included."""
    _, found = whole_payloads(case, seq_len, device=device)
    for _, _, payload in found:
        sizes = data.draw(chunk_sizes(seq_len=seq_len)) if data else [2, 1, 2]
        chunks = split_chunks(payload, sizes)
        assert [c.chunk.chunk_id for c in chunks] == list(range(len(sizes)))
        arrived = data.draw(st.permutations(chunks)) if data else chunks[::-1]
        assert coverage(arrived).complete
        assert payload_equal(reassemble(arrived), payload)


@given(case=transfer_cases(max_layers=4), seq_len=st.integers(2, 6), data=st.data())
def test_chunking_and_merging_commute(case: TransferCase, seq_len: int, data) -> None:
    """CHUNK-2 with PAYLOAD-3: merge(reassemble per sender) == reassemble(merge per chunk)."""
    plan, found = whole_payloads(case, seq_len)
    sizes = data.draw(chunk_sizes(seq_len=seq_len))
    for dst in case.target.ranks():
        mine = [(src, p) for src, d, p in found if d == dst]
        chunked = {src: split_chunks(p, sizes) for src, p in mine}
        per_sender = merge_payloads(plan, dst, [(s, reassemble(c)) for s, c in chunked.items()])
        per_chunk = reassemble(
            merge_payloads(plan, dst, [(s, c[i]) for s, c in chunked.items()])
            for i in range(len(sizes))
        )
        assert payload_equal(per_sender, per_chunk)


def _chunks(*spans: tuple[int, int, int, bool]) -> list[Payload]:
    """Chunks ``(chunk_id, start, stop, final)`` of one small payload."""
    data = torch.arange(2 * 10 * 1 * 2, dtype=torch.float32).reshape(2, 10, 1, 2)
    marker = HeadSlice(0, 1, 1, 0, 1, applied=True, side="sender")
    return [
        Payload(
            "r",
            (data[0, start:stop],),
            (data[1, start:stop],),
            (),
            4,
            "float32",
            stop - start,
            marker,
            Chunk(chunk_id, start, final),
        )
        for chunk_id, start, stop, final in spans
    ]


@pytest.mark.parametrize(
    ("spans", "missing", "conflicts"),
    [
        ([(0, 0, 4, False), (2, 6, 8, True)], ["tokens 4..5", "chunk ids [1]"], []),
        ([(1, 3, 6, True)], ["tokens 0..2", "chunk ids [0]"], []),
        ([(0, 0, 4, False), (1, 4, 6, False)], ["the final chunk (tokens from 6 on)"], []),
        (
            [(0, 0, 4, False), (1, 3, 6, True)],
            [],
            ["chunk 0 (tokens 0..3) and chunk 1 (tokens 3..5) overlap on tokens 3..3"],
        ),
        ([(0, 0, 4, False), (0, 0, 4, False), (1, 4, 5, True)], [], ["chunk 0 arrived 2 times"]),
        (
            [(0, 0, 4, True), (1, 4, 6, True)],
            [],
            ["several chunks are final", "chunk 1 (tokens 4..5) lies past the end of the final"],
        ),
        ([(1, 0, 4, False), (0, 4, 6, True)], [], ["chunk ids do not follow token order: [1, 0]"]),
        (
            [(0, 0, 4, False), (1, 4, 4, False), (2, 4, 6, True)],
            [],
            ["chunk 1 (no tokens at 4) carries no tokens"],
        ),
    ],
)
def test_gaps_and_conflicts_are_named(spans, missing: list[str], conflicts: list[str]) -> None:
    """CHUNK-2: what may still arrive is missing; what can never be valid conflicts."""
    chunks = _chunks(*spans)
    report = coverage(chunks)
    assert not report.complete
    assert list(report.missing) == missing
    for expected in conflicts:
        assert any(c.startswith(expected) for c in report.conflicts), report.conflicts
    with pytest.raises(ValueError, match=r"cannot reassemble request 'r'.*\[CHUNK-2\]"):
        reassemble(chunks)


def test_disagreeing_chunks_are_refused() -> None:
    """CHUNK-1: chunks of one edge agree on everything but their tokens."""
    first, second = _chunks((0, 0, 4, False), (1, 4, 6, True))
    report = coverage([first, replace(second, request_id="s", block_size=8)])
    assert report.conflicts[0] == "chunks disagree on request_id (chunk 0: 'r', chunk 1: 's')"
    assert report.conflicts[1].startswith("chunks disagree on block_size")


def test_fp8_chunks_must_share_scales() -> None:
    """CHUNK-1 with DTYPE-3: a layer has one scale across its chunks."""
    _, found = whole_payloads(FP8, 4)
    payload = found[0][2]
    first, second = split_chunks(payload, [1, 3])
    scaled = tuple(None if s is None else s * 2 for s in second.key_scale)
    report = coverage([first, replace(second, key_scale=scaled)])
    assert "a layer has one scale [DTYPE-3]" in report.conflicts[0]


def test_nothing_arrived_and_bad_splits() -> None:
    assert coverage([]).missing == ("every chunk: none has arrived",)
    (_, _, payload), *_ = whole_payloads(FP8, 4)[1]
    with pytest.raises(
        ValueError, match=r"chunk sizes \[1, 2\] sum to 3, the payload has seq_len 4"
    ):
        split_chunks(payload, [1, 2])
    with pytest.raises(ValueError, match=r"only a whole request is split"):
        split_chunks(split_chunks(payload, [2, 2])[0], [1, 1])
