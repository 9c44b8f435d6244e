"""WIRE-4 by fuzzing: for any frames, decode returns a valid payload or raises WireError.

Never another exception, never a hang, never an allocation beyond the limits: every
call is timed and traced (tracemalloc sees Python allocations; tensor memory is not
allocated at all, which the view check below proves for every decoded payload).
"""

import json
import time
import tracemalloc

import torch
from hypothesis import HealthCheck, example, given, settings

from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.testing.strategies import mutated_frames, random_frames
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import Payload, payload_equal, payload_from_shipment
from kvspec.transport.wire import WireError, WireLimits, decode, encode

LIMITS = WireLimits(max_header_bytes=4096, max_frames=16, max_total_bytes=1 << 16, max_layers=8)
ALLOCATION_BUDGET = 1 << 20
"""Python bytes a decode may allocate at most: a few hundred per header byte, and far below
what any declared size in a hostile header (up to 2**40 elements) would need."""
SECONDS = 2.0

FUZZ = settings(
    max_examples=4 * settings.default.max_examples,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _message(model: ModelShape, source: StageLayout, target: StageLayout, seq_len: int) -> list:
    plan = plan_transfer(source, target, model)
    full = random_request_kv(model, seq_len, seed=seq_len)
    shipment = send(plan, 0, shard(full, source, model)[0], slicing="receiver")[0]
    payload = payload_from_shipment(plan, shipment, "req_1", block_ids=[3, 1])
    return [bytes(frame) for frame in encode(payload, limits=LIMITS)]


MESSAGES = [
    _message(ModelShape(2, 4, 2), StageLayout(2), StageLayout(4), 3),
    _message(ModelShape(3, 2, 2, dtype="float8_e4m3fn"), StageLayout(1, 3), StageLayout(2), 2),
    _message(ModelShape.mla(2, 3, dtype="float8_e5m2"), StageLayout(2), StageLayout(1), 1),
    _message(ModelShape(1, 1, 1, dtype="float32"), StageLayout(1), StageLayout(1), 0),
]


def _address_range(frame: bytes) -> range:
    if not frame:
        return range(0)
    start = torch.frombuffer(frame, dtype=torch.uint8).data_ptr()
    return range(start, start + len(frame))


def decode_outcome(frames: list) -> Payload | None:
    """Decode under a clock and tracemalloc; a valid payload, or None after a WireError."""
    tracemalloc.start()
    started = time.process_time()  # CPU time: a busy machine's other processes never count
    try:
        result: Payload | None = decode(frames, limits=LIMITS)
    except WireError:
        result = None
    finally:
        elapsed = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < SECONDS, f"decode took {elapsed:.2f} CPU s"
    assert peak < ALLOCATION_BUDGET, f"decode allocated {peak} bytes"
    if result is not None:
        assert isinstance(result, Payload)
        spans = [_address_range(f) for f in frames if isinstance(f, bytes)]
        for _, _, tensor in result.tensors():
            if tensor.numel():
                assert any(tensor.data_ptr() in span for span in spans), "decode copied a tensor"
        assert payload_equal(decode(encode(result, limits=LIMITS), limits=LIMITS), result)
    return result


@FUZZ
@given(random_frames)
@example([b"[" * 3000])
@example([b"[" * 1000 + b"]" * 1000])
@example([b'{"format":"kvspec.payload","version":1,' + b'"x":' * 500 + b"1" + b"}" * 500])
def test_random_frames(frames: list) -> None:
    decode_outcome(frames)


@FUZZ
@given(mutated_frames(messages=MESSAGES))
def test_mutated_messages(frames: list) -> None:
    decode_outcome(frames)


def _edited(message: list, **changes) -> list:
    header = json.loads(message[0])
    for path, value in changes.items():
        node = header
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return [json.dumps(header).encode(), *message[1:]]


@example(_edited(MESSAGES[0], tensors__0__shape=[2**40, 2**40, 2**40]))
@example(_edited(MESSAGES[0], tensors__0__shape=[0, 2**62, 2**62]))
@example(_edited(MESSAGES[0], metadata__num_layers=10**12))
@example(_edited(MESSAGES[0], block_ids=list(range(900))))
@example(_edited(MESSAGES[1], tensors__1__dtype="float8_e4m3fnuz"))
@example(_edited(MESSAGES[1], metadata__tp_head_slice={"target_rank": [[[]]]}))
# HeadSlice.from_dict once let a marker without offset_in_shard through to a TypeError.
@example(_edited(MESSAGES[0], metadata__tp_head_slice={"target_rank": 0, "from_tp": 2, "to_tp": 4}))
@given(mutated_frames(messages=MESSAGES))
def test_hostile_headers(frames: list) -> None:
    """The pinned examples: huge declared sizes allocate nothing and fail fast."""
    decode_outcome(frames)


def test_the_unmutated_messages_decode() -> None:
    for message in MESSAGES:
        assert decode_outcome(message) is not None
