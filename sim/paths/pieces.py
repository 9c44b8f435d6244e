"""A hybrid request's pieces between one (source, receiver) pair as the frames of one keyed
data message, never pickle [GROUP-3, STATE-2, INDEX-1].

The frames are ``[description, data 0, data 1, ...]``: the description a JSON object
``{"pieces": [...]}`` naming each piece's coordinates (its group and layers, and heads
and tokens for per-token KV [GROUP-3], with the indexer part for an MLA group's indexer
[INDEX-1], or the state part and the offset it lands at [STATE-2]); each data frame one
piece's raw elements. The message goes as any data message does
(:meth:`sim.rank.sender.Sender.put_ranges`: an envelope first whose ``ranges_crc``
covers these frames, through the run's faults), over the pair's verified connection
(:mod:`sim.net.auth`); the request is the envelope key's, the sender the connection's.
Nothing about a piece's dtype or shape is read from the wire: the receiver derives both
from the model it runs and the coordinates, and refuses a frame of another length.
Streamed [STREAM-1], a piece is cut at the stream's layer bounds (:func:`in_layers`).
See :mod:`kvspec.tensors.group_reshard` for the pieces themselves.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvspec.tensors.dtypes import itemsize, torch_dtype
from kvspec.tensors.group_reshard import Piece
from kvspec.tensors.state_oracle import part_dtype, state_group
from kvspec.topology.groups import FullAttention
from kvspec.topology.indexer import INDEX_PARTS, index_widths
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens
from sim.net.messages import MessageError, dump, load, short

MAX_DESCRIPTION = 1 << 20
"""The largest description frame a receiver parses."""
MAX_DATA = 1 << 31


def in_layers(piece: Piece, layers: range) -> Piece | None:
    """``piece`` restricted to the layers in ``layers`` (a stream layer group), None when it
    has none of them [STREAM-1]; its data are views, nothing is copied."""
    keep = [i for i, layer in enumerate(piece.layers) if layer in layers]
    if not keep:
        return None
    if len(keep) == len(piece.layers):
        return piece
    data = piece.data[keep[0] : keep[-1] + 1] if _contiguous(keep) else piece.data[keep]
    return Piece(
        piece.group,
        piece.src,
        piece.dst,
        tuple(piece.layers[i] for i in keep),
        data,
        piece.heads,
        piece.tokens,
        piece.part,
        piece.dst_offset,
    )


def _contiguous(index: list[int]) -> bool:
    return index == list(range(index[0], index[-1] + 1))


def _describe(piece: Piece) -> dict[str, Any]:
    about: dict[str, Any] = {"group": piece.group, "layers": list(piece.layers)}
    if piece.heads is not None:
        assert piece.tokens is not None
        about["heads"] = [piece.heads.start, piece.heads.stop]
        about["tokens"] = piece.tokens.to_list()
        if piece.part is not None:  # an MLA group's indexer part [INDEX-1]
            about["part"] = piece.part
    else:
        about["part"] = piece.part
        about["dst_offset"] = piece.dst_offset
    return about


def pieces_frames(pieces: list[Piece]) -> list[Any]:
    """``[description, data...]`` of ``pieces``; each data frame shares its tensor's memory."""
    frames: list[Any] = [dump({"pieces": [_describe(p) for p in pieces]})]
    for piece in pieces:
        data = piece.data.contiguous().view(torch.uint8).reshape(-1).numpy()
        frames.append(data.data)  # memoryview(data)
    return frames


def read_pieces(frames: list[Any], *, model: ModelShape, src: int, dst: int) -> list[Piece]:
    """The pieces ``frames`` (``[description, data...]``) carry from ``src`` to ``dst``;
    anything that does not describe them exactly is refused (:class:`MessageError`)."""
    if not frames:
        raise MessageError("a message of pieces has a description frame, got none")
    about = load(frames[0], limit=MAX_DESCRIPTION)
    listed = about.get("pieces")
    if not isinstance(listed, list) or len(listed) != len(frames) - 1:
        count = len(listed) if isinstance(listed, list) else short(listed)
        raise MessageError(
            f"the description lists {count} piece(s); the message has {len(frames) - 1} "
            "data frame(s)"
        )
    out = []
    for header, data in zip(listed, frames[1:], strict=True):
        if not isinstance(header, dict):
            raise MessageError(f"a piece is described by an object, got {short(header)}")
        out.append(read_piece(header, data, model=model, src=src, dst=dst))
    return out


def _int(header: dict[str, Any], name: str, low: int, high: int) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MessageError(f"{name} must be an integer in {low}..{high}, got {short(value)}")
    return value


def read_piece(
    header: dict[str, Any], data: bytes | memoryview, *, model: ModelShape, src: int, dst: int
) -> Piece:
    """The piece a header and its data frame describe; the dtype and shape come from
    ``model`` and the coordinates, and a data frame of another length is refused."""
    group = _int(header, "group", 0, len(model.layer_groups) - 1)
    layers = header.get("layers")
    if (
        not isinstance(layers, list)
        or not 1 <= len(layers) <= model.num_layers
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        or not all(0 <= x < model.num_layers for x in layers)
    ):
        raise MessageError(
            f"layers must be 1..{model.num_layers} layer indices, got {short(layers)}"
        )
    if len(data) > MAX_DATA:
        raise MessageError(f"a {len(data)}-byte data frame exceeds the {MAX_DATA}-byte limit")
    kind = model.layer_groups[group]
    if isinstance(kind, FullAttention):
        heads = header.get("heads")
        if (
            not isinstance(heads, list)
            or len(heads) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in heads)
            or not 0 <= heads[0] < heads[1] <= kind.num_kv_heads
        ):
            raise MessageError(
                f"heads must be [start, stop] within 0..{kind.num_kv_heads}, got {short(heads)}"
            )
        try:
            tokens = Tokens.from_list(header.get("tokens"))
        except ValueError as error:
            raise MessageError(f"tokens: {error}") from None
        shape: tuple[int, ...] = (
            len(layers),
            kind.kv_tensors,
            len(tokens),
            heads[1] - heads[0],
            kind.head_dim,
        )
        dtype = model.dtype
        extra: dict[str, Any] = {"heads": range(*heads), "tokens": tokens}
        if "part" in header:  # an indexer part: dtype and width from the model [INDEX-1]
            parts = dict(INDEX_PARTS) if kind.index_head_dim else {}
            part = header["part"]
            if part not in parts:
                known = ", ".join(parts) or f"none (group {group} keeps no indexer)"
                raise MessageError(f"part must be one of {known}, got {short(part)}")
            assert kind.index_head_dim is not None
            shape = (len(layers), len(tokens), index_widths(kind.index_head_dim)[part])
            dtype = parts[part]
            extra["part"] = part
    else:
        state = state_group(model, group)
        names = [p.name for p in state.parts()]
        part = header.get("part")
        if part not in names:
            raise MessageError(f"part must be one of {', '.join(names)}, got {short(part)}")
        offset = _int(header, "dst_offset", 0, 1 << 40)
        dtype = part_dtype(model, state, part)
        if len(data) % itemsize(dtype):
            raise MessageError(f"{len(data)} bytes are not whole {dtype} elements of part {part}")
        shape = (len(data) // itemsize(dtype),)
        extra = {"part": part, "dst_offset": offset}
    expected = math.prod(shape) * itemsize(dtype)
    if len(data) != expected:
        raise MessageError(
            f"a piece of group {group} with shape {shape} in {dtype} is {expected} bytes; "
            f"the data frame has {len(data)}"
        )
    values = (
        torch.frombuffer(bytearray(data), dtype=torch_dtype(dtype))
        if expected
        else (torch.empty(0, dtype=torch_dtype(dtype)))
    )
    return Piece(group, src, dst, tuple(layers), values.reshape(shape), **extra)
