"""WIRE-1..5: the frames of a payload, zero copy, limits, and every malformed input refused."""

import ast
import json
import time

import pytest
import torch
import zmq
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import Payload, payload_equal, payload_from_shipment
from kvspec.transport.wire import FORMAT, VERSION, WireError, WireLimits, decode, encode
from tests.paths import ROOT

FP8_MLA = TransferCase(StageLayout(2), StageLayout(4), ModelShape.mla(3, 4, dtype="float8_e5m2"))
GQA = TransferCase(StageLayout(4), StageLayout(2), ModelShape(3, 4, 8))
SINGLE = TransferCase(StageLayout(1), StageLayout(1), ModelShape(3, 4, 8))
"""One rank each side: the shard is the whole (contiguous) KV, as a rank's own cache is."""


def payloads(case: TransferCase, *, seq_len=3, slicing="sender", device="cpu", seed=0):
    plan = case.plan()
    full = random_request_kv(case.model, seq_len, seed=seed, device=device)
    return [
        payload_from_shipment(plan, shipment, "req_1", block_ids=range(seq_len))
        for src, local in enumerate(shard(full, case.source, case.model))
        for shipment in send(plan, src, local, slicing=slicing)
    ]


def address(frame) -> int:
    """Where a bytes-like frame's memory starts (torch.frombuffer copies nothing)."""
    return torch.frombuffer(frame, dtype=torch.uint8).data_ptr()


def header_of(frames) -> dict:
    return json.loads(bytes(frames[0]))


@given(
    case=transfer_cases(max_layers=4),
    seq_len=st.integers(0, 4),
    slicing=st.sampled_from(["sender", "receiver"]),
)
@example(case=FP8_MLA, seq_len=2, slicing="receiver")
@example(case=GQA, seq_len=0, slicing="sender")
def test_decode_inverts_encode(device: str, case: TransferCase, seq_len: int, slicing: str) -> None:
    """WIRE-5: decode(encode(p)) == p bit for bit, from any device; frames are host memory."""
    for payload in payloads(case, seq_len=seq_len, slicing=slicing, device=device):
        frames = encode(payload)
        header = header_of(frames)
        assert (header["format"], header["version"]) == (FORMAT, VERSION)
        assert len(frames) == 1 + len(payload.tensors()) == 1 + len(header["tensors"])
        back = decode(frames)
        assert back.device.type == "cpu"
        assert payload_equal(back, payload.to("cpu"))


def test_encode_frames_are_views_of_the_tensors() -> None:
    """WIRE-5: contiguous CPU tensors go out without a copy."""
    payload = payloads(SINGLE)[0]
    frames = encode(payload)
    for frame, (_, _, tensor) in zip(frames[1:], payload.tensors(), strict=True):
        assert tensor.is_contiguous()
        assert address(frame) == tensor.data_ptr()
    tensor = payload.tensors()[0][2]
    tensor.view(torch.int16)[0, 0, 0] = 0x1234
    assert bytes(frames[1][:2]) == (0x1234).to_bytes(2, "little")


def test_non_contiguous_tensors_are_copied_once() -> None:
    """WIRE-5: receiver-side slicing leaves views with gaps; those are copied, correctly."""
    case = TransferCase(StageLayout(2), StageLayout(4), ModelShape(2, 4, 2))
    payload = payloads(case, slicing="sender")[0]  # a narrowed head slice
    tensor = payload.key_cache[0]
    assert not tensor.is_contiguous()
    frames = encode(payload)
    assert address(frames[1]) != tensor.data_ptr()
    assert payload_equal(decode(frames), payload)


def test_decoded_tensors_are_views_of_the_frames() -> None:
    """WIRE-2, WIRE-5: decoding makes views; writes to a writable frame show through."""
    payload = payloads(GQA)[0]
    frames = [
        frames_i if i == 0 else bytearray(frames_i) for i, frames_i in enumerate(encode(payload))
    ]
    back = decode(frames)
    for frame, (_, _, tensor) in zip(frames[1:], back.tensors(), strict=True):
        assert tensor.data_ptr() == address(frame)
    frames[1][0] ^= 0xFF
    assert back.tensors()[0][2].view(torch.uint8).flatten()[0].item() == frames[1][0]


def test_zmq_frames_and_a_real_socket() -> None:
    """WIRE-1: frames go through send_multipart(copy=False) and decode from zmq.Frame."""
    payload = payloads(FP8_MLA)[0]
    assert payload_equal(decode([zmq.Frame(bytes(f)) for f in encode(payload)]), payload)
    context = zmq.Context.instance()
    with context.socket(zmq.PAIR) as a, context.socket(zmq.PAIR) as b:
        a.bind("inproc://kvspec-wire-test")
        b.connect("inproc://kvspec-wire-test")
        a.send_multipart(encode(payload), copy=False)
        assert b.poll(5000), "the message did not arrive within 5 s"
        received = b.recv_multipart(copy=False)
    assert payload_equal(decode(received), payload)
    assert payload_equal(decode([f.buffer for f in received]), payload)


def test_limits_are_enforced_on_both_sides() -> None:
    """WIRE-2: an encoder never produces what a decoder with the same limits refuses."""
    payload = payloads(GQA)[0]
    frames = encode(payload)
    n, head = len(frames), len(frames[0])
    total = sum(memoryview(f).nbytes for f in frames)
    for limits, refused_by_decode, refused_by_encode in [
        (
            WireLimits(max_header_bytes=head - 1),
            rf"a {head}-byte header > max_header_bytes",
            rf"a {head}-byte header > max_header_bytes",
        ),
        (
            WireLimits(max_frames=n - 1),
            rf"a message has 1\.\.{n - 1} frames \(limit max_frames\), got {n}",
            rf"{n} frames > max_frames {n - 1}",
        ),
        (
            WireLimits(max_total_bytes=total - 1),
            rf"{total} bytes in all > max_total_bytes",
            rf"{total} bytes in all > max_total_bytes",
        ),
        (
            WireLimits(max_layers=2),
            r"metadata.num_layers must be an integer 1\.\.2, got 3",
            r"3 layers > max_layers 2",
        ),
    ]:
        with pytest.raises(WireError, match=refused_by_decode):
            decode(frames, limits=limits)
        with pytest.raises(WireError, match=rf"encode: over the limits: {refused_by_encode}"):
            encode(payload, limits=limits)


def _with_header(frames, **changes) -> list:
    header = header_of(frames)
    for path, value in changes.items():
        node = header
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return [json.dumps(header).encode(), *frames[1:]]


def _base() -> list:
    return [bytes(f) for f in encode(payloads(GQA)[0])]


BIG = 2**40


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: b"".join(_base()), r"decode takes a list of frames, got bytes"),
        (lambda: [], r"a message has 1\.\.4097 frames"),
        (lambda: ["{}"], r"frame 0 is a str"),
        (lambda: [b"{}", 7], r"frame 1 is a int, not bytes-like"),
        (lambda: [memoryview(bytes(8))[::2]], r"frame 0 is not a contiguous buffer"),
        (lambda: [b"\xff{}"], r"the header is not UTF-8"),
        (lambda: [b"{"], r"the header is not JSON"),
        (lambda: [b"[" * 100_000], r"nests too deeply|not JSON"),
        (lambda: [b'{"a": ' + b"9" * 5000 + b"}"], r"the header is not JSON"),
        (lambda: [b'{"a": NaN}'], r"contains NaN"),
        (lambda: [b'{"a": 1.5}'], r"contains the number 1\.5"),
        (lambda: [b'{"a": 1, "a": 2}'], r"repeats the key 'a'"),
        (lambda: [b"[]"], r"must be a JSON object, got a list of 0 item"),
        (lambda: _with_header(_base(), format="pickle"), r"format is 'pickle', expected"),
        (
            lambda: _with_header(_base(), version=2),
            r"unsupported version 2; this decoder reads version 1",
        ),
        (lambda: _with_header(_base(), version=True), r"unsupported version True"),
        (lambda: _with_header(_base(), extra=1), r"unknown keys \['extra'\]"),
        (
            lambda: _with_header(_base(), tensors__0__dtype="float64"),
            r"dtype must be one of .*got 'float64'",
        ),
        (
            lambda: _with_header(_base(), tensors__0__dtype="__import__('os')"),
            r"dtype must be one of .*got \"__import__\('os'\)\"",
        ),
        (lambda: _with_header(_base(), tensors__0__dtype=["bfloat16"]), r"got a list of 1 item"),
        (
            lambda: _with_header(_base(), tensors__0__shape=[3, -1, 8]),
            r"shape\[1\] must be an integer >= 0, got -1",
        ),
        (
            lambda: _with_header(_base(), tensors__0__shape=[BIG, BIG, BIG]),
            r"shape \[1099511627776, .*\] of bfloat16 exceeds max_total_bytes",
        ),
        (
            lambda: _with_header(_base(), tensors__0__shape=[0, BIG, BIG]),
            r"exceeds max_total_bytes",
        ),
        (
            lambda: _with_header(_base(), tensors__0__shape=[3, 2, 9]),
            r"frame 1 has 48 bytes but tensors\[0\] declares bfloat16 \[3, 2, 9\] = 108 bytes",
        ),
        (lambda: _with_header(_base(), tensors__0__shape=[3, 2]), r"must be a list of 3 integers"),
        (
            lambda: _with_header(_base(), tensors__0__layer=3),
            r"layer must be an integer 0\.\.2, got 3",
        ),
        (
            lambda: _with_header(_base(), tensors__1__layer=0, tensors__1__field="key_cache"),
            r"key_cache\[0\] is given twice",
        ),
        (
            lambda: _with_header(_base(), tensors__0__field="key_scale"),
            r"only fp8 payloads carry scales",
        ),
        (lambda: _with_header(_base(), tensors__0__field="weights"), r"field must be one of"),
        (
            lambda: _with_header(_base(), metadata__num_layers=10**9),
            r"num_layers must be an integer 1\.\.1024",
        ),
        (
            lambda: _with_header(_base(), metadata__dtype={"a": 1}),
            r"metadata.dtype must be a string",
        ),
        (
            lambda: _with_header(_base(), metadata__seq_len=4),
            r"invalid payload: .*expected \[seq_len=4",
        ),
        (
            lambda: _with_header(_base(), request_id=["r"]),
            r"invalid payload: request_id must be a non-empty",
        ),
        (
            lambda: _with_header(_base(), block_ids="1,2"),
            r"invalid payload: block_ids must be a list",
        ),
        (lambda: _base()[:-1], r"lists 6 tensors but 5 tensor frames follow"),
        (lambda: [*_base(), b""], r"lists 6 tensors but 7 tensor frames follow"),
        (
            lambda: _swap(_base()),
            r"frame 2 has 48 bytes but tensors\[1\] declares bfloat16 \[3, 1, 4\] = 24 bytes",
        ),
    ],
)
def test_malformed_messages_raise_the_codec_error(make, match: str) -> None:
    """WIRE-1..4: each malformed input raises WireError naming the problem, quickly."""
    frames = make()
    started = time.process_time()  # CPU time: a guard against blow-ups, not a speed
    with pytest.raises(WireError, match=match):
        decode(frames)
    assert time.process_time() - started < 2.0


def _swap(frames: list) -> list:
    """Layer 0's V declared at half its head_dim: its frame's length disagrees."""
    header = header_of(frames)
    header["tensors"][1]["shape"] = [3, 1, 4]
    return [json.dumps(header).encode(), *frames[1:]]


UNSAFE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "joblib",
}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def test_nothing_on_the_path_executes_data() -> None:
    """WIRE-4: no pickle, eval, exec, torch.load or dynamic torch lookups in the spec."""
    for path in sorted((ROOT / "kvspec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
                assert not names & UNSAFE_MODULES, where
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in UNSAFE_MODULES, where
            elif isinstance(node, ast.Call):
                func = node.func
                assert not (isinstance(func, ast.Name) and func.id in UNSAFE_CALLS), where
                torch_load = (
                    isinstance(func, ast.Attribute)
                    and func.attr == "load"
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "torch"
                )
                assert not torch_load, where
                if isinstance(func, ast.Name) and func.id == "getattr" and node.args:
                    first = node.args[0]
                    assert not (isinstance(first, ast.Name) and first.id == "torch"), where


def test_payloads_decoded_are_valid() -> None:
    """WIRE-4: what decode returns passes the payload's own validation."""
    back = decode(_base())
    assert isinstance(back, Payload)
    assert Payload.from_dict(back.to_dict()) is not back


@given(data=st.data())
def test_with_checksums_any_flipped_bit_is_refused(data: st.DataObject) -> None:
    """WIRE-6: a CRC-32 of the header and of every frame catches every single-bit flip."""
    frames = [bytes(f) for f in encode(decode(_base()), checksum=True)]
    assert payload_equal(decode(frames), decode(_base()))
    which = data.draw(st.integers(0, len(frames) - 1))
    if not frames[which]:
        return
    at = data.draw(st.integers(0, len(frames[which]) - 1))
    bit = data.draw(st.integers(0, 7))
    damaged = bytearray(frames[which])
    damaged[at] ^= 1 << bit
    frames[which] = bytes(damaged)
    with pytest.raises(WireError):
        decode(frames)


def test_checksums_are_optional_and_checked_only_when_present() -> None:
    plain = [bytes(f) for f in encode(decode(_base()))]
    summed = [bytes(f) for f in encode(decode(_base()), checksum=True)]
    assert "crc32" not in json.loads(plain[0]) and "crc32" in json.loads(summed[0])
    header = json.loads(summed[0])
    header["crc32"]["frames"] = header["crc32"]["frames"][:-1]
    with pytest.raises(WireError, match=r"one CRC per tensor frame.*\[WIRE-6\]"):
        decode([json.dumps(header).encode(), *summed[1:]])


@given(data=st.data())
def test_with_crc32c_any_flipped_bit_is_refused(data: st.DataObject) -> None:
    """WIRE-7: CRC-32Cs of the header and of every frame catch every single-bit flip."""
    frames = [bytes(f) for f in encode(decode(_base()), checksum="crc32c")]
    header = json.loads(frames[0])
    assert "crc32c" in header and "crc32" not in header
    assert payload_equal(decode(frames, require_checksum=True), decode(_base()))
    which = data.draw(st.integers(0, len(frames) - 1))
    if not frames[which]:
        return
    at = data.draw(st.integers(0, len(frames[which]) - 1))
    damaged = bytearray(frames[which])
    damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    frames[which] = bytes(damaged)
    with pytest.raises(WireError):
        decode(frames)


def test_a_header_carries_one_checksum_key_and_encode_names_the_algorithm() -> None:
    """WIRE-7: both crc32 and crc32c in one header is refused, even when both are right;
    encode takes False, True (CRC-32), 'crc32' or 'crc32c' and names anything else."""
    summed = [bytes(f) for f in encode(decode(_base()), checksum="crc32c")]
    header = json.loads(summed[0])
    header["crc32"] = json.loads(bytes(encode(decode(_base()), checksum=True)[0]))["crc32"]
    with pytest.raises(WireError, match=r"both crc32 and crc32c.*\[WIRE-7\]"):
        decode([json.dumps(header).encode(), *summed[1:]])
    assert "crc32" in json.loads(bytes(encode(decode(_base()), checksum="crc32")[0]))
    with pytest.raises(WireError, match=r"checksum must be .*'crc32c'; got 'xxh3'"):
        encode(decode(_base()), checksum="xxh3")
    plain = [bytes(f) for f in encode(decode(_base()))]
    with pytest.raises(WireError, match=r"no crc32 or crc32c.*requires one"):
        decode(plain, require_checksum=True)
