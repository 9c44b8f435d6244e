"""Moving bits once: strided copies, whole-block gathers and scatters into preallocated outputs.

Every data path of the spec — resharding [RESHARD-2], layout conversion [LAYOUT-3],
paged gather and scatter [PAGED-4], the codec's staging of strided tensors [WIRE-5] —
moves each byte exactly once, with these helpers, as bits and never as values
[DTYPE-2]. Two things keep that one pass near the speed of a plain memory copy:

- both sides are viewed as the widest integer (up to 8 bytes) that their innermost
  contiguous run, strides and addresses allow, so a 128-wide bfloat16 head is copied as
  32 eight-byte words instead of 128 two-byte ones;
- a block table is an index tensor: a gather is one ``index_select`` and a scatter one
  indexed assignment per tensor, never a Python loop over blocks.

The caller owns the output: nothing here allocates the bytes it moves.
"""

from __future__ import annotations

import numpy as np
import torch

from kvspec.tensors.dtypes import bits_view

_WIDE: tuple[torch.dtype, ...] = (torch.int64, torch.int32, torch.int16, torch.uint8)
"""Integer dtypes a copy may move bits as, widest first."""


def _widened(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``tensor``'s bits as ``dtype`` integers without copying, or None where its innermost
    run, strides or address do not allow it."""
    bits = bits_view(tensor)
    if dtype.itemsize == bits.element_size():
        return bits
    if tensor.data_ptr() % dtype.itemsize:
        return None
    try:
        return bits.view(dtype)
    except RuntimeError:
        return None


def wide_bits(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors' bits as the widest integer dtype every one of them allows [DTYPE-2].

    Views, never copies: writing a result writes its tensor. Tensors of one shape and
    element size give results of one shape (the last axis shrinks by the same factor),
    so a copy between two of them is still element for element.
    """
    if any(t.dim() == 0 or t.numel() == 0 for t in tensors):
        return tuple(bits_view(t) for t in tensors)
    narrowest = min(t.element_size() for t in tensors)
    for dtype in _WIDE:
        if dtype.itemsize < narrowest:
            break
        views = [_widened(t, dtype) for t in tensors]
        if all(v is not None for v in views):
            return tuple(v for v in views if v is not None)
    return tuple(bits_view(t) for t in tensors)


def copy_bits(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy ``source``'s bits into ``target`` (same shape and element size), in one pass."""
    if target.shape != source.shape or target.element_size() != source.element_size():
        raise ValueError(
            f"copy_bits needs equal shapes and element sizes: target {list(target.shape)} of "
            f"{target.element_size()} B, source {list(source.shape)} of "
            f"{source.element_size()} B [DTYPE-2]"
        )
    if target.numel() == 0:
        return
    wide_target, wide_source = wide_bits(target, source)
    if _cpu(wide_target, wide_source) and _numpy_copies(wide_target, wide_source):
        np.copyto(wide_target.numpy(), wide_source.numpy(), casting="no")
        return
    wide_target.copy_(wide_source)


_SMALL = 16 << 20
"""Below this many bytes a strided CPU copy is NumPy's (see :func:`_numpy_copies`)."""


def _numpy_copies(target: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether a CPU copy runs in NumPy's single strided loop rather than torch's parallel
    copy: when a side is strided and the copy is small, or lands a contiguous source in
    strided runs.

    Measured on the shared 2-core machine (issue 18): torch's parallel copy waits for its
    second thread at every call, up to ~20 ms when a neighbour holds the other core (32
    strided 2 MiB copies: 624 ms with torch, 63 ms with NumPy, a 64 MiB memcpy 32 ms); and
    it lands a contiguous source in 256 B runs 1.7-3x slower than NumPy at any size. Large
    transposes (strided on both sides) stay with torch, 25-35% faster there.
    """
    if target.is_contiguous() and source.is_contiguous():
        return False
    return source.is_contiguous() or target.numel() * target.element_size() < _SMALL


def _cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def gather_blocks(source: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """``out[i] = source[index[i]]`` along the first axis, in one pass [PAGED-1].

    ``index`` is a 1-d long tensor on ``source``'s device; ``out`` is
    ``[len(index), *source.shape[1:]]`` with ``source``'s element size.
    """
    if out.numel() == 0:
        return
    wide_source, wide_out = wide_bits(source, out)
    if wide_out.is_contiguous():
        torch.index_select(wide_source, 0, index, out=wide_out)
    else:
        wide_out.copy_(wide_source.index_select(0, index))  # pragma: no cover - callers pass
        # contiguous outputs; a strided one costs a second pass


def scatter_blocks(source: torch.Tensor, index: torch.Tensor, target: torch.Tensor) -> None:
    """``target[index[i]] = source[i]`` along the first axis, in one pass [PAGED-1].

    ``index`` holds distinct ids [PAGED-2], so every write lands on its own block. On
    the CPU the assignment runs through NumPy's indexed copy of whole sub-arrays (which
    moves each block as strided runs); elsewhere it is torch's ``index_put_``.
    """
    if source.numel() == 0:
        return
    wide_target, wide_source = wide_bits(target, source)
    if _cpu(wide_target, wide_source, index):
        wide_target.numpy()[index.numpy()] = wide_source.numpy()
    else:
        wide_target.index_put_((index,), wide_source)
