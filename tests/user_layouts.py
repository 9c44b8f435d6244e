"""A cache layout file as a user writes one for an engine of their own: K then V packed in
the last axis, heads outside the block's slots (the bytes of vLLM's ``vllm_packed_hnd``),
shared by the tests of the file format and of the commands that take a file [LAYOUT-5]."""

from __future__ import annotations

from typing import Any


def engine_hnd(name: str) -> dict[str, Any]:
    """The layout file named ``name``, as JSON data."""
    return {
        "kind": "cache",
        "name": name,
        "shape": "[num_blocks, heads, block_size, 2*head_dim] (K | V in the last axis)",
        "axes": ["blocks", "heads", "slots", "dim"],
        "logical": ["blocks", "slots", "heads", "dim"],
        "kv_tensors": 2,
        "tuple_form": False,
        "record": [{"name": "k"}, {"name": "v"}],
        "source": {
            "project": "an-engine",
            "file": "engine/cache.py: allocate_kv",
            "version": "2.1",
            "confirmed": "K then V in the last axis, heads outside block slots",
            "unconfirmed": "the page padding",
        },
    }
