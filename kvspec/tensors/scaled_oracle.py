"""The oracle's values of block-scaled formats: packed fp4 and e8m0 scales [ORACLE-8].

ORACLE-2 turns a hash into a normal value of a float dtype with a 3-bit exponent window;
fp4 (e2m1: a sign, 2 exponent bits, 1 mantissa bit) has no room for it, and an e8m0
scale (UE8M0, the OCP MX scale: a power of two, no sign, no mantissa) has no sign or
mantissa to set. This module states both, and how two fp4 values share a byte as vLLM's
NVFP4 pages and FlashInfer's writer keep them, so that every byte of a block-scaled
cache has a value any receiver can recompute [ORACLE-4, ORACLE-6].
"""

from __future__ import annotations

import torch

from kvspec.core.clause import Clause, must

FOUR_BIT = "float4_e2m1fn_x2"
"""Two fp4 (e2m1) values a byte, value 2i in the low nibble [ORACLE-8]."""

E8M0 = "float8_e8m0fnu"
"""An exponent-only 8-bit scale (UE8M0, the OCP MX scale type) [ORACLE-8]."""

CLAUSES = (
    Clause(
        "ORACLE-8",
        "fp4 and e8m0 values, two fp4 values a byte",
        "From hash h [ORACLE-1]: an fp4 (e2m1) value's 4 bits are h & 15, except that a zero "
        "magnitude (bits & 7 == 0) becomes bits | 1 (0.5), so no value is +0 or -0; an e8m0 "
        "(UE8M0) value's byte is 123 + ((h >> 1) & 7), the power of two 2**(((h >> 1) & 7) - "
        "4), never 0xFF (NaN). A float4_e2m1fn_x2 element is a byte holding fp4 value 2i in "
        "its low nibble and value 2i + 1 in its high nibble, as FlashInfer's NVFP4 writer packs "
        "them; a field of w such bytes holds 2w values. In a record [ORACLE-6], an fp4 field k "
        "or v holds ORACLE-1's K or V hashes of the cell (dim = the value's index, 0 .. "
        "head_dim - 1) as fp4 values; any other fp4 or e8m0 field's value j is ORACLE-6's hash "
        "of (seed, request, field name, layer, head, token, j) as a value of its format.",
        obligations=(
            must(
                "an fp4 value's bits are h & 15 with a zero magnitude made 0.5; an e8m0 value's "
                "byte is 123 + ((h >> 1) & 7)"
            ),
            must("a float4_e2m1fn_x2 byte holds value 2i in its low nibble, 2i + 1 in its high"),
            must("fp4 fields k and v hold ORACLE-1's K and V hashes of the cell, as fp4 values"),
        ),
    ),
)


def fp4_codes(h: torch.Tensor) -> torch.Tensor:
    """Hashes as fp4 (e2m1) codes 0..15, never a zero magnitude [ORACLE-8.1]."""
    bits = h & 15
    return torch.where((bits & 7) == 0, bits | 1, bits).to(torch.uint8)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """fp4 codes [..., 2w] as w bytes: value 2i in the low nibble, 2i + 1 in the high
    [ORACLE-8.2]."""
    if codes.shape[-1] % 2:
        raise ValueError(f"{codes.shape[-1]} fp4 values do not fill whole bytes [ORACLE-8]")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The fp4 codes [..., 2w] of w packed bytes, value 2i from the low nibble [ORACLE-8.2]."""
    low, high = packed & 15, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


def e8m0_bytes(h: torch.Tensor) -> torch.Tensor:
    """Hashes as e8m0 scale bytes: powers of two from 2**-4 to 2**3 [ORACLE-8.1]."""
    return (123 + ((h >> 1) & 7)).to(torch.uint8)


def scaled_values(h: torch.Tensor, dtype: str) -> torch.Tensor:
    """Hashes ``[..., n]`` as the bytes of a block-scaled field: n e8m0 scales, or n fp4
    values packed into n / 2 bytes [ORACLE-8]."""
    if dtype == FOUR_BIT:
        return pack_fp4(fp4_codes(h))
    if dtype == E8M0:
        return e8m0_bytes(h)
    raise ValueError(f"{dtype} is not a block-scaled format [ORACLE-8]")


def values_per_element(dtype: str) -> int:
    """Oracle values one stored element of ``dtype`` holds: 2 for packed fp4, else 1."""
    return 2 if dtype == FOUR_BIT else 1
