"""Mutants of the coordinate-hash oracle and its verifier [ORACLE-1..5].

The hash mutants re-derive the fill from the clause text with one transcription slip:
coordinates absorbed in another order, a local index, an exponent off by one.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import FLOAT_FORMATS, raw_bits, torch_dtype
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import absorb, mix, oracle_kv, oracle_scales, request_value, verify
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens


def _axis(r: range, dim: int, device) -> torch.Tensor:
    shape = [1, 1, 1, 1, 1]
    shape[dim] = len(r)
    return torch.arange(r.start, r.stop, dtype=torch.int64, device=device).view(shape)


def _fill(
    model: ModelShape,
    request_id: str,
    *,
    tokens: range,
    layers: range,
    heads: range,
    seed: int,
    order: tuple[str, ...] = ("kv", "head", "token"),
    exponent_shift: int = 4,
    mla_kv: bool = False,
) -> torch.Tensor:
    """The fill written out from ORACLE-1/2, with the order of kv, head and token and the
    exponent's offset as parameters (the clause: kv, head, token; minus 4)."""
    device = torch.device("cpu")
    start = absorb(mix(seed % 2_147_483_647), request_value(request_id))
    h = absorb(torch.full((1,) * 5, start, dtype=torch.int64), _axis(layers, 0, device))
    axes = {"kv": (range(model.kv_tensors), 1), "head": (heads, 3), "token": (tokens, 2)}
    for name in order:
        if model.attention == "mla" and (name == "head" or (name == "kv" and not mla_kv)):
            continue
        h = absorb(h, _axis(*axes[name], device))
    h = absorb(h, _axis(range(model.head_dim), 4, device))
    shape = (len(layers), model.kv_tensors, len(tokens), len(heads), model.head_dim)
    h = h.expand(shape).contiguous()
    fmt = FLOAT_FORMATS[model.dtype]
    sign = h & 1
    exponent = ((h >> 1) & 7) - exponent_shift + fmt.exponent_bias
    mantissa = (h >> 4) & ((1 << fmt.mantissa_bits) - 1)
    bits = (sign << (fmt.bits - 1)) | (exponent << fmt.mantissa_bits) | mantissa
    carrier = raw_bits(torch.empty(0, dtype=torch_dtype(model.dtype))).dtype
    if carrier.is_signed:
        bits = torch.where(bits >= 1 << (fmt.bits - 1), bits - (1 << fmt.bits), bits)
    return bits.to(carrier).view(torch_dtype(model.dtype))


class _HandWrittenOracle(ReferenceAdapter):
    """The reference's checks of the region, then :func:`_fill` with the class's slip."""

    slip: ClassVar[dict[str, Any]] = {}  # _fill's keyword arguments

    def oracle_fill(self, model, request_id, **region):
        expected = super().oracle_fill(model, request_id, **region)  # refuses bad regions
        data = _fill(model, request_id, **region, **self.slip)
        return RequestKV(data.to(expected.data.device), expected.scales)


@mutant("ORACLE-1.1")
class OracleIgnoresRequestId(ReferenceAdapter):
    """Fills every request alike."""

    def oracle_fill(self, model, request_id, **region):
        return super().oracle_fill(model, "same-for-all", **region)


@mutant("ORACLE-1.1")
class TokenAbsorbedBeforeHead(_HandWrittenOracle):
    """Absorbs the token before the head (the order a token-major loop suggests)."""

    slip: ClassVar[dict[str, object]] = {"order": ("kv", "token", "head")}


@mutant("ORACLE-1.1")
class MlaAbsorbsKv(_HandWrittenOracle):
    """Absorbs kv = 0 for an MLA latent too, as if it were K."""

    slip: ClassVar[dict[str, object]] = {"mla_kv": True}


@mutant("ORACLE-2.1")
class ExponentOffByOne(_HandWrittenOracle):
    """Builds the exponent as ((h >> 1) & 7) - 3, values in [1/8, 32)."""

    slip: ClassVar[dict[str, object]] = {"exponent_shift": 3}


@mutant("ORACLE-3.1")
class ScalesPerRequest(ReferenceAdapter):
    """Hashes the request id into the fp8 scales, so each request gets its own."""

    def oracle_fill(self, model, request_id, **region):
        kv = super().oracle_fill(model, request_id, **region)
        if kv.scales is None:
            return kv
        h = absorb(mix(region["seed"] % 2_147_483_647), request_value(request_id))
        scales = oracle_scales(model, layers=region["layers"], seed=int(h))
        return RequestKV(kv.data, scales)


@mutant("ORACLE-3.1")
class ScalesOfWholeModel(ReferenceAdapter):
    """Returns the scales of every layer of the model, whatever layers were asked for."""

    def oracle_fill(self, model, request_id, **region):
        kv = super().oracle_fill(model, request_id, **region)
        if kv.scales is None:
            return kv
        return RequestKV(kv.data, oracle_scales(model, seed=region["seed"]))


@mutant("ORACLE-4.1")
class LocalTokenIndex(ReferenceAdapter):
    """Hashes a region's tokens from 0 (local index) instead of their global position."""

    def oracle_fill(self, model, request_id, *, tokens, **region):  # type: ignore[override]  # Adapter's keywords, not the reference's **region
        super().oracle_fill(model, request_id, tokens=tokens, **region)  # refuses bad regions
        return super().oracle_fill(model, request_id, tokens=range(len(tokens)), **region)


@mutant("ORACLE-4.1")
class LocalHeadIndex(ReferenceAdapter):
    """Hashes a region's heads from 0: a rank's first head is hashed as head 0."""

    def oracle_fill(self, model, request_id, *, heads, **region):  # type: ignore[override]  # Adapter's keywords, not the reference's **region
        expected = super().oracle_fill(model, request_id, heads=heads, **region)
        local = super().oracle_fill(model, request_id, heads=range(len(heads)), **region)
        return RequestKV(local.data, expected.scales)


@mutant("ORACLE-4.2")
class ClampsRegionToModel(ReferenceAdapter):
    """Clamps a region that reaches past the model (or below 0) to the model's ranges."""

    def oracle_fill(self, model, request_id, *, tokens, layers, heads, **rest):  # type: ignore[override]  # Adapter's keywords, not the reference's **region
        def clamp(r: range, limit: int | None) -> range:
            stop = r.stop if limit is None else min(r.stop, limit)
            return range(max(0, r.start), max(max(0, r.start), stop))

        return super().oracle_fill(
            model,
            request_id,
            tokens=clamp(tokens, None),
            layers=clamp(layers, model.num_layers),
            heads=clamp(heads, model.num_kv_heads),
            **rest,
        )


@mutant("ORACLE-5.1")
class VerifiesWithTolerance(ReferenceAdapter):
    """Compares values with ``torch.isclose`` (rtol 1e-2): a flipped low bit passes."""

    def oracle_verify(self, kv, model, request_id, **region):
        verdict = verify(kv, model, request_id, **region)  # the same refusals
        want = super().oracle_fill(model, request_id, **region)
        close = torch.isclose(kv.data.float(), want.data.float(), rtol=1e-2, atol=0)
        return int((~close).sum()) + verdict.scale_mismatches


@mutant("ORACLE-5.1")
class VerifiesKeysOnly(ReferenceAdapter):
    """Verifies K (or the latent) and forgets V."""

    def oracle_verify(self, kv, model, request_id, **region):
        verdict = verify(kv, model, request_id, **region)
        want = super().oracle_fill(model, request_id, **region)
        differs = raw_bits(kv.data[:, :1]) != raw_bits(want.data[:, :1])
        return int(differs.sum()) + verdict.scale_mismatches


@mutant("ORACLE-5.2")
class VerifierIgnoresScales(ReferenceAdapter):
    """Verifies every element and never looks at the fp8 scales."""

    def oracle_verify(self, kv, model, request_id, **region):
        return verify(kv, model, request_id, **region).mismatches


@mutant("ORACLE-5.3")
class VerifiesTheOverlap(ReferenceAdapter):
    """Compares what overlaps: KV a token short, or of another dtype (cast), is checked."""

    def oracle_verify(self, kv, model, request_id, *, tokens, **region):  # type: ignore[override]  # Adapter's keywords, not the reference's **region
        if kv.data.dtype != torch_dtype(model.dtype):
            kv = RequestKV(kv.data.to(torch_dtype(model.dtype)), kv.scales)
        if kv.data.dim() == 5 and kv.data.shape[2] < len(tokens):
            tokens = range(tokens.start, tokens.start + kv.data.shape[2])
        return super().oracle_verify(kv, model, request_id, tokens=tokens, **region)


@mutant("ORACLE-4.3")
class TokenSetFilledByPosition(ReferenceAdapter):
    """Fills a token set by its local positions 0..n-1, the classic context-parallel oracle
    bug: every rank fills the request's first tokens."""

    def oracle_fill(self, model: ModelShape, request_id: str, **region: Any) -> RequestKV:
        tokens = region["tokens"]
        if isinstance(tokens, Tokens):
            region = {**region, "tokens": range(len(tokens))}
        return oracle_kv(model, request_id, **region)
