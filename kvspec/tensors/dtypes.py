"""Cache dtypes and bit-exact comparison [DTYPE-1, DTYPE-2].

Dtypes are named by strings (``"bfloat16"``) everywhere in the spec so that plans,
reports and golden vectors stay language-neutral; :func:`torch_dtype` turns a name
into the torch dtype only where tensors are made. The names, bit layouts and widths
themselves live in the torch-free :mod:`kvspec.core.dtype_names` (re-exported here),
so topology arithmetic never loads torch.
"""

from __future__ import annotations

import torch

from kvspec.core.clause import Clause, accepts, must, refuses
from kvspec.core.dtype_names import (
    DTYPE_NAMES,
    FLOAT_FORMATS,
    FP8_DTYPES,
    FloatFormat,
    check_dtype,
    itemsize,
)

__all__ = [
    "CLAUSES",
    "DTYPES",
    "DTYPE_NAMES",
    "FLOAT_FORMATS",
    "FP8_DTYPES",
    "FloatFormat",
    "bit_equal",
    "bits_view",
    "check_dtype",
    "dtype_name",
    "itemsize",
    "raw_bits",
    "torch_dtype",
]

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
            accepts("each of the five allowed dtypes is accepted"),
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

# An integer dtype of the same width, to read a tensor's raw bits [DTYPE-2].
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an allowed dtype name [DTYPE-1]."""
    return DTYPES[check_dtype(name)]


def dtype_name(dtype: torch.dtype) -> str:
    """The spec's name for a torch dtype; refuses dtypes outside the allow-list [DTYPE-1]."""
    for name, candidate in DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype}")


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
