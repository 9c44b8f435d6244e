"""ORACLE-1..5: the coordinate-hash fill, its scales, per-rank fills and the verifier."""

import hashlib
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.tensors import oracle
from kvspec.tensors.dtypes import DTYPES, FLOAT_FORMATS, bit_equal, raw_bits
from kvspec.tensors.kv import RequestKV, kv_equal
from kvspec.tensors.oracle import oracle_kv, oracle_scales, request_value, verify
from kvspec.tensors.reshard import shard
from kvspec.testing.strategies import models, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout

P = 2**31 - 1


def clause_hash(coordinates: list[int], seed: int, request_id: str) -> int:
    """ORACLE-1 read literally, on Python ints: the text is the whole definition."""

    def g(x: int, m: int, s: int) -> int:
        y = (x * m) % P
        return y ^ (y >> s)

    def mix(x: int) -> int:
        return g(g(x, 0x5BD1E995, 16), 0x27D4EB2F, 13)

    digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
    h = mix(seed % P)
    for c in [int.from_bytes(digest, "big") % P, *coordinates]:
        h = mix((h + c) % P)
    return h


def clause_value(h: int, dtype: str) -> int:
    """ORACLE-2 read literally: the element's bits (unsigned)."""
    fmt = FLOAT_FORMATS[dtype]
    sign, exponent = h & 1, ((h >> 1) & 7) - 4
    mantissa = (h >> 4) & ((1 << fmt.mantissa_bits) - 1)
    return (
        (sign << (fmt.bits - 1)) | ((exponent + fmt.exponent_bias) << fmt.mantissa_bits) | mantissa
    )


def unsigned(bits: torch.Tensor) -> list[int]:
    width = bits.element_size() * 8
    return [b & ((1 << width) - 1) for b in bits.flatten().tolist()]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_the_clause_text_is_the_definition(device: str, dtype: str, attention: str) -> None:
    """ORACLE-1, ORACLE-2: the torch fill equals a literal reading of the clauses, on any device."""
    model = ModelShape(2, 3, 4, dtype=dtype) if attention == "mha" else ModelShape.mla(2, 5, dtype)
    tokens, seed, rid = range(1_000_000, 1_000_003), 2**40 + 7, "req/7_é"
    kv = oracle_kv(model, rid, tokens=tokens, seed=seed, device=device)
    expected = []
    for layer in range(model.num_layers):
        for k in range(model.kv_tensors):
            for token in tokens:
                for head in range(model.num_kv_heads):
                    for dim in range(model.head_dim):
                        coords = (
                            [layer, token, dim]
                            if attention == "mla"
                            else [layer, k, head, token, dim]
                        )
                        expected.append(clause_value(clause_hash(coords, seed, rid), dtype))
    assert unsigned(raw_bits(kv.data).cpu()) == expected


def test_a_large_fill_is_the_clause_text_across_its_chunks() -> None:
    """ORACLE-1, ORACLE-2: a fill hashed chunk by chunk (kvspec.tensors.oracle._CHUNK
    elements at a time) is the literal reading at every chunk's edges."""
    model = ModelShape(2, 3, 128, dtype="bfloat16")
    tokens, seed, rid = range(40, 140), 11, "req-chunks"
    kv = oracle_kv(model, rid, tokens=tokens, seed=seed)
    rows = raw_bits(kv.data).reshape(-1, model.head_dim)  # [layer, kv, token, head] rows
    step = oracle._CHUNK // model.head_dim
    edges = sorted(
        {0, rows.shape[0] - 1} | {e + d for e in range(step, rows.shape[0], step) for d in (-1, 0)}
    )
    assert len(edges) > 4, "the fill spans several chunks"
    for row in edges:
        rest, head = divmod(row, model.num_kv_heads)
        rest, token = divmod(rest, len(tokens))
        layer, k = divmod(rest, model.kv_tensors)
        for dim in (0, model.head_dim - 1):
            coords = [layer, k, head, tokens[token], dim]
            want = clause_value(clause_hash(coords, seed, rid), "bfloat16")
            assert unsigned(rows[row, dim : dim + 1]) == [want], (row, dim)


@given(st.integers(0, 2**62 - 1))
@example(P - 1)
@example(P)
@example(P + 1)
@example(2 * P)
@example(2**62 - 1)
def test_the_division_free_remainder_is_the_remainder(x: int) -> None:
    """ORACLE-1's ``mod P`` on tensors, by folding the Mersenne prime's bits, is ``%``."""
    assert int(oracle._mod_p(torch.tensor([x], dtype=torch.int64))[0]) == x % P


def test_pinned_values() -> None:
    """Golden values: changing the hash breaks every stored vector, so it must show here."""
    assert request_value("req-0") == 15134268
    kv = oracle_kv(ModelShape(2, 2, 3, dtype="bfloat16"), "req-0", tokens=range(5, 7), seed=1)
    assert [hex(b) for b in unsigned(raw_bits(kv.data))[:4]] == [
        "0x40e5",
        "0x3d8e",
        "0xbe70",
        "0xc0c1",
    ]
    mla = oracle_kv(ModelShape.mla(2, 3, dtype="float8_e4m3fn"), "req-0", tokens=2, seed=1)
    assert [hex(b) for b in unsigned(raw_bits(mla.data))[:4]] == ["0x30", "0x51", "0xa8", "0x1a"]
    assert raw_bits(mla.scales).flatten().tolist() == [1084766086, 1049558368]


@given(model=models(max_heads=8), seq_len=st.integers(0, 6), seed=st.integers(0, 2**62))
def test_every_value_is_finite_and_normal(device: str, model: ModelShape, seq_len: int, seed: int):
    """ORACLE-2, ORACLE-3: magnitudes in [1/16, 16); scales positive; no NaN, inf or zero."""
    kv = oracle_kv(model, f"r{seed}", tokens=seq_len, seed=seed, device=device)
    values = kv.data.float().abs()
    assert bool(((values >= 1 / 16) & (values < 16)).all())
    if model.dtype.startswith("float8"):
        assert kv.scales is not None and bool(((kv.scales >= 1 / 16) & (kv.scales < 16)).all())
        assert bit_equal(kv.scales, oracle_scales(model, seed=seed, device=device))
    else:
        assert kv.scales is None


@given(case=transfer_cases(sizes=(1, 2, 3, 4, 6, 8)), seq_len=st.integers(1, 3))
@example(
    case=TransferCase(StageLayout(4, 2), StageLayout(1), ModelShape(3, 2, 2, dtype="float8_e5m2")),
    seq_len=2,
)
def test_a_rank_fills_its_own_shard(case: TransferCase, seq_len: int) -> None:
    """ORACLE-4: each rank's fill from its own ranges equals its shard of the whole fill."""
    whole = oracle_kv(case.model, "req", tokens=seq_len, seed=3)
    for rank, expected in enumerate(shard(whole, case.source, case.model)):
        owner = rank_ownership(case.source, case.model, rank)
        mine = oracle_kv(
            case.model, "req", tokens=seq_len, layers=owner.layers, heads=owner.heads, seed=3
        )
        assert kv_equal(mine, expected), f"rank {rank}"


@given(data=st.data(), model=models(max_heads=6), seq_len=st.integers(1, 5))
def test_any_single_bit_flip_is_caught(
    device: str, data: st.DataObject, model: ModelShape, seq_len: int
) -> None:
    """ORACLE-5: flip one bit of one element anywhere; exactly it is reported, globally placed."""
    layers = range(data.draw(st.integers(0, model.num_layers - 1)), model.num_layers)
    first_token = data.draw(st.integers(0, 100))
    tokens = range(first_token, first_token + seq_len)
    kv = oracle_kv(model, "req", tokens=tokens, layers=layers, seed=5, device=device)
    assert verify(kv, model, "req", tokens=tokens, layers=layers, seed=5).ok
    index = [data.draw(st.integers(0, n - 1)) for n in kv.data.shape]
    bit = data.draw(st.integers(0, kv.data.element_size() * 8 - 1))
    bits = raw_bits(kv.data).clone()
    bits[tuple(index)] ^= torch.tensor(1 << bit).to(bits.dtype)
    verdict = verify(
        RequestKV(bits.view(kv.data.dtype), kv.scales),
        model,
        "req",
        tokens=tokens,
        layers=layers,
        seed=5,
    )
    layer, k, token, head, dim = index
    assert (verdict.mismatches, verdict.total, verdict.ok) == (1, kv.data.numel(), False)
    first = verdict.first
    assert first is not None
    assert (first.layer, first.token, first.head, first.dim) == (
        layers[layer],
        tokens[token],
        head,
        dim,
    )
    assert first.kv == ("latent" if model.attention == "mla" else "KV"[k])
    assert first.expected_bits ^ first.got_bits == 1 << bit
    assert f"layer {layers[layer]}, {first.kv}, head {head}, token {tokens[token]}" in (
        verdict.message
    )


def test_the_verifier_counts_and_names_the_first() -> None:
    """ORACLE-5: several wrong elements — the count, and the first in [layer, kv, token, ...]."""
    model = ModelShape(3, 4, 2, dtype="float16")
    kv = oracle_kv(model, "req-1", tokens=range(10, 14), heads=range(2, 4))
    wrong = kv.data.clone()
    wrong[2, 1, 3, 1, 0] = 0.0
    wrong[1, 0, 2, 0, 1] = -0.0
    wrong[1, 1, 0, 1, 1] = float("nan")
    verdict = verify(RequestKV(wrong), model, "req-1", tokens=range(10, 14), heads=range(2, 4))
    assert (verdict.mismatches, verdict.total) == (3, 3 * 2 * 4 * 2 * 2)
    assert verdict.message.startswith(
        "request 'req-1': 3 of 96 elements differ from the oracle; first at layer 1, K, head 2, "
        "token 12, dim 1: expected bits 0x"
    )
    assert "got 0x8000 (-0.0)" in verdict.message


def test_other_requests_seeds_and_scales_do_not_verify() -> None:
    """ORACLE-1, ORACLE-3, ORACLE-5: the request id and seed matter; scales are checked too."""
    model = ModelShape(2, 2, 4, dtype="float8_e4m3fn")
    kv = oracle_kv(model, "a", tokens=8)
    assert verify(kv, model, "b", tokens=8).mismatches > 0
    assert verify(kv, model, "a", tokens=8, seed=1).mismatches > 0
    assert verify(kv, model, "a", tokens=8).ok
    assert kv.scales is not None
    halved = RequestKV(kv.data, kv.scales / 2)
    verdict = verify(halved, model, "a", tokens=8)
    assert (verdict.mismatches, verdict.scale_mismatches) == (0, 4)
    assert "4 fp8 scales differ" in verdict.message


def test_the_verifier_refuses_other_shapes() -> None:
    """ORACLE-4, ORACLE-5: the ranges fix the shape; another shape is refused, not compared."""
    model = ModelShape(2, 4, 2)
    kv = oracle_kv(model, "r", tokens=3, heads=range(0, 2))
    with pytest.raises(ValueError, match=r"KV under verification has 3 tokens .* 0\.\.3 has 4"):
        verify(kv, model, "r", tokens=4, heads=range(0, 2))
    with pytest.raises(ValueError, match=r"expected data of shape \[2, 2, 'seq', 4, 2\]"):
        verify(kv, model, "r", tokens=3)
    with pytest.raises(ValueError, match=r"heads 2\.\.4 reach past the model's 4 heads"):
        oracle_kv(model, "r", tokens=3, heads=range(2, 5))
    assert math.isfinite(verify(kv, model, "r", tokens=3, heads=range(0, 2)).total)
