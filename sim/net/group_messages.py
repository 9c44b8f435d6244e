"""The messages of a hybrid run: one piece of one layer group per message, never pickle.

A piece message is ``[header, data]``: the header the run's token, a space and a JSON
object naming the request, the group, the sender, the piece's coordinates (layers, and
heads and tokens for per-token KV [GROUP-3], with the indexer part for an MLA group's
indexer [INDEX-1], or the state part and the offset it lands at [STATE-2]);
the data frame the raw elements. Nothing about the data's dtype or shape is read from
the wire: the receiver derives both from the model it runs and the coordinates, and
refuses a frame of another length. An *end* message says how many pieces a sender sent
a receiver. The token is compared (in constant time) before any byte of the JSON is
parsed, so a stranger without it reaches no parser. See
:mod:`kvspec.tensors.group_reshard` for the pieces themselves.
"""

from __future__ import annotations

import hmac
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

VERSION = 1
MAX_HEADER = 64 << 10
MAX_DATA = 1 << 31


def piece_frames(piece: Piece, *, run: str, request: str) -> list[Any]:
    """``[header, data]`` of one piece; the data frame shares the tensor's memory."""
    header: dict[str, Any] = {
        "v": VERSION,
        "type": "piece",
        "request": request,
        "group": piece.group,
        "src": piece.src,
        "layers": list(piece.layers),
    }
    if piece.heads is not None:
        assert piece.tokens is not None
        header["heads"] = [piece.heads.start, piece.heads.stop]
        header["tokens"] = piece.tokens.to_list()
        if piece.part is not None:  # an MLA group's indexer part [INDEX-1]
            header["part"] = piece.part
    else:
        header["part"] = piece.part
        header["dst_offset"] = piece.dst_offset
    data = piece.data.contiguous().view(torch.uint8).reshape(-1).numpy()
    return [_with_token(run, header), data.data]  # data.data: memoryview(data)


def end_frames(*, run: str, src: int, pieces: int) -> list[bytes]:
    """The sender's last message to one receiver: how many pieces it sent."""
    return [_with_token(run, {"v": VERSION, "type": "end", "src": src, "pieces": pieces})]


def _with_token(run: str, header: dict[str, Any]) -> bytes:
    return run.encode() + b" " + dump(header)


def _int(header: dict[str, Any], name: str, low: int, high: int) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MessageError(f"{name} must be an integer in {low}..{high}, got {short(value)}")
    return value


def read_header(frame: bytes | memoryview, *, run: str) -> dict[str, Any]:
    """The header of a piece or end message of run ``run``; anything else is refused,
    and a frame that does not start with the run's token before its JSON is parsed."""
    token = run.encode() + b" "
    if len(frame) > MAX_HEADER + len(token):
        raise MessageError(f"a {len(frame)}-byte header exceeds the {MAX_HEADER}-byte limit")
    if not hmac.compare_digest(bytes(frame[: len(token)]), token):
        raise MessageError("a message of another run (its run token does not match)")
    header = load(frame[len(token) :], limit=MAX_HEADER)
    if header.get("v") != VERSION:
        raise MessageError(f"unknown message version {short(header.get('v'))}; this is {VERSION}")
    if header.get("type") not in ("piece", "end"):
        raise MessageError(f"unknown message type {short(header.get('type'))}")
    return header


def read_piece(
    header: dict[str, Any], data: bytes | memoryview, *, model: ModelShape, dst: int, sources: int
) -> Piece:
    """The piece a checked header and its data frame describe; the dtype and shape come
    from ``model`` and the coordinates, and a data frame of another length is refused."""
    group = _int(header, "group", 0, len(model.layer_groups) - 1)
    src = _int(header, "src", 0, sources - 1)
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
