"""Paged caches: gathering one request out of its blocks, scattering it into another cache.

A rank keeps its layers' KV in a :class:`PagedCache`: one layer cache per layer, all in
one named layout [LAYOUT-1], plus the fp8 scales of those layers [DTYPE-3, PAGED-5]. A
request occupies the blocks its block ids name, in order [PAGED-1]. Gathering reads it
into the token-major request form, a :class:`~kvspec.tensors.kv.RequestKV`; scattering writes a
RequestKV into a cache whose layout and block size may differ, with that cache's own
block ids [PAGED-4]. Ids out of range, repeated, or not exactly as many as the request
needs are refused, never dropped, wrapped or padded [PAGED-2, PAGED-3].

Data moves by whole blocks (one indexed gather or scatter per layer and K/V over the
block table as an index tensor, plus a slice for a partial last block; never a loop
over blocks or tokens), each byte once, and as bits, not values [DTYPE-2], on whatever
device the cache is on. A gather can write into a caller's preallocated tensor.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int
from kvspec.memory.cache_layout import (
    CacheLayout,
    CacheShape,
    LayerCache,
    LayoutRef,
    cache_dtype,
    cache_shape,
    describe_cache,
    empty_cache,
    field_views,
    get_layout,
    kv_views,
    layer_views,
    require_layout,
)
from kvspec.tensors.copying import copy_bits, gather_blocks, scatter_blocks
from kvspec.tensors.dtypes import bit_equal, torch_dtype
from kvspec.tensors.kv import RequestKV, check_scales
from kvspec.topology.model import ModelShape

CLAUSES = (
    Clause(
        "PAGED-1",
        "Block table addressing",
        "A request of seq_len tokens in a paged cache of block size b with block ids "
        "[i_0, i_1, ...] keeps its token t (0-based, request-local) in block i_(t // b) at "
        "slot t % b, for K and V (or the latent) of every layer alike. Slots past seq_len in "
        "its last block are neither read nor written.",
        obligations=(
            must("token t is read from and written to block block_ids[t // b] at slot t % b"),
            must("slots past seq_len in the last block are neither read nor written"),
        ),
    ),
    Clause(
        "PAGED-2",
        "Block ids are in range and distinct",
        "Every block id is an integer in 0..num_blocks-1 — a negative id does not wrap — "
        "and no id appears twice. Otherwise the gather or scatter is refused, naming the "
        "offending ids and the valid range.",
        obligations=(
            refuses("a block id >= num_blocks"),
            refuses("a negative block id (it does not wrap)"),
            refuses("a block id listed twice"),
            refuses("a block id that is not an integer"),
        ),
    ),
    Clause(
        "PAGED-3",
        "Exactly the blocks the request needs",
        "The block id list has exactly ceil(seq_len / b) entries. Fewer cannot hold seq_len "
        "tokens; more means the two sides disagree about seq_len or the block size. Both "
        "are refused, naming seq_len, b and the ids: tokens are never dropped and blocks "
        "never padded. A caller holding blocks reserved for later tokens passes the first "
        "ceil(seq_len / b) of them.",
        obligations=(
            refuses("fewer block ids than ceil(seq_len / b)"),
            refuses("more block ids than ceil(seq_len / b)"),
        ),
    ),
    Clause(
        "PAGED-4",
        "Gather and scatter",
        "Gathering reads tokens 0..seq_len-1 of every layer of a paged cache into the "
        "token-major form [layers, kv, seq_len, heads, head_dim] with the cache's scales. "
        "Scattering writes such KV into a paged cache of the same layer count, K/V count, "
        "heads, head_dim and dtype — its layout and block size may differ — touching only "
        "the request's slots, and checks everything before it writes anything. Gathering "
        "what was scattered returns it bit for bit [DTYPE-2]. KV and a cache that disagree "
        "in shape or dtype are refused with both shapes.",
        obligations=(
            must("gathering gives the request's tokens of every layer, with the cache's scales"),
            must(
                "scattering into another layout and block size writes exactly the request's slots"
            ),
            must("a refused scatter writes nothing"),
            refuses("KV that differs from the cache in layers, heads, head_dim or dtype"),
        ),
    ),
    Clause(
        "PAGED-5",
        "A cache keeps its fp8 scales",
        "An fp8 paged cache carries float32 scales [layers, kv], one per layer for K and "
        "for V [DTYPE-3]. Scattering into it requires the KV's scales to be bit-equal to the "
        "cache's for every layer, since the same bits decode to other values under other "
        "scales; missing or differing scales are refused, naming the layer and both values.",
        obligations=(
            refuses("fp8 KV whose scales differ from the cache's, in one layer's K or V alone"),
            refuses("fp8 KV without scales"),
        ),
    ),
)


@dataclass(frozen=True)
class PagedCache:
    """One rank's paged KV cache: a layer cache per layer it holds, one layout [PAGED-4].

    ``layers[i]`` is the cache of the rank's i-th layer (which global layers those are
    is known from the plan); ``scales`` are fp8 scales ``[layers, kv]`` [PAGED-5]. The
    tensors are the engine's preallocated buffers: :func:`scatter_request` writes them.
    ``block_size`` is a token pool's page size, which its shape does not say [LAYOUT-5];
    for a cross-layer layout ``base`` is the one tensor every layer is a view of.
    """

    layout: CacheLayout
    layers: tuple[LayerCache, ...]
    scales: torch.Tensor | None = None
    block_size: int | None = None
    base: torch.Tensor | None = None
    shape: CacheShape = field(init=False)
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        spec = require_layout("PagedCache.layout", self.layout)
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise ValueError("a paged cache holds at least one layer; got none")
        if spec.cross_layer and self.base is None:
            raise ValueError(
                f"a {spec.name} paged cache is one tensor for every layer; build it with "
                "PagedCache.cross_layer(tensor, layout) [LAYOUT-5]"
            )
        shapes = [self._shape(layer) for layer in self.layers]
        first = self._first(self.layers[0])
        for i, layer in enumerate(self.layers):
            view = self._first(layer)
            if shapes[i] != shapes[0] or view.dtype != first.dtype or view.device != first.device:
                raise ValueError(
                    f"every layer of a paged cache has the same shape, dtype and device; layer "
                    f"{i} is a {describe_cache(layer)} {view.dtype} on {view.device}, layer 0 a "
                    f"{describe_cache(self.layers[0])} {first.dtype} on {first.device} [PAGED-4]"
                )
        object.__setattr__(self, "shape", shapes[0])
        object.__setattr__(self, "dtype", cache_dtype(self.layers[0], self.layer_layout))
        check_scales(
            self.scales,
            self.dtype,
            layers=len(self.layers),
            kv_tensors=self.shape.kv,
            where=f"a paged {self.dtype} cache",
        )

    @classmethod
    def cross_layer(
        cls,
        tensor: torch.Tensor,
        layout: CacheLayout,
        scales: torch.Tensor | None = None,
        block_size: int | None = None,
    ) -> PagedCache:
        """A paged cache over one cross-layer tensor: layer i is a view of index i of its
        layers axis [LAYOUT-5]; a token pool's ``block_size`` is its page size."""
        spec = require_layout("PagedCache.cross_layer's layout", layout)
        layers = layer_views(tensor, spec, block_size=block_size)
        return cls(spec, layers, scales, block_size=block_size, base=tensor)

    @property
    def layer_layout(self) -> CacheLayout:
        """The layout each layer reads as: the per-layer preset of a cross-layer layout."""
        return self.layout.layer_layout

    def _shape(self, layer: LayerCache) -> CacheShape:
        return cache_shape(layer, self.layer_layout, block_size=self._pool())

    def _pool(self) -> int | None:
        return self.layer_layout.page_size(self.block_size)

    def views(self, layer: LayerCache) -> tuple[torch.Tensor, ...]:
        """K and V (or the latent) of one of its layers, as views [LAYOUT-2]; a record
        layout's cells are read with :meth:`fields` [LAYOUT-6]."""
        return kv_views(layer, self.layer_layout, block_size=self._pool())

    def fields(self, layer: LayerCache) -> dict[str, torch.Tensor]:
        """Every field of one of its layers' cells, each a view in its own dtype [LAYOUT-6]."""
        return field_views(layer, self.layer_layout, block_size=self._pool())

    def _first(self, layer: LayerCache) -> torch.Tensor:
        """The first field of a layer: its dtype and device are the stored tensors'."""
        return next(iter(self.fields(layer).values()))

    @property
    def device(self) -> torch.device:
        return self._first(self.layers[0]).device

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def empty_paged_cache(
    layout: LayoutRef,
    *,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    heads: int,
    head_dim: int,
    dtype: str,
    kv: int | None = None,
    scales: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> PagedCache:
    """A zero-filled paged cache; fp8 caches need their ``scales`` [PAGED-5].

    ``kv`` (2: K and V, 1: a latent) defaults to what the layout holds; token_major
    holds either, so it must be stated there [LAYOUT-1].
    """
    require_int("num_layers", num_layers, minimum=1)
    spec = get_layout(layout)
    if kv is None:
        if spec.kv_tensors is None:
            raise ValueError(
                f"layout {spec.name} holds K and V or a latent; state kv=2 or kv=1 [LAYOUT-1]"
            )
        kv = spec.kv_tensors
    scales = None if scales is None else scales.to(device)
    if spec.cross_layer:
        shape = CacheShape(kv, num_blocks, block_size, heads, head_dim, layers=num_layers)
        base = empty_cache(spec, shape, dtype, device)
        assert isinstance(base, torch.Tensor)
        return PagedCache.cross_layer(base, spec, scales, block_size=block_size)
    shape = CacheShape(kv, num_blocks, block_size, heads, head_dim)
    layers = tuple(empty_cache(spec, shape, dtype, device) for _ in range(num_layers))
    return PagedCache(spec, layers, scales, block_size=block_size)


def empty_model_cache(
    layout: LayoutRef,
    model: ModelShape,
    *,
    num_blocks: int,
    block_size: int,
    layers: int | None = None,
    heads: int | None = None,
    scales: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> PagedCache:
    """A zero paged cache shaped by ``model``: ``layers`` and ``heads`` are how many the
    rank holds (the whole model by default); K/V or latent, head_dim and dtype come from
    the model [PAGED-4, MODEL-2]."""
    return empty_paged_cache(
        layout,
        num_layers=model.num_layers if layers is None else layers,
        num_blocks=num_blocks,
        block_size=block_size,
        heads=model.num_kv_heads if heads is None else heads,
        head_dim=model.head_dim,
        dtype=model.dtype,
        kv=model.kv_tensors,
        scales=scales,
        device=device,
    )


def blocks_needed(seq_len: int, block_size: int) -> int:
    """Blocks a request of ``seq_len`` tokens occupies: ``ceil(seq_len / block_size)`` [PAGED-3]."""
    require_int("seq_len", seq_len, minimum=0)
    require_int("block_size", block_size, minimum=1)
    return -(-seq_len // block_size)


def blocks_of(block_ids: Sequence[int], block_size: int, tokens: range) -> list[int]:
    """The ids of the blocks that hold ``tokens`` of a request [PAGED-1].

    Token t lies in block ``block_ids[t // block_size]``; a range that starts or ends
    inside a block includes that block.
    """
    require_int("block_size", block_size, minimum=1)
    if not tokens:
        return []
    return list(block_ids[tokens.start // block_size : blocks_needed(tokens.stop, block_size)])


def check_block_ids(
    block_ids: Sequence[int] | torch.Tensor, *, num_blocks: int, block_size: int, seq_len: int
) -> list[int]:
    """The block ids as a list, if valid for a request of ``seq_len`` tokens [PAGED-2, PAGED-3]."""
    needed = blocks_needed(seq_len, block_size)
    ids = _as_id_list(block_ids)
    bad = [(pos, i) for pos, i in enumerate(ids) if not 0 <= i < num_blocks]
    if bad:
        raise ValueError(
            f"block ids {[i for _, i in bad]} (at positions {[p for p, _ in bad]}) are out of "
            f"range: the cache has {num_blocks} blocks, so valid ids are 0..{num_blocks - 1} "
            "[PAGED-2]"
        )
    repeated = sorted(i for i, count in Counter(ids).items() if count > 1)
    if repeated:
        raise ValueError(
            f"block ids {repeated} appear more than once in {ids}: each block holds its own "
            "tokens of the request, so ids must be distinct [PAGED-2]"
        )
    if len(ids) < needed:
        raise ValueError(
            f"seq_len {seq_len} needs {needed} blocks of {block_size} but {len(ids)} block ids "
            f"were given ({ids}), which hold {len(ids) * block_size} tokens; refusing rather "
            f"than dropping {seq_len - len(ids) * block_size} tokens [PAGED-3]"
        )
    if len(ids) > needed:
        raise ValueError(
            f"seq_len {seq_len} needs {needed} blocks of {block_size} but {len(ids)} block ids "
            f"were given ({ids}); pass exactly the first {needed} (blocks_needed(seq_len, "
            "block_size)): extra blocks mean the two sides disagree on seq_len or block size "
            "[PAGED-3]"
        )
    return ids


def _as_id_list(block_ids: Sequence[int] | torch.Tensor) -> list[int]:
    """Block ids as Python ints; floats, bools and other shapes are refused [PAGED-2]."""
    if isinstance(block_ids, torch.Tensor):
        dtype = block_ids.dtype
        if (
            block_ids.dim() != 1
            or dtype.is_floating_point
            or dtype.is_complex
            or dtype == torch.bool
        ):
            raise ValueError(
                f"block ids must be a 1-d integer tensor or a list of ints; got a "
                f"{block_ids.dtype} tensor of shape {list(block_ids.shape)} [PAGED-2]"
            )
        return [int(i) for i in block_ids.tolist()]
    ids = list(block_ids)
    # Any integer type (numpy's too) is an id; bools and floats are not.
    wrong = [i for i in ids if isinstance(i, bool) or not hasattr(i, "__index__")]
    if wrong:
        raise ValueError(f"block ids must be integers; got {wrong} in {ids} [PAGED-2]")
    return [operator.index(i) for i in ids]


def _block_split(
    ids: list[int], block_size: int, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, int | None, int, int]:
    """Where the request lies [PAGED-1]: its full blocks, then a partial last block.

    Returns (the full blocks' ids as an index tensor, the last block's id or None,
    tokens in full blocks, tokens in the last block). Moving whole blocks is one
    index_select / index_put per layer and K/V; the partial block is one more slice.
    """
    full, rest = divmod(seq_len, block_size)
    blocks = torch.tensor(ids[:full], dtype=torch.long, device=device)
    return blocks, (ids[full] if rest else None), full * block_size, rest


def gather_request(
    cache: PagedCache,
    block_ids: Sequence[int] | torch.Tensor,
    seq_len: int,
    *,
    out: torch.Tensor | None = None,
) -> RequestKV:
    """The request in ``block_ids`` as token-major KV ``[layers, kv, seq_len, heads, head_dim]``.

    [PAGED-1..4]. The result is a new tensor on the cache's device with a copy of the
    cache's scales; or, with ``out`` (a contiguous tensor of that shape, the cache's dtype
    and device, reused from request to request), ``out`` itself.
    """
    shape = cache.shape
    ids = check_block_ids(
        block_ids, num_blocks=shape.num_blocks, block_size=shape.block_size, seq_len=seq_len
    )
    blocks, last, in_full, rest = _block_split(ids, shape.block_size, seq_len, cache.device)
    want = (cache.num_layers, shape.kv, seq_len, shape.heads, shape.head_dim)
    dtype = torch_dtype(cache.dtype)
    if out is None:
        out = torch.empty(want, dtype=dtype, device=cache.device)
    elif (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != want
        or out.dtype != dtype
        or out.device != cache.device
        or not out.is_contiguous()
    ):
        got = (
            f"a {'' if out.is_contiguous() else 'non-contiguous '}{out.dtype} tensor of shape "
            f"{list(out.shape)} on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {list(want)} [layers, kv, "
            f"seq_len, heads, head_dim] on {cache.device}; got {got} [PAGED-4]"
        )
    for layer, layer_cache in enumerate(cache.layers):
        for k, view in enumerate(cache.views(layer_cache)):
            target = out[layer, k]
            if len(blocks):
                whole = target[:in_full].view(len(blocks), *view.shape[1:])
                gather_blocks(view, blocks, whole)
            if last is not None:
                copy_bits(target[in_full:], view[last, :rest])
    scales = None if cache.scales is None else cache.scales.clone()
    return RequestKV(out, scales)


def scatter_request(
    kv: RequestKV, cache: PagedCache, block_ids: Sequence[int] | torch.Tensor
) -> None:
    """Write ``kv`` into ``cache``'s blocks ``block_ids``, in place [PAGED-1..5].

    Only the request's slots change. Everything is checked before anything is written,
    so a refused scatter leaves the cache as it was. ``kv`` may be on another device.
    """
    shape = cache.shape
    data = kv.data
    want = [cache.num_layers, shape.kv, None, shape.heads, shape.head_dim]
    if data.dim() != 5 or any(
        w is not None and w != n for w, n in zip(want, data.shape, strict=True)
    ):
        shown = ["seq" if w is None else w for w in want]
        raise ValueError(
            f"KV of shape {list(data.shape)} does not fit a {cache.layout.name} paged cache of "
            f"{cache.num_layers} layers, each a {describe_cache(cache.layers[0])}: expected "
            f"[layers, kv, seq, heads, head_dim] = {shown} [PAGED-4]"
        )
    if data.dtype != torch_dtype(cache.dtype):
        raise ValueError(
            f"KV of dtype {data.dtype} cannot be written into a {cache.dtype} cache; dtypes "
            "are never converted [PAGED-4]"
        )
    seq_len = data.shape[2]
    ids = check_block_ids(
        block_ids, num_blocks=shape.num_blocks, block_size=shape.block_size, seq_len=seq_len
    )
    where = f"KV scattered into a paged {cache.dtype} cache"
    check_scales(kv.scales, cache.dtype, layers=cache.num_layers, kv_tensors=shape.kv, where=where)
    if cache.scales is not None and kv.scales is not None:
        check_same_scales(kv.scales, cache.scales)

    blocks, last, in_full, rest = _block_split(ids, shape.block_size, seq_len, cache.device)
    data = data.to(cache.device)
    for layer, layer_cache in enumerate(cache.layers):
        for k, target in enumerate(cache.views(layer_cache)):
            source = data[layer, k]
            if len(blocks):
                # Distinct ids [PAGED-2] make this indexed write well defined; a strided
                # source is read in place (reshape would copy it first).
                whole = source[:in_full].unflatten(0, (len(blocks), shape.block_size))
                scatter_blocks(whole, blocks, target)
            if last is not None:
                copy_bits(target[last, :rest], source[in_full:])


def check_same_scales(incoming: torch.Tensor, own: torch.Tensor) -> None:
    """Refuse KV quantised with other scales than the cache's [PAGED-5]."""
    if bit_equal(own, incoming.to(own.device)):
        return
    differs = (own.view(torch.int32) != incoming.to(own.device).view(torch.int32)).any(dim=1)
    layer = int(differs.nonzero()[0, 0])
    raise ValueError(
        f"the KV's fp8 scales differ from the cache's: layer {layer} (of this cache) has "
        f"scales {own[layer].tolist()} but the KV carries {incoming[layer].tolist()}; the "
        "same bits would decode to other values, so the scatter is refused [PAGED-5]"
    )
