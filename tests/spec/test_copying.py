"""One pass per byte: the bit movers, and every data path's preallocated-output form.

Each ``out=`` form must give exactly the bits of the allocating form it shares a name
with (LAYOUT-3, PAGED-4, RESHARD-2, WIRE-5), and refuse an output it cannot fill.
"""

import itertools
import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvspec.memory.cache_layout import (
    LAYOUTS,
    CacheShape,
    convert,
    empty_cache,
    field_views,
    kv_views,
)
from kvspec.memory.paged import empty_paged_cache, gather_request
from kvspec.tensors import copying
from kvspec.tensors.copying import copy_bits, gather_blocks, scatter_blocks, wide_bits
from kvspec.tensors.dtypes import DTYPES, bit_equal, raw_bits, torch_dtype
from kvspec.tensors.kv import kv_equal, random_request_kv
from kvspec.tensors.reshard import reshard, shard
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport import wire
from kvspec.transport.wire import WireError, decode, encode, staging_nbytes
from tests.strategies import random_bits, same_cache

MHA_PLAIN = tuple(n for n, spec in LAYOUTS.items() if spec.kv_tensors in (2, None))


@st.composite
def strided_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Random bits [blocks, a, b, width] read through a narrowed last axis and perhaps a
    transpose, and a target of the same shape inside a larger random tensor read the other
    way: the views the data paths copy between. Returns (source, target, target's base,
    where the target starts in the base's last axis)."""
    dtype = draw(st.sampled_from(tuple(DTYPES)))
    blocks, a, b = (draw(st.integers(1, 4)) for _ in range(3))
    width, start = draw(st.integers(1, 12)), draw(st.integers(0, 3))
    pad = draw(st.integers(0, 3))
    source = random_bits((blocks, a, b, width + start + pad), dtype, 1).narrow(-1, start, width)
    if draw(st.booleans()):
        source = source.transpose(1, 2)
    shape = source.shape
    base = random_bits((shape[0], shape[2], shape[1], width + start + pad), dtype, 2)
    return source, base.narrow(-1, start, width).transpose(1, 2), base, start


@given(pair=strided_pairs())
def test_copy_bits_moves_every_bit_through_any_strides(
    pair: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
) -> None:
    """DTYPE-2: a widened copy is the element-wise bit copy; nothing outside is touched."""
    source, target, base, start = pair
    expected = raw_bits(base).clone()
    expected.narrow(-1, start, target.shape[-1]).transpose(1, 2).copy_(raw_bits(source))
    copy_bits(target, source)
    assert torch.equal(raw_bits(base), expected)


@contextmanager
def shared_by_three_threads() -> Iterator[None]:
    """Every CPU copy shared by three threads, slice by slice, however small it is."""
    with (
        patch.object(copying, "_SHARED", 0),
        patch.object(copying, "_SLICE", 1),
        patch.object(copying, "_PIECES", 1),
        patch.object(copying, "copy_threads", lambda: 3),
    ):
        yield


@given(pair=strided_pairs())
def test_shared_copies_move_every_bit(
    pair: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
) -> None:
    """DTYPE-2: a copy the threads share is the same bits as one copy."""
    with shared_by_three_threads():
        test_copy_bits_moves_every_bit_through_any_strides.hypothesis.inner_test(pair)


@given(data=st.data(), dtype=st.sampled_from(tuple(DTYPES)))
def test_shared_gathers_and_scatters_follow_the_index(data: st.DataObject, dtype: str) -> None:
    """PAGED-1: a scatter the threads share writes every block where the index says."""
    with shared_by_three_threads():
        test_gather_and_scatter_blocks_follow_the_index.hypothesis.inner_test(data, dtype)


def test_a_copy_above_the_sharing_size_is_shared_and_exact() -> None:
    """The thresholds as shipped: a 1 MiB NHD -> HND copy runs in slices on the copy
    threads (whenever torch has more than one) and is the plain copy."""
    source = random_bits((64, 16, 8, 64), "bfloat16", 5)  # 1 MiB
    target = torch.empty(64, 8, 16, 64, dtype=torch.bfloat16)
    pieces: list[slice] = []
    real = copying._in_pieces

    def counted(length: int, count: int, piece: Callable[[slice], None]) -> None:
        real(length, count, lambda part: (pieces.append(part), piece(part)))

    with patch.object(copying, "_in_pieces", counted):
        copy_bits(target.transpose(1, 2), source)
    assert bit_equal(target, source.transpose(1, 2).contiguous())
    threads = copying.copy_threads()
    want = 1 if threads == 1 else min(copying._PIECES * threads, (1 << 20) // copying._SLICE)
    assert len(pieces) == want


def test_a_machine_with_many_cores_shares_a_copy_in_slices_worth_a_thread() -> None:
    """With 64 threads a 1 MiB copy is cut in four slices of 256 KiB (four threads), a
    64 MiB one in 256; a copy under 1 MiB is not shared."""
    with patch.object(copying, "copy_threads", lambda: 64):
        assert copying._slices(1 << 20) == 4
        assert copying._slices(64 << 20) == 256
        assert copying._slices((1 << 20) - 1) == 1
    with patch.object(copying, "copy_threads", lambda: 1):
        assert copying._slices(64 << 20) == 1


def _copy_in_child(result: Any) -> None:
    torch.set_num_threads(1)  # torch's own pool does not survive a fork (the sim does this)
    source = random_bits((64, 16, 8, 64), "bfloat16", 6)
    target = torch.empty(64, 8, 16, 64, dtype=torch.bfloat16)
    copy_bits(target.transpose(1, 2), source)
    result.put(bit_equal(target, source.transpose(1, 2).contiguous()))


def test_a_forked_child_shares_copies_with_threads_of_its_own() -> None:
    """A child forked after its parent shared a copy has none of the parent's threads;
    its own shared copies still finish (the sim forks its ranks)."""
    with patch.object(copying, "copy_threads", lambda: 2):
        source = random_bits((64, 16, 8, 64), "bfloat16", 7)
        copy_bits(torch.empty(64, 8, 16, 64, dtype=torch.bfloat16).transpose(1, 2), source)
        fork = multiprocessing.get_context("fork")
        result = fork.Queue()
        child = fork.Process(target=_copy_in_child, args=(result,))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child's shared copy never finished")
    assert child.exitcode == 0 and result.get(timeout=60) is True


def test_wide_bits_takes_the_widest_integer_the_views_allow() -> None:
    heads = torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16)
    assert {t.dtype for t in wide_bits(heads, heads.transpose(1, 2))} == {torch.int64}
    assert {t.dtype for t in wide_bits(heads[..., 2:], heads[..., 2:])} == {torch.int32}
    assert {t.dtype for t in wide_bits(heads[..., 1:], heads[..., 1:])} == {torch.int16}
    (view,) = wide_bits(heads)
    view.fill_(-1)
    assert torch.isnan(heads).all(), "a widened view writes the tensor's own storage"


def test_copy_bits_refuses_other_shapes() -> None:
    with pytest.raises(ValueError, match=r"target \[2, 3\] of 2 B, source \[3, 2\] of 2 B"):
        copy_bits(torch.zeros(2, 3, dtype=torch.int16), torch.zeros(3, 2, dtype=torch.int16))


@given(data=st.data(), dtype=st.sampled_from(tuple(DTYPES)))
def test_gather_and_scatter_blocks_follow_the_index(data: st.DataObject, dtype: str) -> None:
    """PAGED-1: out[i] = source[index[i]] and target[index[i]] = source[i], bit for bit."""
    blocks = data.draw(st.integers(1, 6))
    count = data.draw(st.integers(0, blocks))
    index = torch.tensor(data.draw(st.permutations(range(blocks)))[:count], dtype=torch.long)
    source = random_bits((blocks, 3, 2, 4), dtype, 3).transpose(1, 2)
    out = torch.empty((count, 2, 3, 4), dtype=torch_dtype(dtype))
    gather_blocks(source, index, out)
    assert torch.equal(raw_bits(out), raw_bits(source)[index])
    target_base = random_bits((blocks, 3, 2, 4), dtype, 4)
    before = raw_bits(target_base).clone()
    scatter_blocks(out, index, target_base.transpose(1, 2))
    expected = before.clone()
    expected.transpose(1, 2)[index] = raw_bits(out)
    assert torch.equal(raw_bits(target_base), expected)


BLOCK_CHANGES = ((4, 4), (2, 8), (8, 2), (4, 6))
CONVERSIONS = [
    (a, b, block, new)
    for a, b in itertools.product(MHA_PLAIN, MHA_PLAIN)
    for block, new in BLOCK_CHANGES
    if "token_major" not in (a, b) or block == new  # token_major has block size 1
]


@pytest.mark.parametrize(("source", "target", "block", "new_block"), CONVERSIONS)
def test_convert_into_out_is_the_allocating_convert(
    source: str, target: str, block: int, new_block: int
) -> None:
    """LAYOUT-3: every plain MHA preset pair, same block size, either direction of a
    re-blocking, and a block size neither divides: the same bits as a new cache."""
    source_block = 1 if source == "token_major" else block
    shape = CacheShape(2, 24 // source_block, source_block, 3, 8)
    to_block = 1 if target == "token_major" else new_block
    page = shape.block_size if LAYOUTS[source].merged_tokens else None
    cache = empty_cache(source, shape, "bfloat16")
    for k, view in enumerate(kv_views(cache, source, block_size=page)):
        view.copy_(random_bits(tuple(view.shape), "bfloat16", k))
    expected = convert(cache, source, target, block_size=to_block, source_block_size=page)
    out_shape = CacheShape(2, shape.slots // to_block, to_block, 3, 8)
    out = empty_cache(target, out_shape, "bfloat16")
    got = convert(cache, source, target, block_size=to_block, source_block_size=page, out=out)
    assert got is out and same_cache(out, expected)


def test_convert_refuses_an_out_it_cannot_fill() -> None:
    shape = CacheShape(2, 4, 4, 2, 8)
    cache = empty_cache("flash_attn", shape, "bfloat16")
    small = empty_cache("flashinfer", CacheShape(2, 3, 4, 2, 8), "bfloat16")
    with pytest.raises(ValueError, match=r"out must be a flashinfer cache .*num_blocks=3"):
        convert(cache, "flash_attn", "flashinfer", out=small)
    other_dtype = empty_cache("flashinfer", shape, "float16")
    with pytest.raises(ValueError, match=r"bfloat16 on cpu; got .*float16"):
        convert(cache, "flash_attn", "flashinfer", out=other_dtype)
    with pytest.raises(ValueError, match="shares storage"):
        convert(cache, "flash_attn", "flash_attn", out=cache)
    with pytest.raises(ValueError, match=r"out must be a kv_tuple cache"):
        convert(cache, "flash_attn", "kv_tuple", out=torch.zeros(3))


def test_records_convert_into_out_bit_for_bit() -> None:
    """LAYOUT-6: inline scales move with their cells into a preallocated cache too."""
    shape = CacheShape(2, 4, 4, 2, 16)
    cache = empty_cache("vllm_pth_hnd", shape, "float8_e4m3fn")
    assert isinstance(cache, torch.Tensor)
    cache.copy_(random_bits(tuple(cache.shape), "float8_e4m3fn", 5).view(cache.dtype))
    out = empty_cache("vllm_pth_nhd", shape, "float8_e4m3fn")
    convert(cache, "vllm_pth_hnd", "vllm_pth_nhd", out=out)
    want = field_views(convert(cache, "vllm_pth_hnd", "vllm_pth_nhd"), "vllm_pth_nhd")
    for name, view in field_views(out, "vllm_pth_nhd").items():
        assert torch.equal(raw_bits(view), raw_bits(want[name])), name


def test_gather_into_out_is_the_allocating_gather() -> None:
    cache = empty_paged_cache(
        "flash_attn_hnd", num_layers=2, num_blocks=6, block_size=4, heads=3, head_dim=4,
        dtype="bfloat16",
    )  # fmt: skip
    for layer in cache.layers:
        assert isinstance(layer, torch.Tensor)
        layer.copy_(random_bits(tuple(layer.shape), "bfloat16", 6))
    ids = [4, 0, 5]
    out = torch.empty(2, 2, 10, 3, 4, dtype=torch.bfloat16)
    got = gather_request(cache, ids, 10, out=out)
    assert got.data is out and kv_equal(got, gather_request(cache, ids, 10))
    with pytest.raises(ValueError, match=r"shape \[2, 2, 10, 3, 4\].*got a .*shape \[2, 2, 9, 3"):
        gather_request(cache, ids, 10, out=out[:, :, :9])
    with pytest.raises(ValueError, match="non-contiguous"):
        gather_request(cache, ids, 10, out=out.transpose(3, 4).contiguous().transpose(3, 4))


@given(
    case=transfer_cases(),
    seq_len=st.integers(1, 3),
    slicing=st.sampled_from(("sender", "receiver")),
)
def test_reshard_into_out_is_the_allocating_reshard(
    case: TransferCase, seq_len: int, slicing: str
) -> None:
    """RESHARD-2: the same target shards, written into the caller's tensors."""
    full = random_request_kv(case.model, seq_len, seed=seq_len)
    plan = case.plan()
    expected = shard(full, case.target, case.model)
    outs = [torch.empty_like(e.data) for e in expected]
    got = reshard(shard(full, case.source, case.model), plan, slicing=slicing, out=outs)
    for rank, (want, have, out) in enumerate(zip(expected, got, outs, strict=True)):
        assert have.data is out and kv_equal(have, want), f"target rank {rank}"


def test_reshard_refuses_outputs_that_do_not_fit() -> None:
    model = ModelShape(2, 4, 8)
    plan = plan_transfer(StageLayout(4), StageLayout(2), model)
    shards = shard(random_request_kv(model, 3), StageLayout(4), model)
    with pytest.raises(ValueError, match=r"expected 2 output tensors .* got 1"):
        reshard(shards, plan, out=[torch.empty(0)])
    wrong = [torch.empty(2, 2, 3, 2, 8, dtype=torch.float16)] * 2
    with pytest.raises(ValueError, match=r"out for target rank 0 must be a torch.bfloat16 tensor"):
        reshard(shards, plan, out=wrong)


def test_encode_into_staging_gives_the_same_frames() -> None:
    """WIRE-5: strided tensors staged in the caller's buffer frame the same bytes."""
    from benchmarks.codec import _payloads

    for payload in _payloads(8, 2):
        staging = torch.empty(staging_nbytes(payload), dtype=torch.uint8)
        staged, fresh = encode(payload, out=staging), encode(payload)
        assert [bytes(f) for f in staged] == [bytes(f) for f in fresh]
        assert decode(staged).request_id == payload.request_id
        with pytest.raises(WireError, match=r"holds 1 bytes; this payload needs at least"):
            encode(payload, out=staging[:1])
        with pytest.raises(WireError, match=r"uint8 CPU tensor; got a torch.float32 tensor"):
            encode(payload, out=torch.empty(4))


def test_a_sliced_request_is_staged_in_one_copy() -> None:
    """WIRE-5: a head slice's K and V of every layer are one strided tensor's slices, so
    encode stages them with one copy, landing each where tensor-by-tensor staging would."""
    from benchmarks.codec import _payloads

    payload = _payloads(8, 2)[0]
    staging = torch.empty(staging_nbytes(payload), dtype=torch.uint8)
    with patch.object(wire, "copy_bits", wraps=wire.copy_bits) as copies:
        frames = encode(payload, out=staging)
    assert copies.call_count == 1
    assert len(frames) == 1 + 2 * payload.num_layers
    assert _frame_offsets(frames[1:], staging) == _one_by_one([t for *_, t in payload.tensors()])


def _frame_offsets(frames: list[Any], staging: torch.Tensor) -> list[int]:
    base = staging.data_ptr()
    return [
        torch.frombuffer(f, dtype=torch.uint8).data_ptr() - base if len(f) else -1 for f in frames
    ]


def _one_by_one(tensors: list[torch.Tensor]) -> list[int]:
    """[WIRE-5]'s staging, tensor by tensor: each at the first 64-byte boundary after the
    one before it; -1 for a tensor not staged."""
    offsets, end = [], 0
    for t in tensors:
        if t.numel() == 0 or t.is_contiguous():
            offsets.append(-1)
            continue
        start = -(-end // 64) * 64
        offsets.append(start)
        end = start + t.nbytes
    return offsets


def _staging_cases() -> dict[str, tuple[list[torch.Tensor], int]]:
    """Staged tensors and the copies [WIRE-5]'s grouping makes of them: one per run of
    slices of one strided tensor, a constant step apart, each a whole multiple of 64 B."""
    base = torch.arange(5 * 4 * 64, dtype=torch.float16).view(5, 4, 64)
    half = [base[i, :, :32] for i in range(5)]  # [4, 32] of 2 B, rows 128 B apart: 256 B
    odd = torch.arange(5 * 4 * 24, dtype=torch.float16).view(5, 4, 24)[:, :, :12]  # 96 B
    return {
        "a run": (half[:4], 1),
        "uneven steps": ([half[0], half[1], half[3]], 2),
        "a row short": ([half[0], base[1, :3, :32], half[2]], 3),
        "other strides": ([half[0], base[1, :, ::2], half[2]], 3),
        "another dtype": ([half[0], half[1].view(torch.int16), half[2]], 3),
        "memory of its own": ([half[0], base[1].clone()[:, :32]], 2),
        "backwards": ([half[1], half[0]], 2),
        "off 64 bytes": (list(odd.unbind(0)), 5),
    }


@pytest.mark.parametrize("case", list(_staging_cases()))
def test_staging_groups_only_slices_of_one_strided_tensor(case: str) -> None:
    """WIRE-5: one copy per run of slices of one strided tensor; anything else is staged
    alone, and every tensor lands where staging it alone would put it."""
    tensors, copies = _staging_cases()[case]
    want = _one_by_one(tensors)
    out = torch.zeros(want[-1] + tensors[-1].nbytes, dtype=torch.uint8)
    with patch.object(wire, "copy_bits", wraps=wire.copy_bits) as calls:
        got = wire._stage_all(tensors, out)
    assert calls.call_count == copies
    assert [g.data_ptr() - out.data_ptr() for g in got] == want
    for have, tensor in zip(got, tensors, strict=True):
        assert (have.shape, have.dtype) == (tensor.shape, tensor.dtype) and bit_equal(have, tensor)


@st.composite
def _slices_of_one_base(draw: st.DrawFn) -> list[torch.Tensor]:
    """Tensors to stage: runs of slices of strided bases (steps up, down or uneven,
    overlapping or not, strides, shapes and dtypes alike or not, sizes on and off a 64-byte
    multiple) mixed with look-alikes in memory of their own and contiguous ones."""
    tensors: list[torch.Tensor] = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.integers(1, 5))
        dtype = draw(st.sampled_from([torch.float16, torch.int32, torch.uint8]))
        width = draw(st.sampled_from([24, 64, 128])) // dtype.itemsize  # row bytes
        count = draw(st.integers(1, 5))
        base = torch.arange(count * rows * 2 * width).to(dtype).view(count, rows, 2 * width)
        kind = draw(
            st.sampled_from(
                [
                    *("slices", "picked", "reversed", "overlapping"),
                    *("strides", "shapes", "dtypes", "apart", "contiguous"),
                ]
            )
        )
        if kind == "contiguous":
            tensors += list(base.unbind(0))
            continue
        halves = base[:, :, :width]  # strided: each row's first half
        if kind == "reversed":
            tensors += list(halves.unbind(0))[::-1]
        elif kind == "strides":  # one base, a constant step, every other slice strided apart
            tensors += [base[i, :, :width] if i % 2 else base[i, :, ::2] for i in range(count)]
        elif kind == "shapes":  # one base, a constant step, every other slice a row short
            tensors += [base[i, : rows - i % 2, :width] for i in range(count)]
        elif kind == "dtypes":  # one base, a constant step, every other slice read as another
            other = {torch.float16: torch.int16, torch.int32: torch.float32}.get(dtype, torch.int8)
            tensors += [base[i, :, :width].view(other if i % 2 else dtype) for i in range(count)]
        elif kind == "apart":  # the same shapes and strides, each in memory of its own
            tensors += [base[i].clone()[:, :width] for i in range(count)]
        elif kind == "picked":  # one base, steps that differ
            picked = draw(st.lists(st.integers(0, count - 1), min_size=1, unique=True))
            tensors += [halves[i] for i in sorted(picked)]
        elif kind == "overlapping":
            flat = base.view(-1)
            tensors += [flat[i : i + rows * width].view(rows, width)[:, ::2] for i in range(count)]
        else:
            tensors += list(halves.unbind(0))
    return tensors


@given(_slices_of_one_base())
def test_staging_in_groups_lands_every_tensor_where_one_by_one_would(
    tensors: list[torch.Tensor],
) -> None:
    """WIRE-5: grouped staging moves the same bytes to the same offsets as staging each
    tensor alone, whatever runs of slices the tensors form."""
    staged_only = [t for t in tensors if t.numel() and not t.is_contiguous()]
    want = [o for o in _one_by_one(tensors) if o >= 0]
    size = (want[-1] + staged_only[-1].nbytes) if staged_only else 0
    out = torch.full((size + 64,), 0xAB, dtype=torch.uint8)
    got = wire._stage_all(staged_only, out)
    assert [g.data_ptr() - out.data_ptr() for g in got] == want
    for have, tensor in zip(got, staged_only, strict=True):
        assert (have.shape, have.dtype) == (tensor.shape, tensor.dtype)
        assert bit_equal(have, tensor)
    if staged_only:
        with pytest.raises(WireError, match=rf"holds {size - 1} bytes; .* at least {size}"):
            wire._stage_all(staged_only, out[: size - 1])
