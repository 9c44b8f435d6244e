"""The reference representation of one request's KV cache, with its fp8 scales.

A :class:`RequestKV` holds ``data`` of shape ``[layers, kv, seq_len, heads, head_dim]``
(``kv`` = 2 for K and V, 1 for an MLA latent [MODEL-2]) for a contiguous range of
global layers and heads, and, for fp8 models, ``scales`` of shape ``[layers, kv]``
(one float32 scale per layer for K and for V) [DTYPE-3]. The whole model's KV, a
rank's shard and what travels on an edge are all RequestKVs; which layers and heads
a value covers is known from context (the plan), not stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int
from kvspec.tensors.dtypes import FP8_DTYPES, bit_equal, raw_bits, torch_dtype
from kvspec.topology.model import ModelShape

CLAUSES = (
    Clause(
        "DTYPE-3",
        "fp8 caches carry their scales",
        "An fp8 cache travels with its scales: one float32 scale for K and one for V per "
        "layer, identical on every rank that holds the layer (an MLA latent has one per "
        "layer). KV of an fp8 model without scales, with scales of another shape or dtype, "
        "or KV of another dtype with scales, is refused; two senders' scales for the same "
        "layer must be bit-equal.",
        obligations=(
            must("an fp8 transfer delivers every layer's K and V scales bit for bit with the data"),
            refuses("two senders' scales for one layer that differ, in K alone or in V alone"),
            refuses("fp8 KV without scales"),
            refuses("KV of a non-fp8 dtype that carries scales"),
        ),
    ),
)

SCALES_DTYPE = torch.float32


@dataclass(frozen=True)
class RequestKV:
    """One request's KV for a range of layers and heads [RESHARD-1, DTYPE-3]."""

    data: torch.Tensor
    scales: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        return self.data.shape[2]

    @property
    def device(self) -> torch.device:
        return self.data.device

    def layer_slice(self, start: int, stop: int) -> RequestKV:
        """Layers ``start..stop-1`` of this value (indices relative to its first layer)."""
        scales = None if self.scales is None else self.scales[start:stop]
        return RequestKV(self.data[start:stop], scales)

    def head_slice(self, start: int, stop: int) -> RequestKV:
        """Heads ``start..stop-1`` (relative); scales are per layer and stay whole."""
        return RequestKV(self.data[:, :, :, start:stop], self.scales)

    def to(self, device: str | torch.device) -> RequestKV:
        scales = None if self.scales is None else self.scales.to(device)
        return RequestKV(self.data.to(device), scales)


def full_shape(model: ModelShape, seq_len: int) -> tuple[int, int, int, int, int]:
    """Shape of the whole model's KV for one request [RESHARD-1]."""
    require_int("seq_len", seq_len, minimum=0)
    return (model.num_layers, model.kv_tensors, seq_len, model.num_kv_heads, model.head_dim)


def check_request_kv(
    kv: RequestKV, model: ModelShape, *, layers: int, heads: int, where: str
) -> None:
    """Refuse KV whose shape, dtype or scales do not fit ``model`` [RESHARD-3, DTYPE-3].

    ``layers`` and ``heads`` are the counts expected; ``where`` names the value in errors.
    """
    expected = [layers, model.kv_tensors, None, heads, model.head_dim]
    data = kv.data
    if data.dim() != 5 or any(
        e is not None and e != n for e, n in zip(expected, data.shape, strict=True)
    ):
        shown = ["seq" if e is None else e for e in expected]
        raise ValueError(
            f"{where}: expected data of shape {shown} ([layers, kv, seq, heads, head_dim] for "
            f"{model.describe()}), got {list(data.shape)} [RESHARD-3]"
        )
    if data.dtype != torch_dtype(model.dtype):
        raise ValueError(f"{where}: dtype {data.dtype} != model dtype {model.dtype} [RESHARD-3]")
    check_scales(kv.scales, model.dtype, layers=layers, kv_tensors=model.kv_tensors, where=where)


def check_scales(
    scales: torch.Tensor | None, dtype: str, *, layers: int, kv_tensors: int, where: str
) -> None:
    """Refuse scales that do not fit a ``dtype`` cache of ``layers`` layers [DTYPE-3].

    fp8 needs float32 scales ``[layers, kv_tensors]``; every other dtype needs none.
    """
    if dtype not in FP8_DTYPES:
        if scales is not None:
            raise ValueError(
                f"{where}: scales given for a {dtype} cache; only fp8 caches carry scales [DTYPE-3]"
            )
        return
    if scales is None:
        raise ValueError(
            f"{where}: an {dtype} cache must carry its per-layer K/V scales; none given [DTYPE-3]"
        )
    want = [layers, kv_tensors]
    if list(scales.shape) != want or scales.dtype != SCALES_DTYPE:
        raise ValueError(
            f"{where}: scales must be float32 of shape {want} ([layers, kv]); got "
            f"{scales.dtype} {list(scales.shape)} [DTYPE-3]"
        )


def random_request_kv(
    model: ModelShape, seq_len: int, *, seed: int = 0, device: str | torch.device = "cpu"
) -> RequestKV:
    """The whole model's KV of random bits (NaN payloads and -0.0 included) [DTYPE-2].

    fp8 models get random positive scales.
    """
    dtype = torch_dtype(model.dtype)
    bits_dtype = raw_bits(torch.empty(0, dtype=dtype)).dtype
    info = torch.iinfo(bits_dtype)
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(
        info.min, info.max, full_shape(model, seq_len), dtype=bits_dtype, generator=generator
    )
    scales = None
    if model.dtype in FP8_DTYPES:
        shape = (model.num_layers, model.kv_tensors)
        scales = torch.rand(shape, generator=generator, dtype=SCALES_DTYPE) + 0.5
        scales = scales.to(device)
    return RequestKV(bits.view(dtype).to(device), scales)


def kv_equal(a: RequestKV, b: RequestKV) -> bool:
    """Bit-exact equality of data and scales [DTYPE-2, DTYPE-3]."""
    if (a.scales is None) != (b.scales is None):
        return False
    if a.scales is not None and b.scales is not None and not bit_equal(a.scales, b.scales):
        return False
    return bit_equal(a.data, b.data)
