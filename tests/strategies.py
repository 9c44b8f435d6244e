"""Draws and tensor helpers the test roles share: random raw bits, bit-identical caches,
and the cache side and run shape of a simulated transfer case.

The spec's own strategies (transfer cases, cache shapes) live in ``kvspec.testing.strategies``,
where the conformance suite draws from them too; what is here only the tests use."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvspec.memory.cache_layout import LayerCache, get_layout, layouts_for
from kvspec.tensors.dtypes import bit_equal, raw_bits, torch_dtype
from kvspec.topology.case import TransferCase
from kvspec.topology.stage import StageLayout


def random_bits(shape: tuple[int, ...], dtype: str, seed: int) -> torch.Tensor:
    """Random raw bits, NaN payloads and -0.0 included [DTYPE-2]."""
    bits_dtype = raw_bits(torch.empty(0, dtype=torch_dtype(dtype))).dtype
    info = torch.iinfo(bits_dtype)
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(info.min, info.max, shape, dtype=bits_dtype, generator=generator)
    return bits.view(torch_dtype(dtype))


def same_cache(a: LayerCache, b: LayerCache) -> bool:
    """Two layer caches of the same form (one tensor, or a tuple) hold the same bits."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bit_equal(a, b)
    return len(a) == len(b) and all(bit_equal(x, y) for x, y in zip(a, b, strict=True))


def cache_side(
    draw: st.DrawFn, attention: str, stage: StageLayout, *, cross_layer: bool = False
) -> tuple[str, int]:
    """A preset of ``attention`` and a block size that the stage's token rule fits [CP-2]:
    a token-sharded stage whose rule cuts blocks needs a paged preset whose block size is
    the rule's (a multiple of it under ``interleave``)."""
    fits = stage.rule.block_sizes(2) if stage.token_shards > 1 else None
    names = layouts_for(attention, cross_layer=cross_layer)
    if fits:
        names = [n for n in names if get_layout(n).paged]
    name = draw(st.sampled_from(names))
    if fits:
        return name, draw(st.sampled_from(fits))
    return name, draw(st.integers(1, 5)) if get_layout(name).paged else 1


def shortest_request(case: TransferCase, floor: int = 3) -> int:
    """The fewest tokens a request of ``case`` may have, at least ``floor`` [CP-1]."""
    return max([floor] + [x.min_tokens for x in (case.source, case.target)])
