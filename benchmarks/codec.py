"""Wire codec throughput: encode + decode of one payload versus one memory copy of its bytes.

- zero copy: encode frames the contiguous CPU tensors as views and decode views the
  frames, so only the header is built and parsed [WIRE-5];
- through one copy: the same plus one copy of every frame into preallocated receive
  buffers, what a copying transport adds, against those copies alone: the ratio is what
  the codec costs on top of the transport;
- strided source: sender-side slicing leaves non-contiguous head slices, which encode
  copies once into the sender's reused staging buffer (``encode(out=...)``);
- checksums: CRC-32C (hardware, the ``crc32c`` package) against zlib's CRC-32, in the
  codec and alone [WIRE-6, WIRE-7];
- the largest legal header: decoding a header at the 1 MiB limit (all block ids)
  against ``json.loads`` of the same bytes, so a hostile maximal header is seen to cost
  what parsing it costs (it was a timed unit test, ``< 0.5 s``; speed is measured here);
- from CUDA (when present): encode copies device memory to host, against a plain
  device-to-host copy of the same bytes.
"""

from __future__ import annotations

import json

import torch

from benchmarks.figure import Figure, compare, memcpy
from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport.checksums import FAST_CRC32C, crc32, crc32c, crc32c_hardware
from kvspec.transport.payload import Payload, payload_from_shipment
from kvspec.transport.wire import decode, encode, staging_nbytes

MODEL = ModelShape(num_layers=8, num_kv_heads=8, head_dim=128)
"""32 KiB of K and V per token in bfloat16: 2048 tokens are 64 MiB."""


def _payloads(seq_len: int, target_tp: int, device: str = "cpu") -> list[Payload]:
    source, target = StageLayout(1), StageLayout(target_tp)
    plan = plan_transfer(source, target, MODEL)
    full = random_request_kv(MODEL, seq_len, device=device)
    (local,) = shard(full, source, MODEL)
    return [payload_from_shipment(plan, s, "bench") for s in send(plan, 0, local)]


def _nbytes(payloads: list[Payload]) -> int:
    return sum(t.nbytes for p in payloads for _, _, t in p.tensors())


def _checksums(whole: Payload, nbytes: int, mib: str) -> list[Figure]:
    """Encode+decode with CRC-32Cs [WIRE-7] against the same with zlib's CRC-32s [WIRE-6]
    (ratio > 1: CRC-32C is faster), and each checksum alone over the same bytes: what
    chose the sim's algorithm (:func:`kvspec.transport.checksums.fastest`)."""
    if not FAST_CRC32C:
        return []  # a pure-Python CRC-32C is for reading a message, not for bulk data
    flat = memoryview(torch.ones(nbytes, dtype=torch.uint8).numpy())
    how = "hardware" if crc32c_hardware() else "compiled software"
    return [
        compare(
            f"codec encode+decode with CRC-32C vs CRC-32 ({mib})",
            nbytes,
            lambda: decode(encode(whole, checksum="crc32c")),
            lambda: decode(encode(whole, checksum="crc32")),
            "the same with zlib CRC-32",
            note=f"CRC-32C in {how} (crc32c package); both read every byte twice",
            reference=True,
        ),
        compare(
            f"CRC-32C alone ({mib})",
            nbytes,
            lambda: crc32c(flat, 0),
            lambda: crc32(flat, 0),
            "zlib CRC-32",
            note=f"CRC-32C in {how}; the ratio is its speed-up over zlib",
            reference=True,
        ),
    ]


LARGEST_HEADER_BLOCK_IDS = 140_000
"""Block ids that bring a small payload's header just under the 1 MiB header limit."""


def largest_legal_header() -> list[bytes]:
    """A small payload's frames whose header lists :data:`LARGEST_HEADER_BLOCK_IDS` block
    ids: just under the decoder's 1 MiB header limit [WIRE-3]."""
    (small,) = _payloads(16, 1)
    frames = [bytes(f) for f in encode(small)]
    header = json.loads(frames[0])
    header["block_ids"] = list(range(LARGEST_HEADER_BLOCK_IDS))
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) >= 1 << 20:
        raise AssertionError(f"the header has {len(head)} bytes, over the 1 MiB limit")
    return [head, *frames[1:]]


def _largest_header() -> Figure:
    """Decoding the largest legal header against ``json.loads`` of the same bytes: the
    ratio is what the decoder's checks add to parsing (1.0 = parsing alone)."""
    frames = largest_legal_header()
    head = frames[0]
    return compare(
        f"codec decode, largest legal header ({len(head) >> 10} KiB)",
        len(head),
        lambda: decode(frames),
        lambda: json.loads(head),
        "json.loads",
        note=f"{LARGEST_HEADER_BLOCK_IDS} block ids; the decoder parses and checks them all",
        reference=True,
    )


def run(quick: bool) -> list[Figure]:
    seq_len = 256 if quick else 2048
    figures = []

    (whole,) = _payloads(seq_len, 1)
    nbytes = _nbytes([whole])
    mib = f"{nbytes >> 20} MiB"
    copy = memcpy(nbytes)

    def zero_copy() -> None:
        decode(encode(whole))

    figures.append(
        compare(
            f"codec encode+decode, zero copy ({mib})",
            nbytes,
            zero_copy,
            copy,
            "memcpy",
            note="frames are views; only the header is built and parsed",
        )
    )

    frames = encode(whole)
    buffers = [bytearray(memoryview(f).nbytes) for f in frames]

    def copy_frames(sent: list) -> None:
        for buffer, frame in zip(buffers, sent, strict=True):
            memoryview(buffer)[:] = frame

    def through_one_copy() -> None:
        copy_frames(encode(whole))
        decode(buffers)

    figures.append(
        compare(
            f"codec encode+copy+decode ({mib})",
            nbytes,
            through_one_copy,
            lambda: copy_frames(frames),
            "frame copies",
            note="a transport's one copy of every frame, with and without the codec around it",
        )
    )

    halves = _payloads(seq_len, 2)  # sender-side slices of 4 of 8 heads: strided views
    strided = _nbytes(halves)
    staging = [torch.empty(staging_nbytes(p), dtype=torch.uint8) for p in halves]
    figures.append(
        compare(
            f"codec encode+decode, strided source ({strided >> 20} MiB)",
            strided,
            lambda: [decode(encode(p, out=s)) for p, s in zip(halves, staging, strict=True)],
            memcpy(strided),
            "memcpy",
            note="encode copies 1 KiB head-slice runs into a reused staging buffer once",
        )
    )

    figures += _checksums(whole, nbytes, mib)
    figures.append(_largest_header())

    if torch.cuda.is_available():
        (on_gpu,) = _payloads(seq_len, 1, device="cuda")
        flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def device_to_host() -> None:
            flat.to("cpu")

        figures.append(
            compare(
                f"codec encode+decode from cuda ({mib})",
                nbytes,
                lambda: decode(encode(on_gpu)),
                device_to_host,
                "cuda->cpu copy",
                note="encode copies device memory to host once",
            )
        )
    return figures
