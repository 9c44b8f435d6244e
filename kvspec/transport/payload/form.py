"""The payload and its compatible dict form, refused with the values that break it [PAYLOAD-1].

A :class:`Payload` holds one edge's KV for one request or one :class:`Chunk` of it:
token-major ``[seq, heads, head_dim]`` caches per global layer (``None`` where the edge
does not carry the layer), fp8 scales beside them as 0-d float32 tensors [DTYPE-3],
the sender's block ids and the metadata (block size, layers, dtype, tokens, the head
slice marker [SLICE-3], the chunk [CHUNK-1]). :meth:`Payload.to_dict` and
:meth:`Payload.from_dict` are the dict form connectors in the field exchange
(:mod:`kvspec.transport.payload` shows it); a payload that breaks a rule of it is
refused on construction, naming the offending value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, overload

import torch

from kvspec.core.errors import FormError
from kvspec.core.forms import build
from kvspec.core.require import require_int, show
from kvspec.naming.keys import check_request_id
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import FP8_DTYPES, bit_equal, check_dtype, torch_dtype
from kvspec.tensors.kv import SCALES_DTYPE, RequestKV
from kvspec.tensors.slicing import HeadSlice

CACHE_FIELDS: tuple[str, ...] = ("key_cache", "value_cache")
SCALE_FIELDS: tuple[str, ...] = ("key_scale", "value_scale")
TENSOR_FIELDS: tuple[str, ...] = CACHE_FIELDS + SCALE_FIELDS
HEAD_AXIS = 1
"""The head axis of a payload tensor: ``[seq, heads, head_dim]``."""

_TOP_KEYS = frozenset({"request_id", "layer_blocks", "block_ids", "metadata"})
_META_KEYS = frozenset({"block_size", "num_layers", "dtype", "seq_len", "tp_head_slice"})
_META_OPTIONAL = frozenset({"chunk"})

Layers = tuple[torch.Tensor | None, ...]


@dataclass(frozen=True)
class Chunk:
    """Which tokens of the request a payload holds [CHUNK-1].

    Tokens ``token_start .. token_start + seq_len - 1``; ``final`` marks the chunk that
    ends the request. The default is the whole request in one chunk.
    """

    chunk_id: int = 0
    token_start: int = 0
    final: bool = True

    def __post_init__(self) -> None:
        require_int("chunk_id", self.chunk_id, minimum=0)
        require_int("token_start", self.token_start, minimum=0)
        if not isinstance(self.final, bool):
            raise ValueError(f"chunk final must be a bool, got {show(self.final)} [CHUNK-1]")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Chunk:
        _require_keys("metadata.chunk", data, frozenset({"chunk_id", "token_start", "final"}))
        assert isinstance(data, Mapping)
        return build(
            "metadata.chunk", lambda: cls(data["chunk_id"], data["token_start"], data["final"])
        )


def _require_keys(
    where: str, data: object, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> None:
    if not isinstance(data, Mapping):
        raise FormError(f"{where} must be a dict, got {show(data)} [PAYLOAD-1]")
    keys = set(data)
    missing, unknown = sorted(required - keys), keys - required - optional
    if missing or unknown:
        shown = ", ".join(sorted(show(k, 30) for k in list(unknown)[:8]))
        raise FormError(
            f"{where} has missing keys {missing} and unknown keys [{shown}]; expected "
            f"{sorted(required)} (optional {sorted(optional)}) [PAYLOAD-1]"
        )


@dataclass(frozen=True)
class Payload:
    """One edge's KV for one request or chunk [PAYLOAD-1, PAYLOAD-2]."""

    request_id: str
    key_cache: Layers
    value_cache: Layers
    block_ids: tuple[int, ...]
    block_size: int
    dtype: str
    seq_len: int
    head_slice: HeadSlice
    chunk: Chunk = field(default_factory=Chunk)
    key_scale: Layers | None = None
    value_scale: Layers | None = None

    def __post_init__(self) -> None:
        for name in ("key_cache", "value_cache", "block_ids", "key_scale", "value_scale"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        _validate(self)

    # -- what the payload holds -------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return len(self.key_cache)

    @property
    def layers(self) -> tuple[int, ...]:
        """Global ids of the layers present, ascending."""
        return tuple(i for i, k in enumerate(self.key_cache) if k is not None)

    def _first(self) -> torch.Tensor:
        return next(k for k in self.key_cache if k is not None)

    @property
    def kv_tensors(self) -> int:
        """2 when layers carry K and V, 1 for an MLA latent [MODEL-2]."""
        return 1 if all(v is None for v in self.value_cache) else 2

    @property
    def heads(self) -> int:
        return self._first().shape[HEAD_AXIS]

    @property
    def head_dim(self) -> int:
        return self._first().shape[2]

    @property
    def device(self) -> torch.device:
        return self._first().device

    def with_layers(self, edit: Callable[[Layers], Layers]) -> Payload:
        """This payload with ``edit`` applied to each per-layer tuple: K, V and, where
        present, their scales (validated again, as any payload is)."""
        return replace(
            self,
            key_cache=edit(self.key_cache),
            value_cache=edit(self.value_cache),
            key_scale=None if self.key_scale is None else edit(self.key_scale),
            value_scale=None if self.value_scale is None else edit(self.value_scale),
        )

    def tensors(self) -> list[tuple[str, int, torch.Tensor]]:
        """Every present tensor as ``(field, layer, tensor)``, layer by layer."""
        found = []
        for layer in range(self.num_layers):
            for name in TENSOR_FIELDS:
                values = getattr(self, name)
                if values is not None and values[layer] is not None:
                    found.append((name, layer, values[layer]))
        return found

    def to(self, device: str | torch.device) -> Payload:
        """The same payload with every tensor on ``device``."""

        @overload
        def move(values: Layers) -> Layers: ...
        @overload
        def move(values: Layers | None) -> Layers | None: ...
        def move(values: Layers | None) -> Layers | None:
            if values is None:
                return None
            return tuple(None if t is None else t.to(device) for t in values)

        return replace(
            self,
            key_cache=move(self.key_cache),
            value_cache=move(self.value_cache),
            key_scale=move(self.key_scale),
            value_scale=move(self.value_scale),
        )

    # -- the compatible dict form [PAYLOAD-1] ----------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The JSON-able ``metadata`` dict."""
        return {
            "block_size": self.block_size,
            "num_layers": self.num_layers,
            "dtype": self.dtype,
            "seq_len": self.seq_len,
            "tp_head_slice": self.head_slice.to_dict(),
            "chunk": self.chunk.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        """The compatible payload dict (lists of tensors or None) [PAYLOAD-1]."""
        blocks: dict[str, Any] = {
            "key_cache": list(self.key_cache),
            "value_cache": list(self.value_cache),
        }
        if self.key_scale is not None:
            blocks["key_scale"] = list(self.key_scale)
            blocks["value_scale"] = list(self.value_scale or ())
        return {
            "request_id": self.request_id,
            "layer_blocks": blocks,
            "block_ids": list(self.block_ids),
            "metadata": self.metadata(),
        }

    @classmethod
    def from_dict(cls, data: object) -> Payload:
        """Parse and validate a compatible payload dict [PAYLOAD-1]."""
        _require_keys("payload", data, _TOP_KEYS)
        assert isinstance(data, Mapping)
        meta = data["metadata"]
        _require_keys("metadata", meta, _META_KEYS, _META_OPTIONAL)
        fp8 = meta["dtype"] in FP8_DTYPES
        blocks = data["layer_blocks"]
        _require_keys("layer_blocks", blocks, frozenset(TENSOR_FIELDS if fp8 else CACHE_FIELDS))
        num_layers = require_int("metadata.num_layers", meta["num_layers"], minimum=1)
        lists = {}
        for name in blocks:
            values = blocks[name]
            if not isinstance(values, list | tuple) or len(values) != num_layers:
                shown = len(values) if isinstance(values, list | tuple) else type(values).__name__
                raise FormError(
                    f"layer_blocks.{name} must be a list of num_layers={num_layers} entries, "
                    f"got {shown} [PAYLOAD-1]"
                )
            lists[name] = tuple(values)
        block_ids = data["block_ids"]
        if not isinstance(block_ids, list | tuple):
            raise FormError(f"block_ids must be a list, got {show(block_ids)} [PAYLOAD-1]")
        marker = meta["tp_head_slice"]
        if not isinstance(marker, Mapping):
            raise FormError(f"metadata.tp_head_slice must be a dict, got {show(marker)} [SLICE-3]")
        chunk = Chunk.from_dict(meta["chunk"]) if "chunk" in meta else Chunk()
        return build(
            None,
            lambda: cls(
                request_id=data["request_id"],
                key_cache=lists["key_cache"],
                value_cache=lists["value_cache"],
                block_ids=tuple(block_ids),
                block_size=meta["block_size"],
                dtype=meta["dtype"],
                seq_len=meta["seq_len"],
                head_slice=HeadSlice.from_dict(dict(marker)),
                chunk=chunk,
                key_scale=lists.get("key_scale"),
                value_scale=lists.get("value_scale"),
            ),
        )

    # -- the reference representation ----------------------------------------------------

    def to_request_kv(self, *, out: torch.Tensor | None = None) -> RequestKV:
        """The present layers as one :class:`RequestKV` ``[layers, kv, seq, heads, dim]``.

        The present layers must be contiguous, as every edge's are [PAYLOAD-2]. ``out``,
        a tensor of exactly that shape and the payload's dtype and device (a receiver's
        reused landing buffer, or this payload's place in it: a strided view), receives
        the copy instead of fresh memory, whose pages would fault on first touch; each
        tensor is copied once, as bits [DTYPE-2].
        """
        layers = self.layers
        if layers != tuple(range(layers[0], layers[-1] + 1)):
            raise ValueError(
                f"present layers {list(layers)} are not contiguous; an edge carries a "
                "contiguous layer range [PAYLOAD-2]"
            )
        fields = CACHE_FIELDS[: self.kv_tensors]
        first = self._first()
        want = (len(layers), len(fields), *first.shape)
        if out is None:
            data = first.new_empty(want)
        elif not self._fits(out):
            raise ValueError(
                f"out must be a {first.dtype} tensor of shape {list(want)} on "
                f"{first.device}; got {out.dtype} {list(out.shape)} on {out.device}"
            )
        else:
            data = out
        for i, layer in enumerate(layers):  # one copy of each tensor, straight into place
            for j, name in enumerate(fields):
                copy_bits(data[i, j], getattr(self, name)[layer])
        scales = None
        if self.key_scale is not None:
            scale_fields = SCALE_FIELDS[: self.kv_tensors]
            scales = torch.stack(
                [torch.stack([getattr(self, f)[layer] for f in scale_fields]) for layer in layers]
            )
        return RequestKV(data, scales)

    def _fits(self, out: torch.Tensor) -> bool:
        """Whether ``out`` has this payload's ``[layers, kv, seq, heads, dim]`` shape, dtype
        and device (see :meth:`to_request_kv`)."""
        first = self._first()
        want = (len(self.layers), self.kv_tensors, *first.shape)
        return tuple(out.shape) == want and out.dtype == first.dtype and out.device == first.device


def _validate(p: Payload) -> None:
    """Every rule of [PAYLOAD-1] (and [DTYPE-3] for scales), with the offending values."""
    check_request_id(p.request_id)
    require_int("block_size", p.block_size, minimum=1)
    require_int("seq_len", p.seq_len, minimum=0)
    check_dtype(p.dtype)
    if not isinstance(p.block_ids, tuple):
        raise ValueError(
            f"block_ids must be a list of integers, got {show(p.block_ids)} [PAYLOAD-1]"
        )
    for i, block in enumerate(p.block_ids):
        require_int(f"block_ids[{i}]", block, minimum=0)
    if not isinstance(p.head_slice, HeadSlice):
        raise ValueError(f"head_slice must be a HeadSlice, got {show(p.head_slice)} [SLICE-3]")
    if not isinstance(p.chunk, Chunk):
        raise ValueError(f"chunk must be a Chunk, got {show(p.chunk)} [CHUNK-1]")
    for name in CACHE_FIELDS:
        if not isinstance(getattr(p, name), tuple):
            raise ValueError(f"{name} must be a list, got {show(getattr(p, name))} [PAYLOAD-1]")
    if len(p.key_cache) != len(p.value_cache) or not p.key_cache:
        raise ValueError(
            f"key_cache and value_cache need one entry per layer (at least one): got "
            f"{len(p.key_cache)} and {len(p.value_cache)} [PAYLOAD-1]"
        )
    want_dtype = torch_dtype(p.dtype)
    shape: tuple[int, ...] | None = None
    device: torch.device | None = None
    kinds = set()
    for layer, (k, v) in enumerate(zip(p.key_cache, p.value_cache, strict=True)):
        if k is None and v is not None:
            raise ValueError(
                f"layer {layer} has a value_cache but no key_cache; a present layer has K (and "
                "V unless it is an MLA latent) [PAYLOAD-1]"
            )
        if k is None:
            continue
        kinds.add(v is not None)
        for name, t in (("key_cache", k), ("value_cache", v)):
            if t is None:
                continue
            where = f"{name}[{layer}]"
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{where} must be a tensor or None, got {show(t)} [PAYLOAD-1]")
            if t.dtype != want_dtype:
                raise ValueError(
                    f"{where} has dtype {t.dtype}, metadata says {p.dtype} [PAYLOAD-1]"
                )
            if t.dim() != 3 or t.shape[0] != p.seq_len or t.shape[1] < 1 or t.shape[2] < 1:
                raise ValueError(
                    f"{where} has shape {list(t.shape)}; expected [seq_len={p.seq_len}, heads "
                    ">= 1, head_dim >= 1] [PAYLOAD-1]"
                )
            if shape is None:
                shape, device = tuple(t.shape), t.device
            elif tuple(t.shape) != shape or t.device != device:
                raise ValueError(
                    f"{where} is {list(t.shape)} on {t.device}, but key_cache[{p.layers[0]}] is "
                    f"{list(shape)} on {device}; all present tensors share shape and device "
                    "[PAYLOAD-1]"
                )
    if shape is None:
        raise ValueError(f"payload of request {p.request_id!r} carries no layer [PAYLOAD-1]")
    if len(kinds) > 1:
        raise ValueError(
            "some present layers carry K and V and others only K: a payload is MHA/GQA (K and "
            "V in every present layer) or MLA (the latent in key_cache only) [PAYLOAD-1]"
        )
    _validate_scales(p, device)


def _validate_scales(p: Payload, device: torch.device | None) -> None:
    fp8 = p.dtype in FP8_DTYPES
    for name, cache in (("key_scale", p.key_cache), ("value_scale", p.value_cache)):
        scales = getattr(p, name)
        if not fp8:
            if scales is not None:
                raise ValueError(
                    f"{name} given for a {p.dtype} payload; only fp8 caches carry scales [DTYPE-3]"
                )
            continue
        if not isinstance(scales, tuple) or len(scales) != len(cache):
            raise ValueError(
                f"an {p.dtype} payload needs {name}: one entry per layer ({len(cache)}), got "
                f"{show(scales)} [DTYPE-3]"
            )
        for layer, (s, c) in enumerate(zip(scales, cache, strict=True)):
            where = f"{name}[{layer}]"
            if (s is None) != (c is None):
                state = "present" if c is not None else "absent"
                raise ValueError(
                    f"{where} must be present exactly where the cache is; the cache is {state} "
                    f"but the scale is {'absent' if s is None else 'present'} [DTYPE-3]"
                )
            if s is None:
                continue
            if not isinstance(s, torch.Tensor) or s.dim() != 0 or s.dtype != SCALES_DTYPE:
                shown = (
                    f"{s.dtype} {list(s.shape)}" if isinstance(s, torch.Tensor) else f"{show(s)}"
                )
                raise ValueError(f"{where} must be a 0-d float32 tensor, got {shown} [DTYPE-3]")
            if s.device != device:
                raise ValueError(f"{where} is on {s.device}, the caches on {device} [PAYLOAD-1]")


def payload_equal(a: Payload, b: Payload) -> bool:
    """Equal metadata and bit-equal tensors, layer by layer [DTYPE-2]."""
    if (a.request_id, a.block_ids, a.metadata()) != (b.request_id, b.block_ids, b.metadata()):
        return False
    for name in TENSOR_FIELDS:
        left, right = getattr(a, name), getattr(b, name)
        if (left is None) != (right is None):
            return False
        for x, y in zip(left or (), right or (), strict=True):
            if (x is None) != (y is None) or (x is not None and not bit_equal(x, y)):
                return False
    return True
