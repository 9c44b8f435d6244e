"""Moving bits once: strided copies, whole-block gathers and scatters into preallocated outputs.

Every data path of the spec — resharding [RESHARD-2], layout conversion [LAYOUT-3],
paged gather and scatter [PAGED-4], the codec's staging of strided tensors [WIRE-5] —
moves each byte exactly once, with these helpers, as bits and never as values
[DTYPE-2]. Two things keep that one pass near the speed of a plain memory copy:

- both sides are viewed as the widest integer (up to 8 bytes) that their innermost
  contiguous run, strides and addresses allow, so a 128-wide bfloat16 head is copied as
  32 eight-byte words instead of 128 two-byte ones;
- a block table is an index tensor: a gather is one ``index_select`` and a scatter one
  indexed assignment per tensor, never a Python loop over blocks;
- a strided copy runs on every thread torch may use: a large one in torch's parallel
  copy, a smaller one in NumPy loops that the threads take slice by slice, so that a
  busy core delays it by one slice, not by a wait at a barrier.

The caller owns the output: nothing here allocates the bytes it moves.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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
    nbytes = wide_target.numel() * wide_target.element_size()
    strided = not (wide_target.is_contiguous() and wide_source.is_contiguous())
    if _cpu(wide_target, wide_source) and strided and nbytes < _LARGE:
        _numpy_copy(wide_target.numpy(), wide_source.numpy(), nbytes)
        return
    wide_target.copy_(wide_source)


_LARGE = 16 << 20
"""From this many bytes a strided CPU copy is torch's own parallel copy; below it, NumPy's
(see :func:`_numpy_copy`).

Measured on the shared 2-core machine (issue 18), in copies of 256 B runs: torch's
parallel copy waits for every one of its threads at the end of every call, which costs
up to ~20 ms when a neighbour holds a core (32 strided 2 MiB copies beside two CPU hogs:
0.06 of memcpy with torch, 0.54 with NumPy), but a 64 MiB copy amortises that wait and
torch's loop is the faster one (a 64 MiB NHD->HND transpose: 0.82 of memcpy with torch,
0.61 shared by NumPy threads, 0.34 in one NumPy loop, on a quiet machine)."""

_SHARED = 1 << 20
"""From this many bytes a NumPy copy is shared by :func:`copy_threads` threads."""


def copy_threads() -> int:
    """Threads a strided CPU copy is shared by: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())


def _numpy_copy(target: np.ndarray, source: np.ndarray, nbytes: int) -> None:
    """A strided copy in NumPy loops, shared along the outermost axis long enough to
    cut (:func:`_in_pieces`)."""
    pieces = _slices(nbytes)
    axis = _split_axis(target.shape, pieces) if pieces > 1 else None
    if axis is None:
        np.copyto(target, source, casting="no")
        return
    before = (slice(None),) * axis

    def piece(part: slice) -> None:
        np.copyto(target[(*before, part)], source[(*before, part)], casting="no")

    _in_pieces(target.shape[axis], pieces, piece)


def _split_axis(shape: tuple[int, ...], pieces: int) -> int | None:
    """The outermost axis with at least ``pieces`` elements, or None."""
    return next((axis for axis, size in enumerate(shape) if size >= pieces), None)


_PIECES = 4
"""Slices per thread of a shared copy: a thread the OS holds back delays it by one."""

_SLICE = 256 << 10
"""The fewest bytes in a slice: less is not worth a thread's wake-up and the GIL (on a
machine with many cores, a 1 MiB copy goes to four threads, not to all of them)."""


def _slices(nbytes: int) -> int:
    """How many slices a copy of ``nbytes`` is cut into; 1: it is not shared."""
    threads = copy_threads()
    if threads == 1 or nbytes < _SHARED:
        return 1
    return max(1, min(_PIECES * threads, nbytes // _SLICE))


def _in_pieces(length: int, pieces: int, piece: Callable[[slice], None]) -> None:
    """Run ``piece`` over ``[0, length)`` cut into ``pieces`` slices (:func:`_slices`).

    NumPy loops hold no lock and never spin. With one slice (a copy under :data:`_SHARED`
    bytes, or one thread) the calling thread runs it alone; else the calling thread and up to
    ``copy_threads() - 1`` pool threads take the slices one at a time, so a thread the
    OS holds back delays the copy by one slice at most. Measured on the shared 2-core
    machine (issue 18), 2-8 MiB copies of 256 B runs: 0.28-0.34 of memcpy in one loop,
    0.51-0.53 shared, on a quiet machine; 0.54-0.56 and 0.49-0.54 beside two CPU hogs.
    """
    count = min(pieces, length)
    if count < 2:
        piece(slice(0, length))
        return
    step = -(-length // count)
    parts = [slice(start, min(start + step, length)) for start in range(0, length, step)]
    taken = itertools.count()  # next() on a count is atomic under the GIL

    def work() -> None:
        while (i := next(taken)) < len(parts):
            piece(parts[i])

    helpers_needed = min(copy_threads(), len(parts)) - 1
    helpers = [_pool(helpers_needed).submit(work) for _ in range(helpers_needed)]
    try:
        work()
    finally:  # every slice is written (or has failed) before the caller goes on
        for helper in helpers:
            helper.result()


_POOL: tuple[int, ThreadPoolExecutor] | None = None
"""The process's copy threads and how many there are."""


def _pool(workers: int) -> ThreadPoolExecutor:
    """``workers`` copy threads or more, made on first use (and again after a fork, whose
    child has none of its parent's threads)."""
    global _POOL
    if _POOL is None or _POOL[0] < workers:
        if _POOL is not None:
            _POOL[1].shutdown(wait=False)
        _POOL = (workers, ThreadPoolExecutor(workers, thread_name_prefix="kvspec-copy"))
    return _POOL[1]


def _forget_pool() -> None:
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_forget_pool)


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
    moves each block as strided runs), shared by the copy threads (:func:`_in_pieces`);
    elsewhere it is torch's ``index_put_``.
    """
    if source.numel() == 0:
        return
    wide_target, wide_source = wide_bits(target, source)
    if _cpu(wide_target, wide_source, index):
        into, ids, rows = wide_target.numpy(), index.numpy(), wide_source.numpy()

        def piece(part: slice) -> None:
            into[ids[part]] = rows[part]

        _in_pieces(len(ids), _slices(rows.nbytes), piece)
    else:
        wide_target.index_put_((index,), wide_source)
