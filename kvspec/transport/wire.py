"""The wire format: a payload as a versioned JSON header plus one raw frame per tensor.

A message is a list of frames, ready for ``zmq`` ``send_multipart(frames, copy=False)``
[WIRE-1]::

    frame 0   UTF-8 JSON: {"format": "kvspec.payload", "version": 1,
                           "request_id": ..., "block_ids": [...], "metadata": {...},
                           "tensors": [{"field": "key_cache", "layer": 2,
                                        "dtype": "bfloat16", "shape": [20, 2, 128]}, ...]}
    frame i   the raw little-endian bytes of tensors[i-1], C order

``metadata`` is the payload's metadata dict [PAYLOAD-1]; ``field`` is one of
``key_cache``, ``value_cache``, ``key_scale``, ``value_scale``.

Encoding copies nothing for contiguous CPU tensors: each frame is a view of the
tensor's memory; CUDA tensors (and non-contiguous ones) are copied to host once
[WIRE-5] — into fresh memory, or into a caller's staging buffer (``encode(out=...)``,
sized by :func:`staging_nbytes`) that a sender reuses from message to message.
Decoding trusts nothing [WIRE-4]: limits on header bytes, frame count, total bytes and
layers are checked first, then the header is parsed strictly (JSON only: no pickle, no
eval, nothing that runs data), every dtype is looked up in the allow-list by name and
every frame's length must equal shape x itemsize before a tensor is made [WIRE-2,
WIRE-3]. An optional ``crc32`` (zlib's CRC-32) or ``crc32c`` (CRC-32C, hardware-fast)
key holds checksums of the header and every frame, checked before any tensor is made
[WIRE-6, WIRE-7]. The decoded tensors are views of the received frames: no tensor memory is
allocated. Every malformed input raises :class:`WireError`, a ``ValueError``.

Decoded tensors share memory with the frames; when a frame is read-only (``bytes``)
do not write into its tensors.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.errors import InputError
from kvspec.core.require import INT64_MAX, require_int, show
from kvspec.tensors.copying import copy_bits
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.transport.checksums import ALGORITHMS
from kvspec.transport.payload import CACHE_FIELDS, SCALE_FIELDS, TENSOR_FIELDS, Payload

CLAUSES = (
    Clause(
        "WIRE-1",
        "A message is a versioned JSON header and one raw frame per tensor",
        "Frame 0 is a UTF-8 JSON object with exactly format 'kvspec.payload', version 1, "
        "request_id, block_ids, metadata (as in PAYLOAD-1) and tensors: one entry {field, "
        "layer, dtype, shape} per present tensor. Frame i holds the raw little-endian bytes of "
        "tensors[i-1] in C order. A decoder refuses any other format or version.",
        obligations=(
            must(
                "the implementation's frames decode to the same payload with the spec's decoder, "
                "and the spec's frames with the implementation's"
            ),
            refuses("a header of another format or version (1.0 and '1' included)"),
            refuses("a header with a missing or unknown top-level key"),
        ),
    ),
    Clause(
        "WIRE-2",
        "Limits come first",
        "Before parsing, a decoder checks the frame count, the header's byte length and the "
        "total byte length against its limits, and num_layers before building per-layer "
        "lists; every size the header declares is checked against the frames before any "
        "tensor is made. Decoding allocates no tensor memory: tensors are views of the frames.",
        obligations=(
            refuses("a header declaring more layers than max_layers"),
            refuses("a header longer than max_header_bytes"),
        ),
    ),
    Clause(
        "WIRE-3",
        "Every tensor matches its frame",
        "A tensor entry names a field and a layer < num_layers, each pair once, a dtype from "
        "the allow-list [DTYPE-1] by name, and a shape of integers >= 0 ([seq, heads, dim] "
        "for caches, [] for scales) whose product times the dtype's itemsize equals the length "
        "of its frame; there is exactly one frame per entry.",
        obligations=(
            refuses("a frame whose length is not shape x itemsize (one byte short or long)"),
            refuses("a dtype name outside the allow-list (aliases such as 'bf16' included)"),
            refuses("a tensor entry with a layer >= num_layers, or a (field, layer) listed twice"),
            refuses("a message with one frame more or less than its tensor entries"),
        ),
    ),
    Clause(
        "WIRE-4",
        "Decoding trusts nothing",
        "decode returns a payload that satisfies PAYLOAD-1 or raises WireError (a ValueError) "
        "naming the problem, for every input: never another exception, never a hang, never "
        "an allocation beyond the limits. No pickle, eval or other code-loading is on the "
        "path; the header is strict JSON (no duplicate keys, NaN or floats).",
        obligations=(
            must("every malformed message is refused with a ValueError, never another exception"),
            refuses(
                "a header that is not JSON (pickle bytes included): nothing is unpickled or "
                "evaluated"
            ),
            refuses("a header that is not strict JSON: a repeated key, NaN or Infinity, a float"),
        ),
    ),
    Clause(
        "WIRE-5",
        "Zero copy where the memory allows",
        "Encoding frames contiguous CPU tensors as views of their memory; CUDA and "
        "non-contiguous tensors are copied to host once. Decoding returns views into the "
        "received frames. decode(encode(p)) equals p bit for bit [DTYPE-2].",
        obligations=(
            must(
                "encoding a contiguous CPU payload frames its tensors' own memory, without a copy"
            ),
            must("decoded tensors are views of the received frames: no tensor memory is allocated"),
        ),
    ),
    Clause(
        "WIRE-6",
        "Optional integrity: CRC-32 of the header and of every frame",
        "An encoder may add crc32 = {header, frames} to the header: header is the CRC-32 "
        "(zlib's, IEEE 802.3) of the header's canonical JSON without the crc32 key (sorted "
        "keys, no whitespace, ASCII), frames[i] the CRC-32 of tensor frame i+1. A decoder that "
        "finds crc32 checks every value before making any tensor and refuses a mismatch, so "
        "a flipped bit anywhere in the message is refused, not decoded.",
        obligations=(
            must(
                "a message with correct CRC-32s of its canonical header and every frame is decoded"
            ),
            refuses("a message with crc32 whose header or any frame was damaged (one flipped bit)"),
        ),
    ),
    Clause(
        "WIRE-7",
        "Optional integrity, hardware-fast: CRC-32C instead of CRC-32",
        "An encoder may add crc32c = {header, frames} instead of crc32: the same values over "
        "the same bytes (the canonical header without the checksum key, each tensor frame), "
        "computed with CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78, as "
        "iSCSI's RFC 3720 and the SSE 4.2 crc32 instruction; '123456789' gives 0xE3069283). "
        "A decoder that finds crc32c checks every value before making any tensor and refuses "
        "a mismatch. A header carries at most one of crc32 and crc32c: one with both is "
        "refused, whatever their values.",
        obligations=(
            must(
                "a message with correct CRC-32Cs of its canonical header and every frame is decoded"
            ),
            refuses(
                "a message with crc32c whose header or any frame was damaged (one flipped bit)"
            ),
            refuses("a header carrying both crc32 and crc32c"),
        ),
    ),
)

FORMAT = "kvspec.payload"
VERSION = 1
_HEADER_KEYS = frozenset({"format", "version", "request_id", "block_ids", "metadata", "tensors"})
_CHECKSUM_KEYS = ("crc32", "crc32c")
"""The header keys that may carry checksums, each named after its algorithm [WIRE-6, WIRE-7]."""
_TENSOR_KEYS = frozenset({"field", "layer", "dtype", "shape"})


class WireError(InputError):
    """A message the codec refuses: malformed, over a limit, or not a valid payload [WIRE-4]."""


@dataclass(frozen=True)
class WireLimits:
    """What a decoder accepts at most [WIRE-2]; an encoder refuses to exceed them too."""

    max_header_bytes: int = 1 << 20
    max_frames: int = 4097
    max_total_bytes: int = 1 << 34
    max_layers: int = 1024

    def __post_init__(self) -> None:
        require_int("max_header_bytes", self.max_header_bytes, minimum=2)
        require_int("max_frames", self.max_frames, minimum=2)
        require_int("max_total_bytes", self.max_total_bytes, minimum=2)
        require_int("max_layers", self.max_layers, minimum=1)


DEFAULT_LIMITS = WireLimits()


# -- encode -----------------------------------------------------------------------------


_STAGING_ALIGN = 64
"""Each staged tensor starts at a multiple of this many bytes of the staging buffer."""


def _staged(tensor: torch.Tensor) -> bool:
    """Whether encode must copy ``tensor`` to host memory: on a device or non-contiguous."""
    return tensor.numel() > 0 and (tensor.device.type != "cpu" or not tensor.is_contiguous())


def staging_nbytes(payload: Payload) -> int:
    """Bytes a staging buffer needs to encode ``payload`` with ``encode(out=...)``: its
    device and non-contiguous tensors, each at a 64-byte boundary [WIRE-5]."""
    total = 0
    for _, _, tensor in payload.tensors():
        if _staged(tensor):
            total = -(-total // _STAGING_ALIGN) * _STAGING_ALIGN + tensor.nbytes
    return total


def _stage_all(tensors: list[torch.Tensor], out: torch.Tensor) -> list[torch.Tensor]:
    """Copy every tensor into ``out``, each at the first 64-byte boundary after the one
    before it, each byte once; the copies, views of ``out`` [WIRE-5].

    Consecutive tensors that are one strided tensor's slices (same shape, strides and
    dtype, a constant distance apart, whole multiples of 64 bytes: a sliced request's
    K and V of every layer) are staged in one copy, which lands every byte where
    tensor-by-tensor staging would but lets a large copy run on every copy thread.
    """
    staged: list[torch.Tensor] = []
    offset = 0
    for group in _strided_groups(tensors):
        first, size = group[0], group[0].nbytes
        start = -(-offset // _STAGING_ALIGN) * _STAGING_ALIGN
        end = start + size * len(group)
        if end > out.numel():
            raise WireError(
                f"encode's staging buffer holds {out.numel()} bytes; this payload needs at "
                f"least {end} (staging_nbytes) [WIRE-5]"
            )
        landing = out[start:end].view(first.dtype).view(len(group), *first.shape)
        if len(group) == 1:
            source = first.detach().unsqueeze(0)
        else:
            step = (group[1].data_ptr() - first.data_ptr()) // first.element_size()
            source = first.detach().as_strided(
                (len(group), *first.shape), (step, *first.stride()), first.storage_offset()
            )
        copy_bits(landing, source)
        staged.extend(landing.unbind(0))
        offset = end
    return staged


def _strided_groups(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` cut into runs that are slices of one strided tensor (see
    :func:`_stage_all`), in order."""
    groups: list[list[torch.Tensor]] = []
    for tensor in tensors:
        group = groups[-1] if groups else None
        if group is not None and _continues(group, tensor):
            group.append(tensor)
        else:
            groups.append([tensor])
    return groups


def _continues(group: list[torch.Tensor], tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is the next slice of ``group``'s strided tensor."""
    last = group[-1]
    if (
        tensor.shape != last.shape
        or tensor.stride() != last.stride()
        or tensor.dtype != last.dtype
        or tensor.device != last.device
        or tensor.untyped_storage().data_ptr() != last.untyped_storage().data_ptr()
        or tensor.nbytes % _STAGING_ALIGN
    ):
        return False
    step = tensor.data_ptr() - last.data_ptr()
    if step <= 0 or step % tensor.element_size():
        return False
    return len(group) == 1 or step == last.data_ptr() - group[-2].data_ptr()


def _host_frame(tensor: torch.Tensor) -> memoryview | bytes:
    """The tensor's bytes as a frame: a view of its memory when it is contiguous on CPU."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")  # the one copy a device tensor needs [WIRE-5]
    tensor = tensor.contiguous()
    if tensor.numel() == 0:
        return b""
    buffer = (ctypes.c_ubyte * tensor.nbytes).from_address(tensor.data_ptr())
    buffer._kvspec_owner = tensor  # type: ignore[attr-defined]  # ctypes takes it: keeps the memory alive
    return memoryview(buffer).cast("B")


def encode(
    payload: Payload,
    *,
    limits: WireLimits = DEFAULT_LIMITS,
    checksum: bool | str = False,
    out: torch.Tensor | None = None,
) -> list[memoryview | bytes]:
    """The frames of one payload: a JSON header, then one frame per tensor [WIRE-1, WIRE-5].

    Refuses a payload that a decoder with the same ``limits`` would refuse [WIRE-2].
    ``checksum`` adds CRC-32s of the header and of every frame [WIRE-6] (``True`` or
    ``"crc32"``), or CRC-32Cs (``"crc32c"``, hardware-fast where the ``crc32c`` package is
    installed: :func:`kvspec.transport.checksums.fastest`) [WIRE-7]; computing them reads
    every byte once. ``out``, a contiguous CPU uint8 tensor of at least
    :func:`staging_nbytes` bytes, receives the device and non-contiguous tensors (their
    frames are views of it, valid until it is reused) instead of fresh memory.
    """
    if not isinstance(payload, Payload):
        raise WireError(f"encode takes a Payload, got {type(payload).__name__} [WIRE-1]")
    _require_little_endian()
    algorithm = _algorithm(checksum)
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.dtype != torch.uint8
        or out.device.type != "cpu"
        or out.dim() != 1
        or not out.is_contiguous()
    ):
        got = (
            f"a {out.dtype} tensor of shape {list(out.shape)} on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise WireError(
            f"encode's out must be a contiguous 1-d uint8 CPU tensor; got {got} [WIRE-5]"
        )
    present = payload.tensors()
    entries = [
        {
            "field": name,
            "layer": layer,
            "dtype": "float32" if name in SCALE_FIELDS else payload.dtype,
            "shape": list(tensor.shape),
        }
        for name, layer, tensor in present
    ]
    tensors = [tensor for _, _, tensor in present]
    if out is not None:
        at = [i for i, tensor in enumerate(tensors) if _staged(tensor)]
        for i, staged in zip(at, _stage_all([tensors[i] for i in at], out), strict=True):
            tensors[i] = staged
    frames = [_host_frame(tensor) for tensor in tensors]
    header = {
        "format": FORMAT,
        "version": VERSION,
        "request_id": payload.request_id,
        "block_ids": list(payload.block_ids),
        "metadata": payload.metadata(),
        "tensors": entries,
    }
    if algorithm is not None:
        crc = ALGORITHMS[algorithm]
        header[algorithm] = {
            "header": crc(_canonical(header), 0),
            "frames": [crc(frame, 0) for frame in frames],
        }
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("ascii")
    message: list[memoryview | bytes] = [head, *frames]
    total = sum(len(f) if isinstance(f, bytes) else f.nbytes for f in message)
    _check_limits(len(message), len(head), total, payload.num_layers, limits, side="encode")
    return message


def _algorithm(checksum: object) -> str | None:
    """The checksum key ``encode(checksum=...)`` asks for, or None [WIRE-6, WIRE-7]."""
    if checksum is False:
        return None
    if checksum is True:
        return "crc32"
    if isinstance(checksum, str) and checksum in _CHECKSUM_KEYS:
        return checksum
    raise WireError(
        f"encode's checksum must be False, True, 'crc32' or 'crc32c'; got {show(checksum)} "
        "[WIRE-6, WIRE-7]"
    )


# -- decode -----------------------------------------------------------------------------


def decode(
    frames: Sequence[Any],
    *,
    limits: WireLimits = DEFAULT_LIMITS,
    require_checksum: bool = False,
) -> Payload:
    """The payload a list of frames carries, as views into them; refuses anything else [WIRE-4].

    ``frames`` is a list or tuple of bytes-like objects (``bytes``, ``bytearray``,
    ``memoryview``, ``zmq.Frame``). A receiver that wants every message protected passes
    ``require_checksum``: a message without ``crc32`` is then refused too [WIRE-6].
    """
    _require_little_endian()
    if not isinstance(frames, list | tuple):
        raise WireError(f"decode takes a list of frames, got {type(frames).__name__} [WIRE-1]")
    if not 1 <= len(frames) <= limits.max_frames:
        raise WireError(
            f"a message has 1..{limits.max_frames} frames (limit max_frames), got "
            f"{len(frames)} [WIRE-2]"
        )
    views = [_as_bytes_view(i, frame) for i, frame in enumerate(frames)]
    total = sum(v.nbytes for v in views)
    _check_limits(len(views), views[0].nbytes, total, None, limits, side="decode")
    header = _parse_header(views[0])
    meta = _check_header(header, len(views) - 1, limits)
    present = [key for key in _CHECKSUM_KEYS if key in header]
    if len(present) > 1:
        raise WireError(
            "the header carries both crc32 and crc32c; a message carries at most one [WIRE-7]"
        )
    if present:
        _check_checksums(header, views, present[0])
    elif require_checksum:
        raise WireError(
            "the message carries no crc32 or crc32c, and this receiver requires one "
            "[WIRE-6, WIRE-7]"
        )
    num_layers = meta["num_layers"]
    fp8 = meta["dtype"] in FP8_DTYPES
    fields = TENSOR_FIELDS if fp8 else CACHE_FIELDS
    blocks: dict[str, list[torch.Tensor | None]] = {name: [None] * num_layers for name in fields}
    entries = header["tensors"]
    seen: set[tuple[str, int]] = set()
    with warnings.catch_warnings():
        # A read-only frame (bytes) gives a tensor torch calls writable; documented above.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for i, entry in enumerate(entries):
            name, layer, dtype, shape = _check_entry(i, entry, num_layers, fields, meta, limits)
            if (name, layer) in seen:
                raise WireError(f"tensors[{i}]: {name}[{layer}] is given twice [WIRE-3]")
            seen.add((name, layer))
            blocks[name][layer] = _tensor_view(i, views[i + 1], dtype, shape)
    try:
        return Payload.from_dict(
            {
                "request_id": header["request_id"],
                "layer_blocks": blocks,
                "block_ids": header["block_ids"],
                "metadata": meta,
            }
        )
    except WireError:
        raise
    except ValueError as error:
        raise WireError(f"the header describes an invalid payload: {error} [WIRE-4]") from None


def _require_little_endian() -> None:
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise WireError("frames are little-endian; this host is big-endian [WIRE-1]")


def _as_bytes_view(index: int, frame: object) -> memoryview:
    if isinstance(frame, str):
        raise WireError(f"frame {index} is a str; frames are bytes-like [WIRE-1]")
    try:
        view = memoryview(frame)  # type: ignore[arg-type]  # any object: refused below unless bytes-like
    except (TypeError, ValueError, BufferError):
        raise WireError(
            f"frame {index} is a {type(frame).__name__}, not bytes-like (bytes, bytearray, "
            "memoryview, zmq.Frame) [WIRE-1]"
        ) from None
    if not view.c_contiguous:
        raise WireError(f"frame {index} is not a contiguous buffer [WIRE-1]")
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except (TypeError, ValueError):
        raise WireError(
            f"frame {index} (format {show(view.format)}, {view.ndim} dims) cannot be read as "
            "bytes [WIRE-1]"
        ) from None


def _check_limits(
    frames: int, header: int, total: int, layers: int | None, limits: WireLimits, *, side: str
) -> None:
    problems = []
    if frames > limits.max_frames:
        problems.append(f"{frames} frames > max_frames {limits.max_frames}")
    if header > limits.max_header_bytes:
        problems.append(f"a {header}-byte header > max_header_bytes {limits.max_header_bytes}")
    if total > limits.max_total_bytes:
        problems.append(f"{total} bytes in all > max_total_bytes {limits.max_total_bytes}")
    if layers is not None and layers > limits.max_layers:
        problems.append(f"{layers} layers > max_layers {limits.max_layers}")
    if problems:
        raise WireError(f"{side}: over the limits: " + "; ".join(problems) + " [WIRE-2]")


def _reject_constant(name: str) -> Any:
    raise WireError(f"the header contains {name}; strict JSON has no NaN or Infinity [WIRE-4]")


def _reject_float(text: str) -> Any:
    raise WireError(
        f"the header contains the number {text[:40]}; every number is an integer [WIRE-4]"
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise WireError(f"the header repeats the key {key[:40]!r} [WIRE-4]")
        result[key] = value
    return result


def _parse_header(view: memoryview) -> dict[str, Any]:
    try:
        text = bytes(view).decode("utf-8")
    except UnicodeDecodeError as error:
        raise WireError(f"the header is not UTF-8: {error} [WIRE-1]") from None
    try:
        header = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_reject_float,
        )
    except WireError:
        raise
    except RecursionError:
        raise WireError("the header nests too deeply to be a payload header [WIRE-4]") from None
    except ValueError as error:  # JSONDecodeError, or an integer too long to convert
        raise WireError(f"the header is not JSON: {str(error)[:200]} [WIRE-1]") from None
    if not isinstance(header, dict):
        raise WireError(f"the header must be a JSON object, got {show(header)} [WIRE-1]")
    _check_shape_of(header)
    return header


MAX_DEPTH = 8
"""A payload header nests 4 deep (header, metadata, tp_head_slice or chunk, a value);
anything much deeper is not a header, and is refused before it is walked again."""


def _check_shape_of(header: dict[str, Any]) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and integers beyond int64, walking the
    parsed header without recursion [WIRE-4]."""
    stack: list[tuple[Any, int]] = [(header, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise WireError(f"the header nests deeper than {MAX_DEPTH} levels [WIRE-4]")
            if isinstance(node, list) and _flat_in_range(node):
                continue  # a long list of scalars (block ids) is checked in one C-level pass
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
        elif type(node) is int and not -INT64_MAX - 1 <= node <= INT64_MAX:
            raise WireError(f"the header holds {show(node)}, beyond int64 [WIRE-4]")


def _flat_in_range(values: list[Any]) -> bool:
    """Whether ``values`` holds only integers within int64 (or only strings): decided by
    ``min`` and ``max``, which refuse a mix of kinds and so reveal any nested container."""
    if not values:
        return True
    try:
        low, high = min(values), max(values)
    except TypeError:
        return False
    if isinstance(low, str):
        return True
    return type(low) in (int, bool) and low >= -INT64_MAX - 1 and high <= INT64_MAX


def _int(where: str, value: object, low: int, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise WireError(f"{where} must be an integer {bound}, got {show(value)} [WIRE-3]")
    return value


def _check_header(header: dict[str, Any], tensor_frames: int, limits: WireLimits) -> dict:
    """Format, version, keys, num_layers and the tensor count, before anything is built."""
    if header.get("format") != FORMAT:
        raise WireError(
            f"the header's format is {show(header.get('format'))}, expected {FORMAT!r} [WIRE-1]"
        )
    if header.get("version") != VERSION or type(header.get("version")) is not int:
        raise WireError(
            f"unsupported version {show(header.get('version'))}; this decoder reads version "
            f"{VERSION} [WIRE-1]"
        )
    keys = set(header) - set(_CHECKSUM_KEYS)
    if keys != _HEADER_KEYS:
        missing, unknown = sorted(_HEADER_KEYS - keys), sorted(keys - _HEADER_KEYS)
        raise WireError(
            f"the header has missing keys {missing} and unknown keys "
            f"{[k[:40] for k in unknown[:5]]}; expected {sorted(_HEADER_KEYS)} [WIRE-1]"
        )
    meta = header["metadata"]
    if not isinstance(meta, dict):
        raise WireError(f"metadata must be an object, got {show(meta)} [WIRE-1]")
    _int("metadata.num_layers", meta.get("num_layers"), 1, limits.max_layers)
    if not isinstance(meta.get("dtype"), str):
        raise WireError(f"metadata.dtype must be a string, got {show(meta.get('dtype'))} [WIRE-3]")
    tensors = header["tensors"]
    if not isinstance(tensors, list):
        raise WireError(f"tensors must be a list, got {show(tensors)} [WIRE-1]")
    if len(tensors) != tensor_frames:
        raise WireError(
            f"the header lists {len(tensors)} tensors but {tensor_frames} tensor frames follow "
            "it; there is exactly one frame per tensor [WIRE-3]"
        )
    return meta


def _canonical(header: dict[str, Any]) -> bytes:
    """The header without its checksums, as canonical JSON: what its CRC covers [WIRE-6]."""
    plain = {k: v for k, v in header.items() if k not in _CHECKSUM_KEYS}
    return json.dumps(plain, separators=(",", ":"), sort_keys=True, ensure_ascii=True).encode()


def _check_checksums(header: dict[str, Any], views: list[memoryview], algorithm: str) -> None:
    """Refuse a message whose header or any frame differs from its CRC-32 or CRC-32C
    (``algorithm``, the header key that carries them) [WIRE-6, WIRE-7]."""
    clause = "WIRE-6" if algorithm == "crc32" else "WIRE-7"
    name = "CRC-32" if algorithm == "crc32" else "CRC-32C"
    crc = ALGORITHMS[algorithm]
    sums = header[algorithm]
    frames = sums.get("frames") if isinstance(sums, dict) else None
    if (
        not isinstance(sums, dict)
        or set(sums) != {"header", "frames"}
        or not isinstance(frames, list)
        or len(frames) != len(views) - 1
    ):
        raise WireError(
            f"{algorithm} must be {{header, frames}} with one CRC per tensor frame "
            f"({len(views) - 1}), got {show(sums)} [{clause}]"
        )
    _int(f"{algorithm}.header", sums["header"], 0, 2**32 - 1)
    if crc(_canonical(header), 0) != sums["header"]:
        raise WireError(
            f"the header does not match its {name}: it was damaged on the way [{clause}]"
        )
    for i, (view, expected) in enumerate(zip(views[1:], frames, strict=True)):
        _int(f"{algorithm}.frames[{i}]", expected, 0, 2**32 - 1)
        if crc(view, 0) != expected:
            raise WireError(
                f"frame {i + 1} does not match its {name}: it was damaged on the way [{clause}]"
            )


def _check_entry(
    index: int,
    entry: object,
    num_layers: int,
    fields: tuple[str, ...],
    meta: dict[str, Any],
    limits: WireLimits,
) -> tuple[str, int, str, tuple[int, ...]]:
    where = f"tensors[{index}]"
    if not isinstance(entry, dict) or set(entry) != _TENSOR_KEYS:
        shown = sorted(k[:40] for k in entry) if isinstance(entry, dict) else show(entry)
        raise WireError(
            f"{where} must be an object with keys {sorted(_TENSOR_KEYS)}, got {shown} [WIRE-3]"
        )
    name = entry["field"]
    if name not in TENSOR_FIELDS:  # a tuple of str: safe for any JSON value
        raise WireError(
            f"{where}.field must be one of {', '.join(TENSOR_FIELDS)}, got {show(name)} [WIRE-3]"
        )
    if name not in fields:
        raise WireError(
            f"{where} is a {name} in a {show(meta['dtype'])} payload; only fp8 payloads carry "
            "scales [DTYPE-3]"
        )
    layer = _int(f"{where}.layer", entry["layer"], 0, num_layers - 1)
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(
            f"{where}.dtype must be one of {', '.join(DTYPES)}, got {show(dtype)} [WIRE-3, DTYPE-1]"
        )
    shape = entry["shape"]
    rank = 0 if name in SCALE_FIELDS else 3
    if not isinstance(shape, list) or len(shape) != rank:
        raise WireError(
            f"{where}.shape of {name} must be a list of {rank} integers, got {show(shape)} [WIRE-3]"
        )
    dims = tuple(_int(f"{where}.shape[{i}]", d, 0) for i, d in enumerate(shape))
    # Bound every dimension through the non-zero ones, so that even an empty tensor's
    # strides stay small [WIRE-2].
    itemsize = DTYPES[dtype].itemsize
    if math.prod(d for d in dims if d) * itemsize > limits.max_total_bytes:
        raise WireError(
            f"{where}.shape {list(dims)} of {dtype} exceeds max_total_bytes "
            f"{limits.max_total_bytes} [WIRE-2]"
        )
    return name, layer, dtype, dims


def _tensor_view(index: int, frame: memoryview, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A view of ``frame`` as a tensor; the length was not yet checked [WIRE-3]."""
    torch_dtype = DTYPES[dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if frame.nbytes != expected:
        raise WireError(
            f"frame {index + 1} has {frame.nbytes} bytes but tensors[{index}] declares "
            f"{dtype} {list(shape)} = {expected} bytes [WIRE-3]"
        )
    if expected == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(frame, dtype=torch.uint8).view(torch_dtype).view(shape)
