"""The checksums a message may carry: CRC-32 (zlib's) and CRC-32C (Castagnoli) [WIRE-6, WIRE-7].

Both are 32-bit cyclic redundancy checks: each detects every single-bit flip and every
burst of up to 32 bits, which a non-cryptographic hash (xxHash and the like) does not
promise. They differ in the polynomial and in who computes them fast:

- ``crc32``: IEEE 802.3, polynomial 0x04C11DB7 (reflected 0xEDB88320), ``zlib.crc32``.
  Always there; about 3 GB/s on a 2-core x86 machine (``python -m benchmarks``).
- ``crc32c``: iSCSI (RFC 3720, section 12.1), polynomial 0x1EDC6F41 (reflected
  0x82F63B78), the one SSE 4.2's ``crc32`` instruction and ARMv8's ``crc32c*``
  instructions compute. The ``crc32c`` package on PyPI (ICRAR, binary wheels; its
  ``crc32c.crc32c(data, value=0)`` takes any buffer and an initial value, and
  ``crc32c.hardware_based`` tells whether the instruction is used) runs it at about
  10 GB/s on the same machine. Without the package, :func:`crc32c` falls back on a
  table-driven pure-Python loop: correct, and far too slow for bulk data, so
  :func:`fastest` then names ``crc32``.

The check value of both for the nine ASCII bytes ``123456789`` is the standard one:
0xCBF43926 for CRC-32, 0xE3069283 for CRC-32C.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

_crc32c_package: ModuleType | None
try:  # pragma: no cover - which branch runs depends on the environment
    import crc32c as _crc32c_package
except ImportError:  # pragma: no cover
    _crc32c_package = None

Checksum = Callable[[Any, int], int]
"""``checksum(data, value)``: the CRC of ``data`` continuing from ``value`` (0 to start)."""

_POLY_C = 0x82F63B78  # CRC-32C, reflected (RFC 3720 section 12.1)


def _table(poly: int) -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE_C = _table(_POLY_C)


def crc32c_pure(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` (any bytes-like object) from ``value``, in pure Python: the
    fallback when the ``crc32c`` package is absent (a few MB/s)."""
    crc = value ^ 0xFFFFFFFF
    table = _TABLE_C
    for byte in memoryview(data).cast("B"):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_package_call(data: Any, value: int = 0) -> int:
    assert _crc32c_package is not None
    return _crc32c_package.crc32c(data, value)


FAST_CRC32C = _crc32c_package is not None
"""Whether CRC-32C is computed by compiled code (the ``crc32c`` package): hardware where
the CPU has the instruction, else its C slicing-by-8."""

crc32c: Checksum = _crc32c_package_call if FAST_CRC32C else crc32c_pure


def crc32c_hardware() -> bool:
    """Whether the CPU's CRC-32C instruction computes :func:`crc32c` (``crc32c.hardware_based``)."""
    return bool(FAST_CRC32C and getattr(_crc32c_package, "hardware_based", False))


"""CRC-32C of a bytes-like object, from an initial value [WIRE-7]."""


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 (zlib's, IEEE 802.3) of a bytes-like object, from an initial value [WIRE-6]."""
    return zlib.crc32(data, value)


ALGORITHMS: dict[str, Checksum] = {"crc32": crc32, "crc32c": crc32c}
"""Each algorithm by the header key that carries its values [WIRE-6, WIRE-7]."""


def fastest() -> str:
    """The algorithm a sender should use here: ``crc32c`` when compiled code computes it,
    else ``crc32`` (a pure-Python CRC-32C would be the slowest part of the path)."""
    return "crc32c" if FAST_CRC32C else "crc32"


def checksum_of(algorithm: str, frames: Any) -> int:
    """One CRC (by ``algorithm``) over several bytes-like frames in order, as if joined."""
    fn = ALGORITHMS[algorithm]
    value = 0
    for frame in frames:
        value = fn(frame, value)
    return value
