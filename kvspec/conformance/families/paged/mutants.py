"""Mutants of gathering and scattering a request by block table [PAGED-1..5]."""

from __future__ import annotations

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.memory.paged import PagedCache, blocks_needed, check_block_ids
from kvspec.tensors.dtypes import bits_view, torch_dtype
from kvspec.tensors.kv import RequestKV


def _write_block_by_block(kv: RequestKV, cache: PagedCache, block_ids: list) -> None:
    """Scatter one block at a time, checking each id only when its turn comes."""
    b = cache.shape.block_size
    seq = kv.data.shape[2]
    bits = bits_view(kv.data.to(cache.device))
    for position, block in enumerate(block_ids):
        if not isinstance(block, int) or not 0 <= block < cache.shape.num_blocks:
            raise ValueError(f"block id {block!r} out of range")
        tokens = range(position * b, min(seq, (position + 1) * b))
        for layer, layer_cache in enumerate(cache.layers):
            for k, view in enumerate(cache.views(layer_cache)):
                bits_view(view)[block, : len(tokens)] = bits[layer, k, tokens.start : tokens.stop]
    if len(block_ids) != blocks_needed(seq, b):
        raise ValueError("wrong number of block ids")


@mutant("PAGED-1.1")
class SortsBlockIds(ReferenceAdapter):
    """Sorts the block table first ("blocks are allocated in order"), so tokens move to
    other blocks whenever the ids are not ascending."""

    def gather(self, cache, block_ids, seq_len):
        return super().gather(cache, sorted(block_ids) if _ints(block_ids) else block_ids, seq_len)

    def scatter(self, kv, cache, block_ids):
        return super().scatter(kv, cache, sorted(block_ids) if _ints(block_ids) else block_ids)


def _ints(ids: list) -> bool:
    return all(isinstance(i, int) and not isinstance(i, bool) for i in ids)


@mutant("PAGED-1.2")
class WritesWholeLastBlock(ReferenceAdapter):
    """Writes the request's last block whole, zeros past seq_len included."""

    def scatter(self, kv, cache, block_ids):
        super().scatter(kv, cache, block_ids)
        b, seq = cache.shape.block_size, kv.data.shape[2]
        if seq % b:
            last = block_ids[seq // b]
            for layer_cache in cache.layers:
                for view in cache.views(layer_cache):
                    bits_view(view)[last, seq % b :] = 0


@mutant("PAGED-2.1")
class DropsOutOfRangeBlocks(ReferenceAdapter):
    """Skips block ids outside the cache and pads with zeros (a silent drop)."""

    def gather(self, cache, block_ids, seq_len):
        valid = [b if 0 <= b < cache.shape.num_blocks else None for b in block_ids]
        if None not in valid:
            return super().gather(cache, block_ids, seq_len)
        spare = next(b for b in range(cache.shape.num_blocks) if b not in block_ids)
        patched = [spare if b is None else b for b in valid]
        kv = super().gather(cache, patched, seq_len)
        kv.data.zero_()
        return kv

    def scatter(self, kv, cache, block_ids):
        keep = [b for b in block_ids if 0 <= b < cache.shape.num_blocks]
        if len(keep) == len(block_ids):
            return super().scatter(kv, cache, block_ids)
        return None


@mutant("PAGED-2.2")
class NegativeIdsWrap(ReferenceAdapter):
    """Checks ``id < num_blocks`` only: a negative id indexes from the end, as Python does."""

    def _wrapped(self, cache, block_ids):
        if not _ints(block_ids):
            return block_ids
        n = cache.shape.num_blocks
        return [b + n if -n <= b < 0 else b for b in block_ids]

    def gather(self, cache, block_ids, seq_len):
        return super().gather(cache, self._wrapped(cache, block_ids), seq_len)

    def scatter(self, kv, cache, block_ids):
        return super().scatter(kv, cache, self._wrapped(cache, block_ids))


@mutant("PAGED-2.3")
class RepeatedIdsAccepted(ReferenceAdapter):
    """Never checks the table for repeats: two token ranges share one block, the later wins."""

    def gather(self, cache, block_ids, seq_len):
        if _ints(block_ids) and len(set(block_ids)) < len(block_ids):
            b = cache.shape.block_size
            out = super().gather(cache, list(range(len(block_ids))), seq_len)  # the shape
            views = [cache.views(layer) for layer in cache.layers]
            for t in range(seq_len):
                for layer, pair in enumerate(views):
                    for k, view in enumerate(pair):
                        out.data[layer, k, t] = view[block_ids[t // b], t % b]
            return out
        return super().gather(cache, block_ids, seq_len)

    def scatter(self, kv, cache, block_ids):
        if _ints(block_ids) and len(set(block_ids)) < len(block_ids):
            return _write_block_by_block(kv, cache, block_ids)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-2.4")
class IdsCoercedWithInt(ReferenceAdapter):
    """Reads block ids with ``int()``: 3.0 and "3" pass as block 3."""

    def _coerced(self, block_ids):
        try:
            return [int(b) for b in block_ids]
        except (TypeError, ValueError):
            return block_ids

    def gather(self, cache, block_ids, seq_len):
        return super().gather(cache, self._coerced(block_ids), seq_len)

    def scatter(self, kv, cache, block_ids):
        return super().scatter(kv, cache, self._coerced(block_ids))


@mutant("PAGED-3.1")
class ShortTableDropsTokens(ReferenceAdapter):
    """With too few block ids, moves the tokens that fit and leaves the rest out."""

    def gather(self, cache, block_ids, seq_len):
        b = cache.shape.block_size
        if _ints(block_ids) and len(block_ids) < blocks_needed(seq_len, b):
            fits = min(seq_len, len(block_ids) * b)
            got = super().gather(cache, block_ids, fits) if fits else None
            shape = (
                cache.num_layers,
                cache.shape.kv,
                seq_len,
                cache.shape.heads,
                cache.shape.head_dim,
            )
            data = torch.zeros(shape, dtype=torch_dtype(cache.dtype), device=cache.device)
            if got is not None:
                data[:, :, :fits] = got.data
            return RequestKV(data, None if cache.scales is None else cache.scales.clone())
        return super().gather(cache, block_ids, seq_len)

    def scatter(self, kv, cache, block_ids):
        b = cache.shape.block_size
        if _ints(block_ids) and len(block_ids) < blocks_needed(kv.data.shape[2], b):
            fits = len(block_ids) * b
            return super().scatter(RequestKV(kv.data[:, :, :fits], kv.scales), cache, block_ids)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-3.2")
class ExtraIdsIgnored(ReferenceAdapter):
    """Uses the first ceil(seq_len / b) ids and ignores the rest of a longer table."""

    def gather(self, cache, block_ids, seq_len):
        needed = blocks_needed(seq_len, cache.shape.block_size)
        return super().gather(cache, list(block_ids)[:needed], seq_len)

    def scatter(self, kv, cache, block_ids):
        needed = blocks_needed(kv.data.shape[2], cache.shape.block_size)
        return super().scatter(kv, cache, list(block_ids)[:needed])


@mutant("PAGED-4.1")
class GatherDropsScales(ReferenceAdapter):
    """Gathers an fp8 request's data but not the cache's scales."""

    def gather(self, cache, block_ids, seq_len):
        return RequestKV(super().gather(cache, block_ids, seq_len).data)


@mutant("PAGED-4.2")
class ScatterLosesNonContiguousWrites(ReferenceAdapter):
    """Writes through ``reshape`` of each K/V view: where the view is not contiguous (the
    HND layouts) reshape copies, and the writes land in the copy."""

    def scatter(self, kv, cache, block_ids):
        if cache.layout.name.endswith("_hnd"):
            check_block_ids(
                block_ids,
                num_blocks=cache.shape.num_blocks,
                block_size=cache.shape.block_size,
                seq_len=kv.data.shape[2],
            )
            return None
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-4.3")
class WritesBeforeChecking(ReferenceAdapter):
    """Writes block by block and checks each id when it gets to it (and the table's length
    and repeats at the end): a bad table is refused after blocks were written."""

    def scatter(self, kv, cache, block_ids):
        data = kv.data
        fits = (
            data.dim() == 5
            and data.shape[0] == cache.num_layers
            and tuple(data.shape[3:]) == (cache.shape.heads, cache.shape.head_dim)
            and data.dtype == torch_dtype(cache.dtype)
        )
        if not fits or not _ints(block_ids):
            return super().scatter(kv, cache, block_ids)
        _write_block_by_block(kv, cache, list(block_ids))
        check_block_ids(
            block_ids,
            num_blocks=cache.shape.num_blocks,
            block_size=cache.shape.block_size,
            seq_len=data.shape[2],
        )
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-4.3")
class ScalesCheckedAfterWriting(ReferenceAdapter):
    """Writes the data, then compares the fp8 scales and refuses."""

    def scatter(self, kv, cache, block_ids):
        if cache.scales is not None:
            super().scatter(RequestKV(kv.data, cache.scales), cache, block_ids)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-4.4")
class CastsKvToCacheDtype(ReferenceAdapter):
    """Casts KV of another dtype to the cache's (``.to(cache.dtype)``) instead of refusing."""

    def scatter(self, kv, cache, block_ids):
        dtype = torch_dtype(cache.dtype)
        if kv.data.dtype != dtype:
            scales = kv.scales if cache.scales is None else cache.scales
            kv = RequestKV(kv.data.to(dtype), scales)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-4.4")
class ZipTruncatesLayers(ReferenceAdapter):
    """Pairs KV layers with cache layers with ``zip``: extra layers on either side are
    silently left out."""

    def scatter(self, kv, cache, block_ids):
        n = min(kv.data.shape[0], cache.num_layers)
        if kv.data.dim() != 5 or kv.data.shape[0] == cache.num_layers:
            return super().scatter(kv, cache, block_ids)
        scales = None if cache.scales is None else cache.scales[:n]
        first = PagedCache(cache.layout, cache.layers[:n], scales)  # the same tensors
        kv_scales = None if kv.scales is None else kv.scales[:n]
        return super().scatter(RequestKV(kv.data[:n], kv_scales), first, block_ids)


@mutant("PAGED-5.1")
class ComparesOnlyKeyScalesInCache(ReferenceAdapter):
    """Compares the KV's K scales with the cache's, not the V scales."""

    def scatter(self, kv, cache, block_ids):
        if (
            kv.scales is not None
            and cache.scales is not None
            and kv.scales.shape == cache.scales.shape
        ):
            scales = kv.scales.clone()
            scales[:, 1:] = cache.scales[:, 1:]
            kv = RequestKV(kv.data, scales)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-5.1")
class ComparesFirstLayerScales(ReferenceAdapter):
    """Compares the scales of the first layer only ("scales are per model")."""

    def scatter(self, kv, cache, block_ids):
        if (
            kv.scales is not None
            and cache.scales is not None
            and kv.scales.shape == cache.scales.shape
        ):
            scales = cache.scales.clone()
            scales[0] = kv.scales[0]
            kv = RequestKV(kv.data, scales)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-5.2")
class MissingScalesTakeTheCaches(ReferenceAdapter):
    """Writes fp8 KV that came without scales as if it had the cache's."""

    def scatter(self, kv, cache, block_ids):
        if kv.scales is None and cache.scales is not None:
            kv = RequestKV(kv.data, cache.scales)
        return super().scatter(kv, cache, block_ids)


@mutant("PAGED-2.1", "PAGED-3.1", unclear=True)
class ScatterRefusesTableWithoutIds(ReferenceAdapter):
    """Checks a scatter's block table on its own write path, before the reference's, and
    refuses a bad one with "invalid block table for this request", naming neither the
    offending ids, the valid range nor seq_len and the block size the clauses ask for
    (gathering still names them)."""

    def scatter(self, kv, cache, block_ids):
        if kv.data.dim() == 5:
            try:
                check_block_ids(
                    block_ids,
                    num_blocks=cache.shape.num_blocks,
                    block_size=cache.shape.block_size,
                    seq_len=kv.data.shape[2],
                )
            except ValueError:
                raise ValueError("invalid block table for this request") from None
        return super().scatter(kv, cache, block_ids)
