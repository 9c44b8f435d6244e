"""The models family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [MODEL].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import M

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "transfer-mismatched-models",
        "MODEL-3",
        "transfer",
        {
            "source": {"tp": 2},
            "target": {"tp": 2},
            "model": M,
            "target_model": {**M, "num_kv_heads": 8},
        },
        r"num_kv_heads: source 4 != target 8",
    ),
    ErrorCase(
        "model-zero-layers",
        "MODEL-1",
        "model",
        {**M, "num_layers": 0},
        r"num_layers must be >= 1, got 0",
    ),
    ErrorCase(
        "model-unknown-attention",
        "MODEL-1",
        "model",
        {**M, "attention": "sparse"},
        r"attention must be one of 'mha', 'mla'; got 'sparse'",
    ),
    ErrorCase(
        "scale-format-without-fp8",
        "MODEL-1",
        "model",
        {**M, "scale_format": "per_layer"},
        r"scale_format is only for fp8 dtypes.*got 'per_layer'",
    ),
    ErrorCase(
        "mla-with-heads",
        "MODEL-2",
        "model",
        {**M, "attention": "mla"},
        r"MLA cache has no head axis.*num_kv_heads=4",
    ),
    ErrorCase(
        "mismatched-model-facts",
        "MODEL-3",
        "compatible",
        {"source": M, "target": {**M, "num_layers": 5, "head_dim": 16, "dtype": "float16"}},
        r"disagree on 3 model fact\(s\)(?s:.*)num_layers: source 4 != target 5"
        r"(?s:.*)head_dim: source 8 != target 16"
        r"(?s:.*)dtype: source 'bfloat16' != target 'float16'",
    ),
)
