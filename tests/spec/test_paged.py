"""PAGED-1..5: gathering a request from its blocks, scattering it into another block size."""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS
from kvspec.memory.paged import PagedCache, empty_paged_cache, gather_request, scatter_request
from kvspec.tensors.dtypes import DTYPES, bits_view, raw_bits
from kvspec.tensors.kv import RequestKV, kv_equal
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.testing.strategies import PagedSide, models, paged_sides
from kvspec.topology.model import ModelShape


def paged_cache(
    model: ModelShape, layout: str, block_size: int, num_blocks: int, *, seed: int, device: str
) -> PagedCache:
    """A cache for the whole model full of random bits: other requests' data, NaNs included."""
    cache = empty_paged_cache(
        layout,
        num_layers=model.num_layers,
        num_blocks=num_blocks,
        block_size=block_size,
        heads=model.num_kv_heads,
        head_dim=model.head_dim,
        dtype=model.dtype,
        kv=model.kv_tensors,
        scales=oracle_scales(model),
        device=device,
    )
    generator = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        for view in cache.views(layer):
            bits = bits_view(view)
            info = torch.iinfo(bits.dtype)
            noise = torch.randint(info.min, info.max, bits.shape, generator=generator)
            bits.copy_(noise.to(bits.dtype))
    return cache


def snapshot(cache: PagedCache) -> list[list[torch.Tensor]]:
    return [[raw_bits(v).cpu() for v in cache.views(layer)] for layer in cache.layers]


def per_token(cache: PagedCache, block_ids: list[int], seq_len: int) -> torch.Tensor:
    """PAGED-1 read literally, one token at a time: [layers, kv, seq, heads, dim] bits."""
    b = cache.shape.block_size
    return torch.stack(
        [
            torch.stack(
                [
                    torch.stack([raw_bits(v)[block_ids[t // b], t % b] for t in range(seq_len)])
                    if seq_len
                    else raw_bits(v)[:0, 0]
                    for v in cache.views(layer)
                ]
            )
            for layer in cache.layers
        ]
    ).cpu()


def paged_cache_for(model: ModelShape, side: PagedSide, *, seed: int, device: str) -> PagedCache:
    return paged_cache(
        model, side.layout, side.block_size, side.num_blocks, seed=seed, device=device
    )


@dataclass(frozen=True)
class Hop:
    """A request moved from one paged cache to another."""

    model: ModelShape
    seq_len: int
    sender: PagedSide
    receiver: PagedSide


@st.composite
def hops(draw: st.DrawFn, *, max_seq_len: int = 12) -> Hop:
    model = draw(models(max_layers=3, max_heads=3))
    seq_len = draw(st.integers(0, max_seq_len))
    side = paged_sides(attention=model.attention, seq_len=seq_len)
    return Hop(model, seq_len, draw(side), draw(side))


@given(hop=hops())
def test_gather_follows_the_block_table(device: str, hop: Hop) -> None:
    """PAGED-1, PAGED-4: token t comes from block ids[t // b], slot t % b, of every layer."""
    model, seq_len, ids = hop.model, hop.seq_len, list(hop.sender.block_ids)
    cache = paged_cache_for(model, hop.sender, seed=seq_len, device=device)
    got = gather_request(cache, ids, seq_len)
    assert got.data.device == cache.device
    assert torch.equal(raw_bits(got.data).cpu(), per_token(cache, ids, seq_len))
    assert kv_equal(got, RequestKV(got.data, oracle_scales(model, device=device)))


SIXTEEN_TO_32 = Hop(
    ModelShape(2, 2, 2),
    40,
    PagedSide("flash_attn", 16, 4, (3, 0, 2)),
    PagedSide("flashinfer_hnd", 32, 3, (2, 0)),
)
THIRTY_TWO_TO_16 = Hop(
    ModelShape(2, 1, 3, dtype="float8_e4m3fn"),
    33,
    PagedSide("kv_tuple", 32, 2, (1, 0)),
    PagedSide("flash_attn_hnd", 16, 5, (4, 1, 3)),
)
SIXTEEN_TO_1 = Hop(
    ModelShape.mla(1, 3, dtype="float8_e5m2"),
    11,
    PagedSide("mla", 16, 2, (1,)),
    PagedSide("token_major", 1, 12, tuple(range(11, 0, -1))),
)


@given(hop=hops())
@example(hop=SIXTEEN_TO_32)
@example(hop=THIRTY_TWO_TO_16)
@example(hop=SIXTEEN_TO_1)
def test_gather_then_scatter_keeps_every_token(device: str, hop: Hop) -> None:
    """PAGED-4: sender layout/block size -> receiver layout/block size; only the request moves."""
    model, seq_len = hop.model, hop.seq_len
    a_ids, b_ids, b = (
        list(hop.sender.block_ids),
        list(hop.receiver.block_ids),
        hop.receiver.block_size,
    )
    sender = paged_cache_for(model, hop.sender, seed=1, device=device)
    receiver = paged_cache_for(model, hop.receiver, seed=2, device=device)
    before = snapshot(receiver)
    request = gather_request(sender, a_ids, seq_len)
    scatter_request(request, receiver, b_ids)

    assert kv_equal(gather_request(receiver, b_ids, seq_len), request)
    assert torch.equal(per_token(receiver, b_ids, seq_len), raw_bits(request.data).cpu())
    written = torch.zeros(hop.receiver.num_blocks, b, dtype=torch.bool)
    for t in range(seq_len):
        written[b_ids[t // b], t % b] = True
    for layer, (old, new) in enumerate(zip(before, snapshot(receiver), strict=True)):
        for k in range(model.kv_tensors):
            assert torch.equal(old[k][~written], new[k][~written]), f"layer {layer} kv {k}"


def test_the_oracle_survives_any_layout_pair(device: str) -> None:
    """PAGED-4 with the oracle: a filled request reads back exactly after a re-blocking hop."""
    model = ModelShape(2, 2, 3, dtype="bfloat16")
    expected = oracle_kv(model, "req", tokens=21, device=device)
    for a_layout, a in (("flash_attn", 16), ("kv_tuple", 4), ("token_major", 1)):
        for b_layout, b in (("flashinfer_hnd", 32), ("flash_attn_hnd", 5), ("token_major", 1)):
            sender = paged_cache(model, a_layout, a, 30, seed=0, device=device)
            receiver = paged_cache(model, b_layout, b, 30, seed=1, device=device)
            a_ids = list(range(29, 29 - -(-21 // a), -1))
            b_ids = list(range(-(-21 // b)))
            scatter_request(expected, sender, a_ids)
            scatter_request(gather_request(sender, a_ids, 21), receiver, b_ids)
            assert kv_equal(gather_request(receiver, b_ids, 21), expected), (a_layout, b_layout)


def small_cache() -> PagedCache:
    """2 layers, 2 heads x 2, float16, flash_attn: 6 blocks of 4."""
    return paged_cache(
        ModelShape(2, 2, 2, dtype="float16"), "flash_attn", 4, 6, seed=0, device="cpu"
    )


@pytest.mark.parametrize(
    ("ids", "seq_len", "match"),
    [
        ([0, 6], 5, r"block ids \[6\] \(at positions \[1\]\) are out of range: .* 0\.\.5"),
        ([-1, 2], 5, r"block ids \[-1\] \(at positions \[0\]\) are out of range"),
        ([3, 3], 5, r"block ids \[3\] appear more than once in \[3, 3\]"),
        ([1], 5, r"seq_len 5 needs 2 blocks of 4 but 1 block ids were given \(\[1\]\)"),
        ([1, 2, 4], 5, r"seq_len 5 needs 2 blocks of 4 but 3 block ids .* first 2"),
        ([], 1, r"seq_len 1 needs 1 blocks of 4 but 0 block ids"),
        ([0.0, 1.0], 5, r"block ids must be integers; got \[0\.0, 1\.0\]"),
        (torch.tensor([[0, 1]]), 5, r"1-d integer tensor .* shape \[1, 2\]"),
    ],
)
def test_bad_block_ids_are_refused_and_nothing_is_written(ids, seq_len: int, match: str) -> None:
    """PAGED-2, PAGED-3: refused with the ids; a refused scatter leaves the cache as it was."""
    cache = small_cache()
    with pytest.raises(ValueError, match=match):
        gather_request(cache, ids, seq_len)
    before = snapshot(cache)
    request = oracle_kv(ModelShape(2, 2, 2, dtype="float16"), "r", tokens=seq_len)
    with pytest.raises(ValueError, match=match):
        scatter_request(request, cache, ids)
    assert all(
        torch.equal(x, y)
        for a, b in zip(before, snapshot(cache), strict=True)
        for x, y in zip(a, b, strict=True)
    )


def test_block_ids_may_be_a_tensor_on_any_device(device: str) -> None:
    cache = small_cache()
    ids = torch.tensor([5, 0], device=device)
    assert kv_equal(gather_request(cache, ids, 6), gather_request(cache, [5, 0], 6))


def test_kv_that_does_not_fit_the_cache_is_refused() -> None:
    """PAGED-4: layer count, heads and dtype must match; both shapes are named."""
    cache = small_cache()
    with pytest.raises(ValueError, match=r"KV of shape \[2, 2, 3, 4, 2\] .* \[2, 2, 'seq', 2, 2\]"):
        scatter_request(oracle_kv(ModelShape(2, 4, 2, dtype="float16"), "r", tokens=3), cache, [0])
    with pytest.raises(ValueError, match=r"KV of dtype torch.bfloat16 .* float16 cache"):
        scatter_request(oracle_kv(ModelShape(2, 2, 2), "r", tokens=3), cache, [0])


def test_fp8_scales_must_be_the_caches() -> None:
    """PAGED-5, DTYPE-3: matching scales are accepted; differing or missing ones refused."""
    model = ModelShape(3, 2, 2, dtype="float8_e4m3fn")
    cache = paged_cache(model, "flashinfer", 4, 3, seed=0, device="cpu")
    request = oracle_kv(model, "r", tokens=5)
    scatter_request(request, cache, [2, 0])
    assert kv_equal(gather_request(cache, [2, 0], 5), request)
    assert request.scales is not None
    other = request.scales.clone()
    other[1, 1] *= 2
    with pytest.raises(ValueError, match=r"layer 1 \(of this cache\) has scales \[.*\] but the KV"):
        scatter_request(RequestKV(request.data, other), cache, [2, 0])
    with pytest.raises(ValueError, match=r"must carry its per-layer K/V scales; none given"):
        scatter_request(RequestKV(request.data), cache, [2, 0])
    with pytest.raises(ValueError, match=r"a paged float8_e4m3fn cache: an float8_e4m3fn cache"):
        PagedCache(PRESETS["flashinfer"], cache.layers)
    with pytest.raises(
        TypeError, match=r"PagedCache.layout is a CacheLayout value, got 'flashinfer'"
    ):
        PagedCache("flashinfer", cache.layers)  # type: ignore[arg-type]  # a name, not a value


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_dtype_moves_as_bits(device: str, dtype: str) -> None:
    """DTYPE-2 through gather and scatter: NaN payloads and -0.0 arrive as they left."""
    model = ModelShape(1, 1, 2, dtype=dtype)
    sender = paged_cache(model, "flash_attn_hnd", 3, 4, seed=9, device=device)
    receiver = paged_cache(model, "kv_tuple", 2, 4, seed=8, device=device)
    request = gather_request(sender, [3, 1, 0], 8)
    scatter_request(request, receiver, [0, 2, 1, 3])
    assert kv_equal(gather_request(receiver, [0, 2, 1, 3], 8), request)


@given(
    block_size=st.integers(1, 6),
    seq_len=st.integers(1, 40),
    data=st.data(),
)
def test_blocks_of_a_token_range(block_size: int, seq_len: int, data: st.DataObject) -> None:
    """PAGED-1: exactly the blocks holding the tokens, in table order."""
    from kvspec.memory.paged import blocks_needed, blocks_of

    table = data.draw(st.permutations(range(blocks_needed(seq_len, block_size))))
    start = data.draw(st.integers(0, seq_len - 1))
    stop = data.draw(st.integers(start + 1, seq_len))
    got = blocks_of(table, block_size, range(start, stop))
    assert got == list(dict.fromkeys(table[t // block_size] for t in range(start, stop)))
    assert blocks_of(table, block_size, range(0)) == []
