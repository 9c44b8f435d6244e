"""The coordinate-hash oracle: KV whose every element is known from its global coordinates.

Each element of a request's KV is a hash of (seed, request id, layer, K or V, global
head, global token, dim) — for MLA (seed, request id, layer, global token, latent
index) — turned into a finite value of the cache dtype [ORACLE-1, ORACLE-2]; fp8
scales are a hash of (seed, layer, K or V) [ORACLE-3]. Any rank fills exactly its own
shard, and any receiver checks what it got, with no ground truth sent [ORACLE-4];
:func:`verify` compares bit for bit and names the first wrong element in global
coordinates [ORACLE-5].

The hash uses only int64 additions, multiplications modulo a prime below 2**31,
shifts and xors, so it never overflows and is identical on every device and in any
language; the clause texts state it completely.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import overload

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int
from kvspec.tensors.dtypes import FLOAT_FORMATS, raw_bits, torch_dtype
from kvspec.tensors.kv import SCALES_DTYPE, RequestKV, check_request_kv
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens

PRIME = 2_147_483_647
"""2**31 - 1: every hash state is below it, so a product of two fits in int64 [ORACLE-1]."""
MULTIPLIERS = (0x5BD1E995, 0x27D4EB2F)
SCALES_TAG = "kvspec/scales"

CLAUSES = (
    Clause(
        "ORACLE-1",
        "The coordinate hash",
        "With P = 2**31 - 1, mix(x) = g(g(x, 0x5BD1E995, 16), 0x27D4EB2F, 13) where "
        "g(x, m, s) = y xor (y >> s) for y = (x * m) mod P, and absorb(h, c) = "
        "mix((h + c) mod P). The request id's value is the first 8 bytes of "
        "BLAKE2b(UTF-8 id, digest size 8) read big-endian, mod P. An element's hash is "
        "mix(seed mod P), then absorb of the request value, layer, kv (0 = K, 1 = V), "
        "global head, global token and dim, in that order; an MLA element absorbs the "
        "request value, layer, token and latent index (no kv, no head). Every coordinate is "
        "global and >= 0.",
        obligations=(
            must(
                "every element is the coordinate hash of (seed, request, layer, kv, head, token, "
                "dim), in that order (MLA: no kv, no head)"
            ),
        ),
    ),
    Clause(
        "ORACLE-2",
        "A finite value in every dtype, the same on every device",
        "From hash h, with the dtype's mantissa bits M and exponent bias B [DTYPE-1]: sign = "
        "h & 1, exponent = ((h >> 1) & 7) - 4, mantissa = (h >> 4) & (2**M - 1); the "
        "element's bits are sign, exponent + B, mantissa. Every value is a finite normal "
        "number of magnitude in [1/16, 16), never zero, NaN or infinite, and its bits are "
        "the same on CPU and CUDA.",
        obligations=(
            must("a hash becomes the stated sign, exponent and mantissa bits of the dtype"),
        ),
    ),
    Clause(
        "ORACLE-3",
        "Deterministic fp8 scales",
        "The oracle's fp8 scale of a layer's K or V (the latent: kv = 0) is the float32 "
        "value with sign 0 built as in ORACLE-2 from mix(seed mod P) absorbing the value of "
        "the id 'kvspec/scales', the layer and kv: a positive finite number in [1/16, 16), "
        "the same for every request, as a cache's scales are [PAGED-5].",
        obligations=(
            must(
                "fp8 scales are the stated positive hash of (seed, 'kvspec/scales', layer, kv), "
                "the same for every request"
            ),
        ),
    ),
    Clause(
        "ORACLE-4",
        "A rank fills exactly its own shard",
        "The oracle fill of any layers, heads and token range (or token set, its tokens in "
        "ascending order, as a context-parallel rank holds them [CP-1]) equals that part of "
        "the whole request's fill, bit for bit, so a sender fills and a receiver checks its "
        "own shard from its ranges alone [RESHARD-1]. A layer, head or token range outside "
        "the model is refused.",
        obligations=(
            must(
                "a fill of any layers, heads and tokens equals that part of the whole request's "
                "fill"
            ),
            refuses("a layer, head or token range outside the model"),
            must(
                "a fill of a token set (a context-parallel rank's tokens [CP-1]) holds those "
                "global tokens in ascending order, not positions 0..n-1"
            ),
        ),
    ),
    Clause(
        "ORACLE-5",
        "The verifier",
        "Verifying KV against the oracle compares raw bits [DTYPE-2] of every element and "
        "of the scales, and reports the number of differing elements, the total, and the "
        "first differing element in [layer, kv, token, head, dim] order with its global "
        "layer, K/V, head, token and dim, expected and received bits. Any change of any bit "
        "of any element is reported. KV of another shape or dtype than the ranges imply is "
        "refused, not compared.",
        obligations=(
            must("the verifier counts every element whose bits differ, however small the change"),
            must("the verifier compares the fp8 scales too"),
            refuses("KV of another shape or dtype than the ranges imply"),
        ),
    ),
)


def request_value(request_id: str) -> int:
    """The request id as a hash input: BLAKE2b-64 of its UTF-8, big-endian, mod P [ORACLE-1].

    Python's ``hash()`` is salted per process, so it is never used.
    """
    if not isinstance(request_id, str):
        raise ValueError(f"request_id must be a str, got {request_id!r} [ORACLE-1]")
    digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % PRIME


# Each hash step keeps its input's kind: an int of an int, a tensor of a tensor.
@overload
def _mod_p(x: int) -> int: ...
@overload
def _mod_p(x: torch.Tensor) -> torch.Tensor: ...
def _mod_p(x: torch.Tensor | int) -> torch.Tensor | int:
    """``x mod P`` for 0 <= x < 2**62 [ORACLE-1]; on tensors without a division.

    P = 2**31 - 1 is a Mersenne prime: 2**31 = 1 (mod P), so x = (x >> 31) * 2**31 +
    (x & P) is congruent to (x >> 31) + (x & P). Folding twice leaves at most P + 1, and
    one subtraction ends it. CPUs have no vector division of int64: torch's ``%`` costs
    a scalar division per element, while masks, shifts, adds and a select vectorise.
    """
    if not isinstance(x, torch.Tensor):
        return x % PRIME
    x = (x & PRIME) + (x >> 31)
    x = (x & PRIME) + (x >> 31)
    return torch.where(x >= PRIME, x - PRIME, x)


@overload
def _g(x: int, multiplier: int, shift: int) -> int: ...
@overload
def _g(x: torch.Tensor, multiplier: int, shift: int) -> torch.Tensor: ...
def _g(x: torch.Tensor | int, multiplier: int, shift: int) -> torch.Tensor | int:
    y = _mod_p(x * multiplier)  # x < 2**31 and multiplier < 2**31: fits in int64
    return y ^ (y >> shift)


@overload
def mix(x: int) -> int: ...
@overload
def mix(x: torch.Tensor) -> torch.Tensor: ...
def mix(x: torch.Tensor | int) -> torch.Tensor | int:
    """The oracle's mixing function on values in 0..2**31-1 (ints or int64 tensors) [ORACLE-1]."""
    return _g(_g(x, MULTIPLIERS[0], 16), MULTIPLIERS[1], 13)


@overload
def absorb(h: int, coordinate: int) -> int: ...
@overload
def absorb(h: torch.Tensor, coordinate: torch.Tensor | int) -> torch.Tensor: ...
@overload
def absorb(h: int, coordinate: torch.Tensor) -> torch.Tensor: ...
def absorb(h: torch.Tensor | int, coordinate: torch.Tensor | int) -> torch.Tensor | int:
    """Fold one coordinate into a hash state [ORACLE-1]."""
    return mix(_mod_p(h + coordinate))


def _start(seed: int, request_id: str) -> int:
    require_int("seed", seed, minimum=0)
    return absorb(mix(seed % PRIME), request_value(request_id))


def _values(h: torch.Tensor, dtype: str, *, positive: bool = False) -> torch.Tensor:
    """Hashes as finite normal values of ``dtype`` in [1/16, 16) [ORACLE-2]."""
    fmt = FLOAT_FORMATS[dtype]
    sign = torch.zeros_like(h) if positive else h & 1
    exponent = ((h >> 1) & 7) - 4 + fmt.exponent_bias
    mantissa = (h >> 4) & ((1 << fmt.mantissa_bits) - 1)
    bits = (sign << (fmt.bits - 1)) | (exponent << fmt.mantissa_bits) | mantissa
    bits_dtype = raw_bits(torch.empty(0, dtype=torch_dtype(dtype))).dtype
    if bits_dtype.is_signed:  # two's complement: the sign bit makes a negative integer
        bits = torch.where(bits >= 1 << (fmt.bits - 1), bits - (1 << fmt.bits), bits)
    return bits.to(bits_dtype).view(torch_dtype(dtype))


def _check_range(name: str, value: object, limit: int | None) -> range:
    if not isinstance(value, range) or value.step != 1 or value.start < 0:
        raise ValueError(f"{name} must be a range of step 1 from >= 0, got {value!r} [ORACLE-4]")
    if limit is not None and value.stop > limit:
        raise ValueError(
            f"{name} {value.start}..{value.stop - 1} reach past the model's {limit} {name} "
            f"(valid: 0..{limit - 1}) [ORACLE-4]"
        )
    return value


@dataclass(frozen=True)
class Region:
    """The global layers, heads and tokens a fill or a check covers [ORACLE-4]."""

    layers: range
    heads: range
    tokens: range | Tokens

    def token_list(self) -> list[int]:
        """The region's global tokens, ascending."""
        return list(self.tokens) if isinstance(self.tokens, range) else self.tokens.tokens()

    @property
    def token_count(self) -> int:
        return len(self.tokens)


def region(
    model: ModelShape,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
) -> Region:
    """The region, defaulting to all layers and heads; ``tokens`` may be a seq_len or a
    token set [ORACLE-4]."""
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = range(require_int("seq_len", tokens, minimum=0))
    if isinstance(tokens, Tokens):
        return Region(
            layers=_check_range(
                "layers", range(model.num_layers) if layers is None else layers, model.num_layers
            ),
            heads=_check_range(
                "heads", range(model.num_kv_heads) if heads is None else heads, model.num_kv_heads
            ),
            tokens=tokens,
        )
    return Region(
        layers=_check_range(
            "layers", range(model.num_layers) if layers is None else layers, model.num_layers
        ),
        heads=_check_range(
            "heads", range(model.num_kv_heads) if heads is None else heads, model.num_kv_heads
        ),
        tokens=_check_range("tokens", tokens, None),
    )


def _hashes_before_dim(
    model: ModelShape, where: Region, start: int, device: torch.device
) -> torch.Tensor:
    """Hash states ``[layers, kv, tokens, heads, 1]``: every coordinate absorbed but the
    dim (the last), broadcast one axis at a time [ORACLE-1]."""

    def axis(r: range | Tokens, dim: int) -> torch.Tensor:
        shape = [1, 1, 1, 1, 1]
        shape[dim] = len(r)
        if isinstance(r, Tokens):
            values = torch.tensor(r.tokens(), dtype=torch.int64, device=device)
            return values.view(shape)
        return torch.arange(r.start, r.stop, dtype=torch.int64, device=device).view(shape)

    h = absorb(torch.full((1,) * 5, start, dtype=torch.int64, device=device), axis(where.layers, 0))
    if model.attention == "mla":  # seed, request, layer, token, latent index [MODEL-2]
        h = absorb(h, axis(where.tokens, 2))
    else:
        h = absorb(h, axis(range(2), 1))
        h = absorb(h, axis(where.heads, 3))
        h = absorb(h, axis(where.tokens, 2))
    shape = (len(where.layers), model.kv_tensors, len(where.tokens), len(where.heads), 1)
    return h.expand(*shape).contiguous()


_CHUNK = 1 << 15
"""Elements hashed at a time on the CPU: a chunk's int64 temporaries (256 KiB each) stay
in its cache, so the ~25 passes of the last absorb and the values read no memory. A
32 MiB request (8 layers, 8 heads of 128, 1024 tokens, bfloat16, one thread): 3.7-9 s in
one pass over the whole region, 0.95 s in chunks and without divisions, on the loaded
2-core machine."""


def oracle_scales(
    model: ModelShape,
    *,
    layers: range | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> torch.Tensor | None:
    """The fp8 scales ``[layers, kv]`` of ``layers``, or None for other dtypes [ORACLE-3]."""
    if model.scale_format is None:
        return None
    layers = _check_range(
        "layers", range(model.num_layers) if layers is None else layers, model.num_layers
    )
    start = _start(seed, SCALES_TAG)
    lay = torch.arange(layers.start, layers.stop, dtype=torch.int64, device=device)
    kv = torch.arange(model.kv_tensors, dtype=torch.int64, device=device)
    h = absorb(absorb(torch.tensor(start, device=device), lay[:, None]), kv[None, :])
    return _values(h, "float32", positive=True).to(SCALES_DTYPE)


def oracle_kv(
    model: ModelShape,
    request_id: str,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> RequestKV:
    """The oracle's KV of ``request_id`` for the given global ranges [ORACLE-1..4].

    ``tokens`` is a global token range, a token set (its tokens in ascending order) or a
    seq_len for ``range(seq_len)``; layers and heads default to the whole model. fp8
    models get their scales [ORACLE-3].
    """
    where = region(model, tokens=tokens, layers=layers, heads=heads)
    device = torch.device(device)
    states = _hashes_before_dim(model, where, _start(seed, request_id), device)
    data = torch.empty(
        (*states.shape[:4], model.head_dim), dtype=torch_dtype(model.dtype), device=device
    )
    rows, flat = states.view(-1, 1), data.view(-1, model.head_dim)
    dims = torch.arange(model.head_dim, dtype=torch.int64, device=device).view(1, -1)
    # On the CPU in chunks that stay in its cache; a GPU's memory is fast and its launches
    # are not, so there the whole region is one chunk.
    whole = max(1, rows.shape[0])
    step = max(1, _CHUNK // model.head_dim) if device.type == "cpu" else whole
    for first in range(0, rows.shape[0], step):  # the last absorb and the values, in chunks
        chunk = slice(first, first + step)
        flat[chunk] = _values(absorb(rows[chunk], dims), model.dtype)
    scales = oracle_scales(model, layers=where.layers, seed=seed, device=device)
    return RequestKV(data, scales)


def oracle_hashes(
    model: ModelShape,
    request_id: str,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """The ORACLE-1 hashes of a region, int64 ``[layers, kv, tokens, heads, head_dim]``,
    before ORACLE-2 turns them into values: what a format with its own value rule (fp4,
    [ORACLE-8]) starts from."""
    where = region(model, tokens=tokens, layers=layers, heads=heads)
    device = torch.device(device)
    states = _hashes_before_dim(model, where, _start(seed, request_id), device)
    dims = torch.arange(model.head_dim, dtype=torch.int64, device=device)
    return absorb(states, dims)


@dataclass(frozen=True)
class Mismatch:
    """One element that differs from the oracle, in global coordinates [ORACLE-5]."""

    layer: int
    kv: str
    head: int
    token: int
    dim: int
    expected_bits: int
    got_bits: int


@dataclass(frozen=True)
class Verdict:
    """The result of checking KV against the oracle [ORACLE-5]."""

    request_id: str
    dtype: str
    total: int
    mismatches: int
    first: Mismatch | None
    scale_mismatches: int

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.scale_mismatches == 0

    @property
    def message(self) -> str:
        """One readable line: what was checked and, if wrong, where it first went wrong."""
        head = f"request {self.request_id!r}"
        if self.ok:
            return f"{head}: all {self.total} elements match the oracle bit for bit"
        parts = []
        if self.mismatches:
            f = self.first
            assert f is not None
            width = FLOAT_FORMATS[self.dtype].bits // 4
            parts.append(
                f"{self.mismatches} of {self.total} elements differ from the oracle; first at "
                f"layer {f.layer}, {f.kv}, head {f.head}, token {f.token}, dim {f.dim}: "
                f"expected bits 0x{f.expected_bits:0{width}x} "
                f"({_decode(f.expected_bits, self.dtype)!r}), got 0x{f.got_bits:0{width}x} "
                f"({_decode(f.got_bits, self.dtype)!r})"
            )
        if self.scale_mismatches:
            parts.append(f"{self.scale_mismatches} fp8 scales differ from the oracle's")
        return f"{head}: " + "; ".join(parts) + " [ORACLE-5]"


def _decode(bits: int, dtype: str) -> float:
    """The value an element's bits stand for, for messages."""
    carrier = raw_bits(torch.empty(1, dtype=torch_dtype(dtype))).dtype
    return torch.tensor([bits]).to(carrier).view(torch_dtype(dtype)).float().item()


def verify(
    kv: RequestKV,
    model: ModelShape,
    request_id: str,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
    seed: int = 0,
) -> Verdict:
    """Compare ``kv`` (covering the given global ranges) with the oracle, bit for bit [ORACLE-5].

    Returns the counts and the first mismatch; KV of another shape or dtype is refused.
    """
    where = region(model, tokens=tokens, layers=layers, heads=heads)
    check_request_kv(
        kv, model, layers=len(where.layers), heads=len(where.heads), where="KV under verification"
    )
    if kv.seq_len != len(where.tokens):
        shown = (
            where.tokens.describe()
            if isinstance(where.tokens, Tokens)
            else f"{where.tokens.start}..{where.tokens.stop - 1}"
        )
        raise ValueError(
            f"KV under verification has {kv.seq_len} tokens but the token range {shown} has "
            f"{len(where.tokens)} [ORACLE-5]"
        )
    expected = oracle_kv(
        model,
        request_id,
        tokens=where.tokens,
        layers=where.layers,
        heads=where.heads,
        seed=seed,
        device=kv.device,
    )
    want, got = raw_bits(expected.data), raw_bits(kv.data)
    differs = want != got
    mismatches = int(differs.sum())
    first = None
    if mismatches:
        flat = int(torch.argmax(differs.flatten().to(torch.uint8)))
        index = []
        for size in reversed(differs.shape):
            flat, i = divmod(flat, size)
            index.append(i)
        layer, k, token, head, dim = reversed(index)
        mask = (1 << FLOAT_FORMATS[model.dtype].bits) - 1
        first = Mismatch(
            layer=where.layers[layer],
            kv="latent" if model.attention == "mla" else "KV"[k],
            head=where.heads[head],
            token=where.token_list()[token],
            dim=dim,
            expected_bits=int(want[layer, k, token, head, dim]) & mask,
            got_bits=int(got[layer, k, token, head, dim]) & mask,
        )
    scale_mismatches = 0
    if expected.scales is not None and kv.scales is not None:
        scale_mismatches = int(
            (raw_bits(expected.scales) != raw_bits(kv.scales.to(kv.device))).sum()
        )
    return Verdict(request_id, model.dtype, differs.numel(), mismatches, first, scale_mismatches)
