"""Cache dtypes and bit-exact comparison [DTYPE-1, DTYPE-2].

Dtypes are named by strings (``"bfloat16"``) everywhere in the spec so that plans,
reports and golden vectors stay language-neutral; :func:`torch_dtype` turns a name
into the torch dtype only where tensors are made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec._checks import show
from kvspec.clause import Clause, must, refuses

CLAUSES = (
    Clause(
        "DTYPE-1",
        "Allowed cache dtypes",
        "A KV cache is float32, float16, bfloat16, float8_e4m3fn or float8_e5m2, named by "
        "these strings. Any other dtype is refused, with the allowed names listed.",
        obligations=(
            refuses(
                "a dtype name outside float32, float16, bfloat16, float8_e4m3fn and float8_e5m2"
            ),
            must("each of the five allowed dtypes is accepted"),
        ),
    ),
    Clause(
        "DTYPE-2",
        "Comparisons are bit-exact",
        "Two caches are equal when their shapes and dtypes are equal and their raw bits are "
        "equal element by element. NaN payloads and -0.0 must survive every path; no "
        "floating-point comparison is used.",
        obligations=(must("NaN payloads and -0.0 arrive bit for bit on every path"),),
    ),
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
"""The allowed cache dtypes by name [DTYPE-1]."""

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class FloatFormat:
    """The bit layout of a cache dtype: sign, then exponent (with its bias), then mantissa."""

    bits: int
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int


FLOAT_FORMATS: dict[str, FloatFormat] = {
    "float32": FloatFormat(32, 8, 23, 127),
    "float16": FloatFormat(16, 5, 10, 15),
    "bfloat16": FloatFormat(16, 8, 7, 127),
    "float8_e4m3fn": FloatFormat(8, 4, 3, 7),
    "float8_e5m2": FloatFormat(8, 5, 2, 15),
}
"""Bit layouts of the allowed dtypes [DTYPE-1]; the oracle builds values from them."""

# An integer dtype of the same width, to read a tensor's raw bits [DTYPE-2].
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def check_dtype(name: object) -> str:
    """Return ``name`` if it names an allowed cache dtype [DTYPE-1]."""
    # The isinstance test first: an unhashable name (a list from untrusted JSON) must be
    # refused with this message, not a TypeError from the dict lookup.
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {show(name)}")
    return name


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an allowed dtype name [DTYPE-1]."""
    return DTYPES[check_dtype(name)]


def dtype_name(dtype: torch.dtype) -> str:
    """The spec's name for a torch dtype; refuses dtypes outside the allow-list [DTYPE-1]."""
    for name, candidate in DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype}")


def itemsize(name: str) -> int:
    """Bytes per element of an allowed dtype."""
    return torch_dtype(name).itemsize


def raw_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, reinterpreted as integers of the same width [DTYPE-2]."""
    return tensor.contiguous().view(_BITS_DTYPE[tensor.element_size()])


def bits_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of the same width, sharing its storage [DTYPE-2].

    Unlike :func:`raw_bits` this never copies, whatever the strides, so writing into
    the result writes the tensor: data is moved as bits, never as floating-point values.
    """
    return tensor.view(_BITS_DTYPE[tensor.element_size()])


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape, dtype and raw bits [DTYPE-2].

    Tensors on different devices are compared on ``a``'s device.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(raw_bits(a), raw_bits(b.to(a.device))))
