"""The payload: one edge's KV for one request (or one chunk of it), in the compatible dict form.

A :class:`Payload` is the form of a :class:`~kvspec.tensors.reshard.Shipment` that crosses
process boundaries [PAYLOAD-2]. Its dict form is the one connectors in the field
exchange [PAYLOAD-1]::

    {
      "request_id": "req-7",
      "layer_blocks": {
        "key_cache":   [None, None, <[seq, heads, head_dim]>, <...>],  # one per global layer
        "value_cache": [None, None, <[seq, heads, head_dim]>, <...>],  # MLA: all None
        "key_scale":   [None, None, <0-d float32>, <...>],             # fp8 only
        "value_scale": [None, None, <0-d float32>, <...>],             # fp8 only; MLA: None
      },
      "block_ids": [3, 9],            # the sender's blocks holding these tokens
      "metadata": {
        "block_size": 16, "num_layers": 4, "dtype": "bfloat16", "seq_len": 20,
        "tp_head_slice": {"target_rank": 1, "from_tp": 2, "to_tp": 4,
                          "offset_in_shard": 1, "num_slices": 2,
                          "applied": True, "side": "sender"},
        "chunk": {"chunk_id": 0, "token_start": 0, "final": True},   # optional
      },
    }

Caches are token-major ``[seq, heads, head_dim]`` (an MLA latent is one "head" of
width latent_dim [MODEL-2]) and ``None`` for every layer the edge does not carry.
fp8 scales [DTYPE-3] travel beside the caches as 0-d float32 tensors, one per
present cache, so they stay raw bits on every path (JSON would turn them into
decimal text); for other dtypes the two scale lists are absent. ``chunk`` says which
token range of the request the payload holds [CHUNK-1]; without it the payload is
the whole request.

Merging several senders' payloads into one receiver shard first checks that they
agree, then hands them to :func:`kvspec.tensors.reshard.receive` as shipments, so placement
has one implementation [PAYLOAD-3].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, overload

import torch

from kvspec._checks import require_int, show
from kvspec.clause import Clause, must, refuses
from kvspec.errors import FormError
from kvspec.forms import build
from kvspec.naming.keys import check_request_id
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import FP8_DTYPES, bit_equal, check_dtype, dtype_name, torch_dtype
from kvspec.tensors.kv import SCALES_DTYPE, RequestKV
from kvspec.tensors.reshard import Shipment, landing_region, landing_shape, receive
from kvspec.tensors.slicing import HeadSlice, apply_head_slice
from kvspec.topology.plan import TransferPlan
from kvspec.topology.tokens import Tokens

CLAUSES = (
    Clause(
        "PAYLOAD-1",
        "The payload and its dict form",
        "A payload has request_id, layer_blocks (key_cache and value_cache: one "
        "[seq_len, heads, head_dim] tensor or None per global layer; fp8 only: key_scale and "
        "value_scale, a 0-d float32 tensor exactly where the matching cache is present), "
        "block_ids (integers >= 0, the sender's blocks) and metadata (block_size >= 1, "
        "num_layers = the length of each list, dtype, seq_len >= 0, tp_head_slice [SLICE-3], "
        "optional chunk [CHUNK-1]). At least one layer is present; every present tensor has "
        "the dtype, seq_len and one shape, on one device; a layer has K and V (MHA/GQA) or "
        "only K (the MLA latent), the same for every present layer. Unknown or missing keys "
        "and anything else are refused, naming the value.",
        obligations=(
            refuses("a missing or unknown key in the payload's metadata, marker or chunk"),
            refuses(
                "a present tensor whose dtype, seq_len or shape disagrees with the metadata or the "
                "other tensors"
            ),
            refuses("fp8 scales missing where the cache is present, or present where it is absent"),
            refuses("block_size < 1, a negative block id, or an empty request id"),
        ),
    ),
    Clause(
        "PAYLOAD-2",
        "A payload is one edge's shipment",
        "The payload on edge s->t carries exactly the edge's layers (None elsewhere), the "
        "model's num_layers and dtype, K and V for MHA/GQA or the latent alone for MLA, and "
        "the edge's tp_head_slice marker; converting a shipment to a payload and back gives "
        "the same shipment.",
        obligations=(
            refuses("a payload whose num_layers, dtype or K/V count differ from the model's"),
            refuses("a payload carrying a layer outside its edge's layers"),
        ),
    ),
    Clause(
        "PAYLOAD-3",
        "Merging payloads checks agreement, then places by the plan",
        "The payloads a receiver merges must agree on request_id, seq_len (when no stage has "
        "token shards; else each carries its edge's tokens [SLICE-4]), num_layers, "
        "dtype, block_size and chunk, and each must carry exactly its edge's layers: a layer "
        "present on one shard and missing on another that should carry it is refused. They "
        "are then placed by RESHARD-3 in source-rank order, so arrival order does not matter. "
        "The result is the receiver's shard as a payload: its layers (and tokens), marker "
        "num_slices 1 applied by the receiver, the lowest source rank's block_ids.",
        obligations=(
            must(
                "merging in any arrival order gives the receiver's shard, placed in source-rank "
                "order and marked num_slices 1, applied by the receiver"
            ),
            refuses("shards that disagree on request_id alone"),
            refuses("shards that disagree on seq_len alone"),
            refuses("shards that disagree on num_layers alone"),
            refuses("shards that disagree on dtype alone"),
            refuses("shards that disagree on block_size alone"),
            refuses("shards that disagree on chunk alone"),
            refuses("a layer present on one shard and missing on another that should carry it"),
            must("the merged payload carries the lowest source rank's block_ids"),
        ),
    ),
)

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


# -- shipments and payloads [PAYLOAD-2] ---------------------------------------------------


def payload_from_shipment(
    plan: TransferPlan,
    shipment: Shipment,
    request_id: str,
    *,
    block_size: int = 16,
    block_ids: Iterable[int] = (),
    chunk: Chunk | None = None,
) -> Payload:
    """The payload of one shipment: its edge's layers, None elsewhere [PAYLOAD-2].

    Tensors are views of the shipment's KV; nothing is copied.
    """
    edge, kv = shipment.edge, shipment.kv
    layers: dict[str, list[torch.Tensor | None]] = {
        name: [None] * plan.model.num_layers for name in TENSOR_FIELDS
    }
    for i, layer in enumerate(edge.layers):
        for j in range(plan.model.kv_tensors):
            layers[CACHE_FIELDS[j]][layer] = kv.data[i, j]
            if kv.scales is not None:
                layers[SCALE_FIELDS[j]][layer] = kv.scales[i, j]
    fp8 = plan.model.dtype in FP8_DTYPES
    return Payload(
        request_id=request_id,
        key_cache=tuple(layers["key_cache"]),
        value_cache=tuple(layers["value_cache"]),
        block_ids=tuple(block_ids),
        block_size=block_size,
        dtype=dtype_name(kv.data.dtype),
        seq_len=kv.seq_len,
        head_slice=shipment.marker,
        chunk=Chunk() if chunk is None else chunk,
        key_scale=tuple(layers["key_scale"]) if fp8 else None,
        value_scale=tuple(layers["value_scale"]) if fp8 else None,
    )


def shipment_from_payload(
    plan: TransferPlan,
    src: int,
    dst: int,
    payload: Payload,
    *,
    out: torch.Tensor | None = None,
) -> Shipment:
    """The shipment a payload from ``src`` to ``dst`` stands for [PAYLOAD-2, RESHARD-3];
    its tensors copied into ``out`` when given (:meth:`Payload.to_request_kv`)."""
    if src not in plan.sources_of(dst):
        raise ValueError(
            f"target rank {dst} got a payload from source rank {src}, which is not one of its "
            f"plan sources {list(plan.sources_of(dst))} [RESHARD-3]"
        )
    edge = plan.edge(src, dst)
    model = plan.model
    where = f"payload from source rank {src} to target rank {dst}"
    if payload.num_layers != model.num_layers or payload.dtype != model.dtype:
        raise ValueError(
            f"{where} has num_layers={payload.num_layers}, dtype={payload.dtype!r}; the model "
            f"has num_layers={model.num_layers}, dtype={model.dtype!r} [PAYLOAD-2]"
        )
    if payload.kv_tensors != model.kv_tensors:
        raise ValueError(
            f"{where} carries {payload.kv_tensors} tensor(s) per layer; a {model.attention} "
            f"model has {model.kv_tensors} [PAYLOAD-2]"
        )
    if payload.layers != tuple(edge.layers):
        raise ValueError(
            f"{where} carries layers {_span(payload.layers)} but its edge carries "
            f"{_span(tuple(edge.layers))} [PAYLOAD-2]"
        )
    return Shipment(edge, payload.head_slice, payload.to_request_kv(out=out))


def slice_payload(payload: Payload, my_rank: int) -> Payload:
    """Receiver-side slicing of a whole payload [SLICE-3].

    A payload marked for another rank is refused; an applied slice is returned as is
    (the same object), so slicing twice is slicing once.
    """
    marker = payload.head_slice
    # Refuses a payload marked for another rank, whether or not its slice is applied.
    apply_head_slice(payload._first(), marker, my_rank=my_rank, head_axis=HEAD_AXIS)
    if marker.applied:
        return payload

    def cut(values: Layers) -> Layers:
        out = []
        for t in values:
            if t is not None:
                t, _ = apply_head_slice(t, marker, my_rank=my_rank, head_axis=HEAD_AXIS)
            out.append(t)
        return tuple(out)

    return replace(
        payload,
        key_cache=cut(payload.key_cache),
        value_cache=cut(payload.value_cache),
        head_slice=replace(marker, applied=True, side="receiver"),
    )


# -- merging [PAYLOAD-3] ----------------------------------------------------------------

_AGREED = ("request_id", "seq_len", "num_layers", "dtype", "block_size", "chunk")


def merge_to_request_kv(
    plan: TransferPlan,
    dst: int,
    received: Iterable[tuple[int, Payload]],
    *,
    landing: torch.Tensor | None = None,
) -> RequestKV:
    """Receiver ``dst``'s shard as one :class:`RequestKV`, from ``(source rank, payload)``
    pairs in any order [PAYLOAD-3]: the checks of :func:`merge_payloads` without building
    the dict form again, for a receiver that writes the shard into its cache next.

    ``landing``: a receiver's reused buffer, a 1-d uint8 tensor whose first bytes receive
    the shard (the result's data is a view of them) instead of fresh memory, whose pages
    would fault on first touch. Each payload's tensors are copied once, straight into
    their place in the shard (:func:`~kvspec.tensors.reshard.landing_region`), and
    :func:`~kvspec.tensors.reshard.receive` checks and places the shipments as always
    [RESHARD-3], finding those in place. Fresh memory is used instead when the shard does
    not fit the buffer or lives on another device; a payload whose place is not one view
    (its edge carries some of the shard's tokens [SLICE-4]) or that does not fit its place
    goes through fresh memory and is placed, or refused, by receive. On a refusal the
    buffer may hold part of the shard; nothing is returned from it."""
    pairs = list(received)
    for src, payload in pairs:
        require_int("source rank", src, minimum=0)
        if not isinstance(payload, Payload):
            raise ValueError(f"expected a Payload from source rank {src}, got {show(payload)}")
    _check_agreement(dst, pairs, tokens=plan.seq_len is not None)
    _check_layers(plan, dst, pairs)
    out = _landing_shard(plan, dst, pairs, landing)
    if out is None:
        shipments = [shipment_from_payload(plan, src, dst, p) for src, p in pairs]
        return receive(plan, dst, shipments)
    shipments = [_landed_shipment(plan, src, dst, p, out) for src, p in pairs]
    return receive(plan, dst, shipments, out=out)


def _landing_shard(
    plan: TransferPlan,
    dst: int,
    pairs: list[tuple[int, Payload]],
    landing: torch.Tensor | None,
) -> torch.Tensor | None:
    """Receiver ``dst``'s shard as a view of the first bytes of ``landing``, or None where
    the buffer does not apply (none given, no payload, too small, another device or
    dtype than the payloads') [PAYLOAD-3]."""
    if landing is None:
        return None
    if (
        not isinstance(landing, torch.Tensor)
        or landing.dtype != torch.uint8
        or landing.dim() != 1
        or not landing.is_contiguous()
    ):
        shown = (
            f"{landing.dtype} {list(landing.shape)}"
            if isinstance(landing, torch.Tensor)
            else show(landing)
        )
        raise ValueError(f"landing must be a contiguous 1-d uint8 tensor, got {shown}")
    if not pairs:
        return None
    first = pairs[0][1]
    dtype = torch_dtype(plan.model.dtype)
    if any(p.device != landing.device or p.dtype != plan.model.dtype for _, p in pairs):
        return None
    shape = landing_shape(plan, dst, first.seq_len)
    if shape is None:
        return None
    need = math.prod(shape) * dtype.itemsize
    if need > landing.numel():
        return None
    return landing[:need].view(dtype).view(shape)


def _landed_shipment(
    plan: TransferPlan, src: int, dst: int, payload: Payload, out: torch.Tensor
) -> Shipment:
    """The shipment of ``payload``, its tensors copied once into their place in receiver
    ``dst``'s shard ``out`` (receiver-side slicing cut first, as views [SLICE-3]); or,
    where there is no such place or the payload does not fit it, copied into fresh
    memory for :func:`~kvspec.tensors.reshard.receive` to place or refuse with its
    reasons [PAYLOAD-2, RESHARD-3]."""
    if src not in plan.sources_of(dst) or payload.head_slice.target_rank != dst:
        return shipment_from_payload(plan, src, dst, payload)
    edge = plan.edge(src, dst)
    region = landing_region(plan, edge, out)
    if region is None:
        return shipment_from_payload(plan, src, dst, payload)
    try:
        cut = slice_payload(payload, dst)
    except ValueError:
        return shipment_from_payload(plan, src, dst, payload)  # refused there, with reasons
    if not cut._fits(region):
        return shipment_from_payload(plan, src, dst, payload)
    return shipment_from_payload(plan, src, dst, cut, out=region)


def merge_payloads(
    plan: TransferPlan, dst: int, received: Iterable[tuple[int, Payload]]
) -> Payload:
    """Receiver ``dst``'s shard from ``(source rank, payload)`` pairs [PAYLOAD-3].

    The pairs may come in any order (``dict.items()`` of payloads by source rank, or
    as they arrived); the result does not depend on it.
    """
    pairs = list(received)
    if not pairs and not plan.sources_of(dst):
        raise ValueError(
            f"target rank {dst} has no edge in this plan (it holds no token of the request, or "
            "the request lives on another DP group): there is nothing to merge [PAYLOAD-3]"
        )
    kv = merge_to_request_kv(plan, dst, pairs)
    first = min(pairs, key=lambda pair: pair[0])[1]
    owner = plan.owner("target", dst)
    fp8 = kv.scales is not None
    layers: dict[str, list[torch.Tensor | None]] = {
        name: [None] * plan.model.num_layers for name in TENSOR_FIELDS
    }
    for i, layer in enumerate(owner.layers):
        for j in range(plan.model.kv_tensors):
            layers[CACHE_FIELDS[j]][layer] = kv.data[i, j]
            if kv.scales is not None:
                layers[SCALE_FIELDS[j]][layer] = kv.scales[i, j]
    tokens = None
    if plan.seq_len is not None:
        tokens = owner.tokens if owner.tokens is not None else Tokens.span(0, plan.seq_len)
    marker = HeadSlice(
        target_rank=dst,
        from_tp=plan.source.tp,
        to_tp=plan.target.tp,
        offset_in_shard=0,
        num_slices=1,
        applied=True,
        side="receiver",
        tokens=tokens,
    )
    return replace(
        first,
        seq_len=kv.seq_len,
        key_cache=tuple(layers["key_cache"]),
        value_cache=tuple(layers["value_cache"]),
        key_scale=tuple(layers["key_scale"]) if fp8 else None,
        value_scale=tuple(layers["value_scale"]) if fp8 else None,
        head_slice=marker,
    )


def _check_agreement(dst: int, pairs: list[tuple[int, Payload]], *, tokens: bool = False) -> None:
    """Refuse shards that disagree on any fact of one request, naming every value; with
    token shards each payload carries its own edge's tokens, so seq_len may differ."""
    problems = []
    for fact in _AGREED:
        if tokens and fact == "seq_len":
            continue
        values = {src: getattr(p, fact) for src, p in sorted(pairs, key=lambda pair: pair[0])}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"source rank {src}: {v!r}" for src, v in values.items())
            problems.append(f"{fact} ({shown})")
    if problems:
        raise ValueError(
            f"payloads to target rank {dst} disagree on " + "; ".join(problems) + " [PAYLOAD-3]"
        )


def _check_layers(plan: TransferPlan, dst: int, pairs: list[tuple[int, Payload]]) -> None:
    """A layer present on one shard and missing on another that should carry it [PAYLOAD-3]."""
    expected = {e.src: tuple(e.layers) for e in plan.edges_to(dst)}
    present = {src: set(p.layers) for src, p in pairs}
    for src, p in sorted(pairs, key=lambda pair: pair[0]):
        if src not in expected:
            continue  # refused with its reason by shipment_from_payload [RESHARD-3]
        missing = sorted(set(expected[src]) - set(p.layers))
        for layer in missing:
            holders = sorted(s for s, layers in present.items() if layer in layers and s != src)
            if holders:
                raise ValueError(
                    f"layer {layer} is present on the shard of source rank {holders[0]} and "
                    f"missing on the shard of source rank {src}, whose edge to target rank "
                    f"{dst} carries layers {_span(expected[src])} [PAYLOAD-3]"
                )


def _span(layers: tuple[int, ...]) -> str:
    if not layers:
        return "[]"
    if layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return str(list(layers))
