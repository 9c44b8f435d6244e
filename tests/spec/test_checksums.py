"""The two checksum algorithms of the wire [WIRE-6, WIRE-7]: standard check values, the
compiled CRC-32C and the pure fallback agree, and a CRC continues across pieces."""

import os
import zlib

import pytest

from kvspec.transport import checksums


def test_check_values_are_the_standard_ones() -> None:
    # The "check" value of each CRC catalogue entry: the CRC of the ASCII bytes 123456789.
    assert checksums.crc32(b"123456789") == 0xCBF43926
    assert checksums.crc32c(b"123456789") == 0xE3069283
    assert checksums.crc32c_pure(b"123456789") == 0xE3069283


@pytest.mark.parametrize("size", [0, 1, 7, 4096 + 3])
def test_pure_fallback_matches_the_compiled_crc32c_and_continues(size: int) -> None:
    data = os.urandom(size)
    whole = checksums.crc32c_pure(data)
    assert checksums.crc32c(data) == whole
    cut = size // 3
    assert checksums.crc32c(data[cut:], checksums.crc32c(data[:cut])) == whole
    assert (
        checksums.crc32c_pure(memoryview(bytearray(data))[cut:], checksums.crc32c(data[:cut]))
        == whole
    )
    assert checksums.checksum_of("crc32c", [data[:cut], data[cut:]]) == whole
    assert checksums.checksum_of("crc32", [data[:cut], b"", data[cut:]]) == zlib.crc32(data)


def test_fastest_names_crc32c_only_when_compiled_code_computes_it() -> None:
    assert checksums.fastest() == ("crc32c" if checksums.FAST_CRC32C else "crc32")
    assert set(checksums.ALGORITHMS) == {"crc32", "crc32c"}
