"""What the groups and oracle families share to draw hybrid models: a model's plain data
with its own attention and 1-3 other layer groups of every kind (:func:`hybrid_model`),
one group's (:func:`group_data`), and the TP sizes of the adapter's domain every drawn
state fits (:func:`hybrid_tp_sizes`) [GROUP, STATE, ORACLE-7].
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.testing.strategies import TP_SIZES

_STATE_TP = (1, 2, 4)
"""TP sizes every drawn state fits (units are powers of two)."""


def hybrid_tp_sizes(adapter: Adapter) -> list[int]:
    """The domain's TP sizes that every drawn state fits, or [1]."""
    pairs = {t for pair in adapter.domain.pairs() for t in pair} & set(TP_SIZES) & set(_STATE_TP)
    return sorted(pairs) or [1]


@st.composite
def group_data(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """One group's plain data; units are powers of two so every TP of 1, 2, 4 holds them."""
    pow2 = st.sampled_from([1, 2, 4, 8])
    if kind in ("full", "draft", "sliding", "chunked"):
        mla = kind == "draft" and draw(st.booleans())
        data: dict[str, Any] = {
            "kind": kind,
            "num_kv_heads": 1 if mla else draw(pow2),
            "head_dim": draw(st.integers(1, 8)),
            "attention": "mla" if mla else "mha",
        }
        if kind == "sliding":
            data["window"] = draw(st.integers(1, 40))
        if kind == "chunked":
            data["chunk"] = draw(st.integers(1, 40))
        return data
    if kind == "mamba1":
        return {
            "kind": kind,
            "intermediate_size": draw(st.sampled_from([4, 8, 16])),
            "d_state": draw(st.integers(1, 3)),
            "conv_kernel": draw(st.integers(2, 4)),
        }
    if kind == "mamba2":
        groups = draw(pow2)
        return {
            "kind": kind,
            "num_heads": groups * draw(st.sampled_from([1, 2, 4])),
            "head_dim": draw(st.integers(1, 3)),
            "n_groups": groups,
            "d_state": draw(st.integers(1, 3)),
            "conv_kernel": draw(st.integers(2, 4)),
            "num_spec": draw(st.integers(0, 1)),
            "ssm_dtype": draw(st.sampled_from([None, "float32"])),
        }
    if kind == "none":
        return {"kind": kind}  # an MLP-only layer: nothing moves [GROUP-2]
    k_heads = draw(pow2)
    return {
        "kind": "gdn",
        "num_k_heads": k_heads,
        "num_v_heads": k_heads * draw(st.sampled_from([1, 2])),
        "head_k_dim": draw(st.integers(1, 3)),
        "head_v_dim": draw(st.integers(1, 3)),
        "conv_kernel": draw(st.integers(2, 4)),
        "num_spec": draw(st.integers(0, 1)),  # speculative conv rows [STATE-1]
    }


KINDS = ("sliding", "draft", "full", "mamba1", "mamba2", "gdn", "none")
"""The layer-group kinds a hybrid is drawn of, MLP-only layers (``none``) among them
(chunked local attention left out, so the examples the older checks draw stay as they
were; the LOCAL checks draw it) [GROUP, STATE, WINDOW]."""
STATES = ("mamba1", "mamba2", "gdn")
"""The state kinds [STATE]."""


@st.composite
def hybrid_model(draw: st.DrawFn, kinds: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A hybrid model's plain data: its own attention and 1-3 other groups of ``kinds``
    (:data:`KINDS`), every group used by at least one layer."""
    others = draw(st.lists(st.sampled_from(kinds or KINDS), min_size=1, max_size=3))
    groups = [draw(group_data(k)) for k in others]
    num_layers = draw(st.integers(len(groups) + 1, 12))
    layers = list(range(len(groups) + 1)) + [
        draw(st.integers(0, len(groups))) for _ in range(num_layers - len(groups) - 1)
    ]
    layers = draw(st.permutations(layers))
    return {
        "num_layers": num_layers,
        "num_kv_heads": draw(st.sampled_from([1, 2, 4, 8])),
        "head_dim": draw(st.integers(1, 8)),
        "attention": "mha",
        "dtype": draw(st.sampled_from(["bfloat16", "float32"])),
        "scale_format": None,
        "groups": groups,
        "layers": list(layers),
    }
