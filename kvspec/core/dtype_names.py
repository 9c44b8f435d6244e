"""Cache dtypes by name [DTYPE-1]: the allow-list, each dtype's bit layout and width.

The spec names dtypes by strings (``"bfloat16"``) so that plans, reports and golden
vectors stay language-neutral. This module is all that topology arithmetic and the
``kvspec`` command line need of them, and it imports no torch: planning a transfer or
printing ``kvspec --help`` must not pay for loading it. :mod:`kvspec.tensors.dtypes`
maps the names to torch dtypes where tensors are made, and re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.core.require import show

DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""The allowed cache dtypes [DTYPE-1], in the order error messages list them."""

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


def check_dtype(name: object) -> str:
    """Return ``name`` if it names an allowed cache dtype [DTYPE-1]."""
    # The isinstance test first: an unhashable name (a list from untrusted JSON) must be
    # refused with this message, not a TypeError from the tuple lookup.
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}; got {show(name)}")
    return name


def itemsize(name: str) -> int:
    """Bytes per element of an allowed dtype [DTYPE-1]."""
    return FLOAT_FORMATS[check_dtype(name)].bits // 8
