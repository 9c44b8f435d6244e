"""What the layouts and oracle families share to draw record and block-scaled regions: a
record layout of the adapter's domain with a model it holds (:func:`record_regions`,
:data:`RECORD_PINS`), any layout's region of one request (:func:`draw_region`), and the
geometry and dtype a block-scaled layout holds (:func:`scaled_geometry`,
:func:`scaled_dtype`) [LAYOUT-6, LAYOUT-7, LAYOUT-8, ORACLE-6, ORACLE-8].
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain
from kvspec.memory.cache_layout import CacheLayout
from kvspec.memory.planes import smallest_block
from kvspec.topology.model import ModelShape

RECORD_DTYPE = "float8_e4m3fn"
"""The cache dtype every record preset holds [LAYOUT-6]."""


def holdable_records(adapter: Adapter) -> tuple[str, ...]:
    """The domain's record layouts that hold a model of the domain."""
    domain = adapter.domain
    if RECORD_DTYPE not in domain.model_dtypes():
        return ()
    kinds = {1: "mla", 2: "mha"}
    return tuple(
        n
        for n in domain.record_layouts()
        if not domain.layout(n).cross_layer
        and kinds[domain.layout(n).tensors()] in domain.attention
    )


def no_records(adapter: Adapter) -> str | None:
    """A check's ``missing``: why the domain has no record layout to draw, or None."""
    if holdable_records(adapter):
        return None
    return "the adapter's domain has no record layout with a model it holds (fp8 e4m3)"


def _model_for(spec: CacheLayout, layers: int, heads: int, width: int) -> ModelShape:
    """A model ``layout`` holds: FlashMLA's 576-wide latent, or fp8 MHA of head_dim a
    multiple of 4 (each inline scale stays aligned) [LAYOUT-6]."""
    if spec.kv_tensors == 1:
        return ModelShape.mla(layers, spec.fixed_head_dim or 4 * width, dtype=RECORD_DTYPE)
    return ModelShape(layers, heads, 4 * width, dtype=RECORD_DTYPE)


@st.composite
def record_regions(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A region of a record layout of the domain, with a model it holds [LAYOUT-6, ORACLE-6]."""
    layout = draw(st.sampled_from(holdable_records(adapter)))
    model = _model_for(
        adapter.domain.layout(layout),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 3)),
    )

    return draw_region(
        draw, layout, model, st.one_of(st.integers(0, 2**31), st.integers(2**31, 2**40))
    )


def draw_region(
    draw: st.DrawFn, layout: str, model: ModelShape, seeds: st.SearchStrategy[int]
) -> Example:
    """A region of one request of ``model`` in ``layout``: a request id, a seed drawn from
    ``seeds`` and a non-empty range of tokens, layers and heads [ORACLE-4, ORACLE-6]."""

    def sub(n: int) -> list[int]:
        start = draw(st.integers(0, n - 1))
        return [start, draw(st.integers(start + 1, n))]

    return {
        "layout": layout,
        "model": model.to_dict(),
        "request_id": draw(st.text("abc-_0123456789", min_size=1, max_size=8)),
        "tokens": sub(draw(st.integers(1, 8)) + 4),
        "layers": sub(model.num_layers),
        "heads": sub(model.num_kv_heads),
        "seed": draw(seeds),
    }


RECORD_PINS: tuple[Example, ...] = (
    {
        "layout": "vllm_pth_hnd",
        "model": ModelShape(3, 4, 8, dtype=RECORD_DTYPE).to_dict(),
        "request_id": "req-1",
        "tokens": [5, 9],
        "layers": [1, 3],
        "heads": [2, 4],
        "seed": 7,
    },
    {
        "layout": "flashmla_fp8",
        "model": ModelShape.mla(2, 576, dtype=RECORD_DTYPE).to_dict(),
        "request_id": "r_2",
        "tokens": [3, 6],
        "layers": [1, 2],
        "heads": [0, 1],
        "seed": 2**33 + 5,
    },
)


def record_setup(ctx: Context, example: Example) -> tuple[ModelShape, str, dict[str, range]]:
    """A drawn record region's model, layout and ranges; outside the domain where the
    adapter's domain holds no such record."""
    model = ModelShape.from_dict(example["model"])
    if example["layout"] not in holdable_records(ctx.adapter):
        raise OutsideDomain
    where = {k: range(*example[k]) for k in ("tokens", "layers", "heads")}
    return model, example["layout"], where


def no_scaled(adapter: Adapter) -> str | None:
    """A check's ``missing``: why the domain has no block-scaled layout to draw, or None."""
    if adapter.domain.scaled_layouts():
        return None
    return "the domain has no block-scaled layout (NVFP4 pages, MXFP8 side scales) it holds"


def scaled_geometry(spec: CacheLayout) -> tuple[list[int], list[int]]:
    """head_dims and block sizes ``spec`` holds: multiples of its head_dim multiple and
    of its units, or its fixed block size [LAYOUT-8]."""
    multiple = spec.head_dim_multiple or 16
    block = smallest_block(spec)
    blocks = [block] if spec.fixed_block_size else [block, 2 * block]
    return [multiple, 2 * multiple], blocks


def scaled_dtype(adapter: Adapter, layout: str) -> str:
    """The first of ``layout``'s dtypes in the adapter's domain."""
    spec = adapter.domain.layout(layout)
    return next(d for d in spec.dtypes or () if d in adapter.domain.model_dtypes())
