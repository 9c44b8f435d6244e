"""The chunks family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [CHUNK].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "chunk-missing",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False], [2, 8, 10, True]]},
        r"missing tokens 4\.\.7; missing chunk ids \[1\]",
    ),
    ErrorCase(
        "chunk-final-missing",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False]]},
        r"missing the final chunk \(tokens from 4 on\)",
    ),
    ErrorCase(
        "chunk-overlap",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, False], [1, 2, 6, True]]},
        r"chunk 0 \(tokens 0\.\.3\) and chunk 1 \(tokens 2\.\.5\) overlap on tokens 2\.\.3",
    ),
    ErrorCase(
        "chunk-repeated",
        "CHUNK-2",
        "reassemble",
        {"chunks": [[0, 0, 4, True], [0, 0, 4, True]]},
        r"chunk 0 arrived 2 times",
    ),
)
