"""The layouts family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [LAYOUT].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "layout-unknown-name",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [2, 3, 4, 2, 8], "layout": "vllm_paged"},
        r"unknown cache layout 'vllm_paged'; the layouts are flash_attn, flash_attn_hnd, ",
    ),
    ErrorCase(
        "layout-kv-axis-not-2",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [3, 4, 16, 2, 8], "layout": "flash_attn"},
        r"K/V axis of size 2 at dim 0; got tensor of shape \[3, 4, 16, 2, 8\]",
    ),
    ErrorCase(
        "layout-tuple-of-three",
        "LAYOUT-1",
        "cache_shape",
        {"shapes": [[3, 16, 2, 8]] * 3, "layout": "kv_tuple"},
        r"kv_tuple cache .* is a tuple of 2 tensors; got tuple of 3",
    ),
    ErrorCase(
        "layout-stated-heads-differ",
        "LAYOUT-1",
        "cache_shape",
        {"shape": [3, 2, 16, 2, 8], "layout": "flashinfer", "heads": 4},
        r"read as flashinfer .* has heads 2 != stated 4",
    ),
    ErrorCase(
        "layout-kv-to-latent",
        "LAYOUT-3",
        "convert_layout",
        {"shape": [2, 3, 16, 1, 8], "source": "flash_attn", "target": "mla"},
        r"layout mla .* holds one latent per layer but the cache holds K and V",
    ),
    ErrorCase(
        "layout-block-size-not-dividing",
        "LAYOUT-3",
        "convert_layout",
        {"shape": [2, 3, 16, 2, 8], "source": "flash_attn", "target": "kv_tuple", "block_size": 32},
        r"cannot re-block 3 blocks of 16 slots \(48 slots\) into blocks of 32",
    ),
    ErrorCase(
        "detect-stacked-two-blocks",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 2, 16, 4, 8], "heads": 4, "head_dim": 8, "block_size": 16},
        r"ambiguous: it fits 2 layouts: flash_attn \(num_blocks=2, block_size=16, heads=4\); "
        r"flashinfer \(num_blocks=2, block_size=16, heads=4\).*name the layout",
    ),
    ErrorCase(
        "detect-heads-equal-block-size",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 5, 4, 4, 8], "heads": 4, "head_dim": 8},
        r"fits 2 layouts: flash_attn .*; flash_attn_hnd .*one of 'flash_attn', 'flash_attn_hnd'",
    ),
    ErrorCase(
        "detect-heads-unstated",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [2, 5, 16, 2, 8]},
        r"flash_attn \(num_blocks=5, block_size=16, heads=2\); "
        r"flash_attn_hnd \(num_blocks=5, block_size=2, heads=16\)",
    ),
    ErrorCase(
        "detect-no-layout-fits",
        "LAYOUT-4",
        "detect_layout",
        {"shape": [3, 3, 16, 4, 8], "heads": 4, "head_dim": 8},
        r"tensor of shape \[3, 3, 16, 4, 8\] with heads=4, head_dim=8 fits no cache layout",
    ),
)
