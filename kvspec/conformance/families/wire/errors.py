"""The wire family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [WIRE].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import wire_message

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "wire-not-json",
        "WIRE-1",
        "decode",
        {"frames_hex": ["7b2261"]},
        r"the header is not JSON",
    ),
    ErrorCase(
        "wire-future-version",
        "WIRE-1",
        "decode",
        wire_message(version=2),
        r"unsupported version 2; this decoder reads version 1",
    ),
    ErrorCase(
        "wire-dtype-outside-allow-list",
        "WIRE-3",
        "decode",
        wire_message(tensors__0__dtype="float64"),
        r"tensors\[0\]\.dtype must be one of float32, .* got 'float64'",
    ),
    ErrorCase(
        "wire-negative-dimension",
        "WIRE-3",
        "decode",
        wire_message(tensors__1__shape=[1, -1, 1]),
        r"tensors\[1\]\.shape\[1\] must be an integer >= 0, got -1",
    ),
    ErrorCase(
        "wire-frame-length-disagrees",
        "WIRE-3",
        "decode",
        wire_message(tensors__1__shape=[1, 1, 2]),
        r"frame 2 has 4 bytes but tensors\[1\] declares float32 \[1, 1, 2\] = 8 bytes",
    ),
    ErrorCase(
        "wire-huge-declared-shape",
        "WIRE-2",
        "decode",
        wire_message(tensors__0__shape=[2**40, 2**40, 2**40]),
        r"tensors\[0\]\.shape \[1099511627776, .*\] of float32 exceeds max_total_bytes",
    ),
    ErrorCase(
        "wire-frame-missing",
        "WIRE-3",
        "decode",
        {**wire_message(), "frame_bytes": [4]},
        r"the header lists 2 tensors but 1 tensor frames follow it",
    ),
    ErrorCase(
        "wire-header-over-limit",
        "WIRE-2",
        "decode",
        {**wire_message(), "limits": {"max_header_bytes": 64}},
        r"decode: over the limits: a \d+-byte header > max_header_bytes 64",
    ),
    ErrorCase(
        "wire-too-many-layers",
        "WIRE-2",
        "decode",
        wire_message(metadata__num_layers=10**9),
        r"metadata\.num_layers must be an integer 1\.\.1024, got 1000000000",
    ),
)
