"""How one edge's byte runs travel: long runs as views of cache memory, short ones packed.

The spec gives the exact byte runs that realise an edge [DESC-1..3]
(:func:`kvspec.memory.descriptors.plan_runs`); sender and receiver both compute them,
so a message needs to carry nothing but the bytes. :func:`framing` decides, from the
runs alone (each side decides the same), how they travel:

- **views**: when the runs are long (:data:`VIEW_MIN` bytes on average), each run is one
  frame, a view of the sender's cache memory: nothing is copied to send it; the
  receiver copies each frame once, into its cache.
- **packed**: when they are short (an edge of one head in a token-major layout moves
  ``head_dim x itemsize`` bytes per token and layer), a frame per run would cost more
  in per-frame work than in bytes. The runs are grouped by (target region, source
  region) and ordered by target offset; each group is one frame that the sender gathers
  in one vectorised pass (rows of the runs' common granularity, never a Python loop
  per run) and the receiver scatters in one pass. Each byte is copied once on each side.

Every frame's length is known to both sides before it arrives, so a receiver checks it
before writing a byte.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvspec.memory.descriptors import Runs

VIEW_MIN = 64 << 10
"""Average run length (bytes) from which each run travels as its own zero-copy frame:
pyzmq's ``zmq.COPY_THRESHOLD`` (65536), below which ``send(copy=False)`` copies a frame
anyway, since tracking a zero-copy frame costs more than copying a small one."""

_MAX_ROW = 1 << 16


@dataclass(frozen=True)
class Group:
    """Runs from one source region into one target region, in target order, gathered as
    rows of ``row`` bytes: ``src_rows`` and ``dst_rows`` index each region viewed as rows."""

    src_region: int
    dst_region: int
    row: int
    src_rows: torch.Tensor
    dst_rows: torch.Tensor

    @property
    def nbytes(self) -> int:
        return len(self.src_rows) * self.row


@dataclass(frozen=True)
class Framing:
    """How one edge's runs travel: one frame per run (``groups`` empty) or one packed
    frame per :class:`Group`."""

    runs: Runs
    groups: tuple[Group, ...]

    @property
    def packed(self) -> bool:
        return bool(self.groups)

    @property
    def frame_lengths(self) -> list[int]:
        """The length of every frame, in order: what a receiver expects."""
        if self.packed:
            return [g.nbytes for g in self.groups]
        return self.runs.length.tolist()

    @property
    def nbytes(self) -> int:
        return int(self.runs.length.sum())


def _rows(offsets: torch.Tensor, lengths: torch.Tensor, row: int) -> torch.Tensor:
    """Row indices of every row of the runs (offset, length), run after run."""
    counts = lengths // row
    total = int(counts.sum())
    starts = torch.cumsum(counts, 0) - counts  # each run's first position in the output
    return torch.repeat_interleave(offsets // row - starts, counts) + torch.arange(total)


def _granularity(*values: torch.Tensor) -> int:
    """The largest power of two, at most 64 KiB, that divides every value."""
    merged = _MAX_ROW
    for v in values:
        if len(v):
            merged |= int(np.bitwise_or.reduce(v.numpy()))
    return merged & -merged


def framing(runs: Runs) -> Framing:
    """How ``runs`` travel [sim.paths.byteruns]: views when long, packed groups when short."""
    count = len(runs.length)
    if count == 0 or int(runs.length.sum()) >= VIEW_MIN * count:
        return Framing(runs, ())
    key = runs.dst_region * (int(runs.src_region.max()) + 1) + runs.src_region
    span = int((runs.dst_offset + runs.length).max()) + 1
    order = torch.argsort(key * span + runs.dst_offset)
    sr, so, dr, do, ln = (x[order] for x in runs)
    key = key[order]
    groups = []
    bounds = torch.nonzero(key[1:] != key[:-1]).flatten() + 1
    edges = [0, *bounds.tolist(), count]
    for a, b in itertools.pairwise(edges):
        row = _granularity(so[a:b], do[a:b], ln[a:b])
        groups.append(
            Group(
                int(sr[a]),
                int(dr[a]),
                row,
                _rows(so[a:b], ln[a:b], row),
                _rows(do[a:b], ln[a:b], row),
            )
        )
    return Framing(runs, tuple(groups))


def _as_rows(region: np.ndarray, row: int) -> np.ndarray:
    """A flat byte region as rows of ``row`` bytes (8-byte words where they fit)."""
    usable = region[: region.size // row * row]
    if row % 8 == 0 and usable.ctypes.data % 8 == 0:
        return usable.view(np.int64).reshape(-1, row // 8)
    return usable.reshape(-1, row)


def packed_nbytes(framing: Framing) -> int:
    """Bytes of staging a sender needs to pack ``framing`` (0 for views)."""
    return sum(g.nbytes for g in framing.groups)


def frames_from(
    framing: Framing, regions: Sequence[torch.Tensor], staging: torch.Tensor | None = None
) -> list[Any]:
    """The frames of one message, from the sender's flat byte ``regions`` (in
    ``source.regions()`` order): views of them, or groups gathered into ``staging`` (a
    contiguous uint8 CPU tensor of at least :func:`packed_nbytes` bytes; fresh memory
    when None). The frames stay valid while the regions and the staging do."""
    if not framing.packed:
        runs = framing.runs
        flat = [r.numpy().data for r in regions]  # memoryview(array), as numpy's stubs type it
        return [
            flat[r][o : o + n]
            for r, o, n in zip(
                runs.src_region.tolist(),
                runs.src_offset.tolist(),
                runs.length.tolist(),
                strict=True,
            )
        ]
    need = packed_nbytes(framing)
    if staging is None:
        staging = torch.empty(need, dtype=torch.uint8)
    if staging.numel() < need:
        raise ValueError(f"staging holds {staging.numel()} bytes; this message packs {need}")
    # NumPy's one-thread gather: torch's parallel copy waits for its second thread at
    # every call, ~20 ms each on a busy 2-core machine (kvspec.tensors.copying).
    # ``mode="clip"``: with the default ``mode="raise"`` and ``out=``, NumPy gathers into
    # a fresh temporary and copies that into ``out`` — two passes, the first over new
    # pages that fault on first touch (profiled: 128 MiB in 0.7 s, four times a plain
    # copy). Every row index is in range already: :func:`plan_runs` bounds every run by
    # the region it names [DESC-2], so clipping never moves one.
    staged, frames, at = staging.numpy(), [], 0
    for g in framing.groups:
        out = _as_rows(staged[at : at + g.nbytes], g.row)
        source = _as_rows(regions[g.src_region].numpy(), g.row)
        np.take(source, g.src_rows.numpy(), 0, out=out, mode="clip")
        frames.append(staged[at : at + g.nbytes].data)
        at += g.nbytes
    return frames


def land(framing: Framing, frames: Sequence[Any], regions: Sequence[torch.Tensor]) -> None:
    """Write a message's frames into the receiver's flat byte ``regions`` (in
    ``target.regions()`` order): one copy of each byte. Refuses frames whose count or
    lengths differ from what ``framing`` expects before writing anything."""
    lengths = framing.frame_lengths
    got = [memoryview(f).nbytes for f in frames]
    if got != lengths:
        first = next(
            (i for i, (a, b) in enumerate(zip(got, lengths, strict=False)) if a != b),
            min(len(got), len(lengths)),
        )
        raise ValueError(
            f"the message has {len(got)} range frames, expected {len(lengths)}; frame {first} "
            f"has {got[first] if first < len(got) else 'none'} bytes, expected "
            f"{lengths[first] if first < len(lengths) else 'none'}"
        )
    if not framing.packed:
        runs = framing.runs
        flat = [r.numpy() for r in regions]
        for r, o, n, frame in zip(
            runs.dst_region.tolist(),
            runs.dst_offset.tolist(),
            runs.length.tolist(),
            frames,
            strict=True,
        ):
            flat[r][o : o + n] = np.frombuffer(frame, dtype=np.uint8)
        return
    for g, frame in zip(framing.groups, frames, strict=True):
        if not g.nbytes:
            continue
        data = np.frombuffer(frame, dtype=np.uint8)
        target = _as_rows(regions[g.dst_region].numpy(), g.row)
        if target.dtype == np.int64 and data.ctypes.data % 8:
            data = data.copy()  # an odd-aligned frame: realigned once
        target[g.dst_rows.numpy()] = data.view(target.dtype).reshape(-1, target.shape[1])
