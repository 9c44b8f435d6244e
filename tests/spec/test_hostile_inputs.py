"""Refusal is the only failure mode of a decoder [WIRE-4, PAYLOAD-1, CHUNK-1, SLICE-3, KEY-3].

Every entry point that reads untrusted data — the wire decoder, ``Payload.from_dict``,
``Chunk.from_dict``, ``HeadSlice.from_dict``, key parsing and building, golden-vector
loading and the sim's own messages — either returns a valid object or raises its
documented error type, for any input: never another exception, never a hang, never an
allocation out of proportion. A seeded mutation fuzzer (deterministic; set
``KVSPEC_FUZZ_SEED`` to explore) feeds them more than 10,000 hostile inputs per run,
each timed and traced, and the cases that once broke them are pinned.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.vectors import GOLDEN_DIR, VectorsError, load_vectors
from kvspec.naming.keys import legacy_key, parse_key, rank_aware_key
from kvspec.tensors.kv import random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.tensors.slicing import HeadSlice
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport.chunks import reassemble
from kvspec.transport.payload import Chunk, Payload, payload_from_shipment
from kvspec.transport.wire import WireError, decode, encode
from sim.net import messages

SEED = int(os.environ.get("KVSPEC_FUZZ_SEED", "0"))
SECONDS = 1.0
"""CPU seconds one hostile input may cost this process (``time.process_time``): a guard
against blow-ups (a quadratic parse, a range built from an attacker's integer), not a
speed measurement, so the time other processes take from a busy machine never counts."""
ALLOCATION_BUDGET = 16 << 20
TRACE_EVERY = 10
DEEP = 1000
WIDE = 64
"""Containers wider than this are hostile values themselves: edits never reach inside."""

HUGE = 10**4000
HOSTILE: list[Any] = [
    HUGE,
    -HUGE,
    2**63,
    2**64,
    -1,
    -(2**63) - 1,
    0,
    1.5,
    1e308,
    float("nan"),
    float("inf"),
    -0.0,
    True,
    False,
    None,
    "",
    "0_5",
    "omni_0_to_1_kv_cache_x",
    "\x00\n\ud800",
    "x" * (1 << 20),
    [],
    {},
    list(range(20_000)),
    {"k": "v"},
    {str(i): i for i in range(1000)},
]


def _deep_list(depth: int = DEEP) -> Any:
    node: Any = []
    for _ in range(depth):
        node = [node]
    return node


def _deep_dict(depth: int = DEEP) -> Any:
    node: Any = {}
    for _ in range(depth):
        node = {"a": node}
    return node


class Deep:
    """A value nested ``depth`` deep, kept symbolic until an input is built: as JSON text
    (which ``json.dumps`` could not write) or as Python lists and dicts."""

    def __init__(self, kind: str, depth: int) -> None:
        self.kind, self.depth = kind, depth

    def python(self) -> Any:
        return _deep_list(self.depth) if self.kind == "list" else _deep_dict(self.depth)

    def text(self) -> str:
        if self.kind == "list":
            return "[" * self.depth + "]" * self.depth
        return '{"a":' * self.depth + "{}" + "}" * self.depth


def as_python(tree: Any) -> Any:
    """``tree`` with its :class:`Deep` markers made real (large containers hold none)."""
    if isinstance(tree, Deep):
        return tree.python()
    if isinstance(tree, dict) and len(tree) <= WIDE:
        return {k: as_python(v) for k, v in tree.items()}
    if isinstance(tree, list) and len(tree) <= WIDE:
        return [as_python(v) for v in tree]
    return tree


def as_json(tree: Any) -> bytes:
    """JSON text of ``tree`` (NaN and Infinity written as Python's json writes them)."""
    deep: list[Deep] = []

    def mark(value: Any) -> str:
        if not isinstance(value, Deep):
            raise TypeError(type(value).__name__)
        deep.append(value)
        return f"@@deep{len(deep) - 1}@@"

    text = json.dumps(tree, default=mark)
    for i, value in enumerate(deep):
        text = text.replace(f'"@@deep{i}@@"', value.text())
    return text.encode()


def _hostile(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.08:
        return Deep("list", rng.choice((50, DEEP)))
    if roll < 0.12:
        return Deep("dict", rng.choice((50, DEEP)))
    value = rng.choice(HOSTILE)
    return copy.copy(value) if isinstance(value, list | dict) else value  # never edit the pool


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in a JSON-like tree (wide containers are leaves)."""
    out = [prefix]
    if isinstance(tree, dict) and len(tree) <= WIDE:
        for k, v in tree.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list) and len(tree) <= WIDE:
        for i, v in enumerate(tree):
            out += _paths(v, (*prefix, i))
    return out


def mutate(tree: Any, rng: random.Random) -> Any:
    """One to three edits at random places: a hostile value, a removed or an unknown key."""
    tree = copy.copy(tree) if not isinstance(tree, dict) else _copy_tree(tree)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(tree) if p]
        if not paths:
            return _hostile(rng)
        path = rng.choice(paths)
        parent = tree
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = rng.random()
        if action < 0.75:
            parent[last] = _hostile(rng)
        elif action < 0.9 and isinstance(parent, dict):
            del parent[last]
        elif isinstance(parent, dict):
            parent[rng.choice(("x", "", "0", "crc32", "chunk"))] = _hostile(rng)
        else:
            parent[last] = [parent[last]]
    return tree


def _copy_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tree(v) for v in tree]
    return tree  # tensors and scalars are shared, never mutated in place


def _payloads() -> list[Payload]:
    out = []
    for model, source, target, seq in (
        (ModelShape(2, 4, 2), StageLayout(2), StageLayout(4), 3),
        (ModelShape(3, 2, 2, dtype="float8_e4m3fn"), StageLayout(1, 3), StageLayout(2), 2),
        (ModelShape.mla(2, 3), StageLayout(2), StageLayout(1), 1),
    ):
        plan = plan_transfer(source, target, model)
        full = random_request_kv(model, seq, seed=seq)
        shipment = send(plan, 0, shard(full, source, model)[0], slicing="receiver")[0]
        out.append(
            payload_from_shipment(
                plan, shipment, "req_1", block_ids=[3, 1], chunk=Chunk(1, 4, False)
            )
        )
    return out


PAYLOADS = _payloads()


class Budget:
    """Times every call and traces the allocations of one call in ``TRACE_EVERY``;
    collects how many inputs each entry point took."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.slowest = 0.0
        self.largest = 0

    def call(
        self, name: str, fn: Callable[[], Any], allowed: tuple[type[BaseException], ...]
    ) -> Any:
        traced = self.counts[name] % TRACE_EVERY == 0
        if traced:
            tracemalloc.start()
        started = time.process_time()
        try:
            result = fn()
        except allowed:
            result = None
        except BaseException as error:  # anything else is the bug this test hunts
            raise AssertionError(
                f"{name} raised {type(error).__name__} (not {[a.__name__ for a in allowed]}): "
                f"{str(error)[:300]}"
            ) from error
        finally:
            elapsed = time.process_time() - started
            peak = tracemalloc.get_traced_memory()[1] if traced else 0
            if traced:
                tracemalloc.stop()
        if not traced:  # tracing slows allocation-heavy code several-fold
            assert elapsed < SECONDS, f"{name} took {elapsed:.2f} CPU s"
        assert peak < ALLOCATION_BUDGET, f"{name} allocated {peak} bytes"
        self.counts[name] += 1
        self.slowest, self.largest = max(self.slowest, elapsed), max(self.largest, peak)
        return result


@pytest.fixture
def budget() -> Budget:
    return Budget()


def _header_and_frames(payload: Payload, checksum: bool) -> tuple[dict, list[bytes]]:
    frames = [bytes(f) for f in encode(payload, checksum=checksum)]
    return json.loads(frames[0]), frames[1:]


def _fuzz_decode(budget: Budget, rng: random.Random, n: int) -> None:
    for i in range(n):
        header, tensors = _header_and_frames(rng.choice(PAYLOADS), checksum=i % 2 == 0)
        mode = rng.random()
        if mode < 0.6:
            head = as_json(mutate(header, rng))  # NaN and Infinity included
            frames = [head, *tensors]
        elif mode < 0.8:
            frames = [json.dumps(header).encode(), *tensors]
            k = rng.randrange(len(frames))
            damaged = bytearray(frames[k])
            if damaged:
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            frames[k] = bytes(damaged)
        elif mode < 0.9:
            frames = [json.dumps(header).encode(), *tensors]
            frames = [*frames[: rng.randrange(1, len(frames) + 1)], b"\x00" * rng.randrange(3)]
        else:
            frames = [rng.randbytes(rng.randrange(64)) for _ in range(rng.randrange(1, 4))]
        payload = budget.call("decode", lambda f=frames: decode(f), (WireError,))
        assert payload is None or isinstance(payload, Payload)


def _inner(wrapper: Any, key: str) -> Any:
    """The mutated value under ``key``, or the whole mutant if the edit replaced the wrapper."""
    value = wrapper.get(key) if isinstance(wrapper, dict) else wrapper
    return as_python(value)


def _fuzz_dicts(budget: Budget, rng: random.Random, n: int) -> None:
    for _ in range(n):
        payload = rng.choice(PAYLOADS)
        data = payload.to_dict()
        mutated = as_python(mutate(data, rng))
        budget.call("Payload.from_dict", lambda d=mutated: Payload.from_dict(d), (ValueError,))
        chunk = _inner(mutate({"chunk": payload.chunk.to_dict()}, rng), "chunk")
        budget.call("Chunk.from_dict", lambda c=chunk: Chunk.from_dict(c), (ValueError,))
        marker = _inner(mutate({"m": payload.head_slice.to_dict()}, rng), "m")
        budget.call("HeadSlice.from_dict", lambda m=marker: HeadSlice.from_dict(m), (ValueError,))


def _fuzz_keys(budget: Budget, rng: random.Random, n: int) -> None:
    for _ in range(n):
        args = [rng.choice(("req", "a_b", "omni_1")), 0, 1, 2, 3]
        args[rng.randrange(5)] = as_python(_hostile(rng))
        budget.call("rank_aware_key", lambda a=args: rank_aware_key(*a), (ValueError,))
        budget.call("legacy_key", lambda a=args: legacy_key(*a[:3]), (ValueError,))
        text = as_python(
            rng.choice([_hostile(rng), "r_0_0_0_0", "omni_0_to_1_kv_cache_r", "r_0_05_0_0"])
        )
        if isinstance(text, str) and rng.random() < 0.5 and text:
            text = text[: rng.randrange(len(text))]
        budget.call("parse_key", lambda t=text: parse_key(t), (ValueError,))


def _fuzz_messages(budget: Budget, rng: random.Random, n: int) -> None:
    samples = [
        {"key": "r_0_0_0_0", "seq": 3, "t": 1.5, "crc": 7},
        {"hello": 0, "nonce": "ab", "mac": "cd"},
        {"welcome": 1, "mac": "cd"},
        {"end": ["r_0_0_0_0"], "skipped": {"r_0_1_0_0": "why"}},
    ]
    readers = {
        "read_envelope": messages.read_envelope,
        "read_handshake": messages.read_handshake,
        "read_single": lambda f: messages.read_single(f, limit=1 << 22),
        "load": messages.load,
    }
    for _ in range(n):
        frame = as_json(mutate(copy.deepcopy(rng.choice(samples)), rng))
        for name, read in readers.items():
            budget.call(name, lambda r=read, f=frame: r(f), (messages.MessageError,))


def test_ten_thousand_hostile_inputs_raise_only_documented_errors(budget: Budget) -> None:
    rng = random.Random(SEED)
    _fuzz_decode(budget, rng, 3000)
    _fuzz_dicts(budget, rng, 1500)
    _fuzz_keys(budget, rng, 800)
    _fuzz_messages(budget, rng, 600)
    total = sum(budget.counts.values())
    assert total >= 10_000, budget.counts
    assert set(budget.counts) >= {
        "decode",
        "Payload.from_dict",
        "Chunk.from_dict",
        "HeadSlice.from_dict",
        "parse_key",
        "rank_aware_key",
        "read_envelope",
    }


def test_hostile_vector_sets_are_refused(tmp_path: Path, budget: Budget) -> None:
    rng = random.Random(SEED)
    manifest = json.loads((GOLDEN_DIR / "manifest.json").read_text())
    small = {k: v for k, v in manifest.items() if k != "families"}
    small["families"] = {"ports": manifest["families"]["ports"][:2]}
    tensors = (GOLDEN_DIR / "tensors.safetensors").read_bytes()
    for i in range(150):
        root = tmp_path / str(i)
        root.mkdir()
        (root / "manifest.json").write_bytes(as_json(mutate(small, rng)))
        (root / "tensors.safetensors").write_bytes(
            tensors if i % 3 else tensors[: rng.randrange(len(tensors))]
        )
        budget.call("load_vectors", lambda r=root: load_vectors(r), (VectorsError,))


# -- pinned: the inputs that once broke a decoder ------------------------------------------


def _checksummed_header_nested(depth: int) -> list[bytes]:
    header, tensors = _header_and_frames(PAYLOADS[0], checksum=True)
    text = json.dumps(header)
    deep = "[" * depth + "]" * depth
    return [text.replace('"block_ids": [3, 1]', f'"block_ids": {deep}').encode(), *tensors]


@pytest.mark.parametrize("depth", [50, 990, 5000])
def test_a_deeply_nested_checksummed_header_is_refused(depth: int) -> None:
    with pytest.raises(WireError, match=r"nests"):
        decode(_checksummed_header_nested(depth))


@pytest.mark.parametrize(
    "field", ["block_ids", "block_size", "chunk_id", "token_start", "tp_head_slice"]
)
def test_integers_beyond_int64_are_refused(field: str) -> None:
    header, tensors = _header_and_frames(PAYLOADS[0], checksum=False)
    if field == "block_ids":
        header["block_ids"] = [HUGE]
    elif field in ("chunk_id", "token_start"):
        header["metadata"]["chunk"][field] = HUGE
    elif field == "tp_head_slice":
        header["metadata"]["tp_head_slice"]["target_rank"] = HUGE
    else:
        header["metadata"][field] = HUGE
    with pytest.raises(WireError, match="beyond int64"):
        decode([json.dumps(header).encode(), *tensors])
    data = PAYLOADS[0].to_dict()
    data["block_ids"] = [2**63]
    with pytest.raises(ValueError, match=r"block_ids\[0\] must be <= 9223372036854775807"):
        Payload.from_dict(data)


@pytest.mark.parametrize(
    "call",
    [
        lambda: Payload.from_dict({**PAYLOADS[0].to_dict(), "block_ids": _deep_list()}),
        lambda: Payload.from_dict({**PAYLOADS[0].to_dict(), "request_id": _deep_list()}),
        lambda: HeadSlice.from_dict(_deep_list()),
        lambda: HeadSlice.from_dict({"target_rank": _deep_list()}),
        lambda: Chunk.from_dict({"chunk_id": _deep_list(), "token_start": 0, "final": True}),
        lambda: parse_key(_deep_list()),
        lambda: rank_aware_key(_deep_list(), 0, 0, 0, 0),
        lambda: legacy_key(_deep_dict(), 0, 1),
    ],
)
def test_deep_values_make_short_messages(call) -> None:
    with pytest.raises(ValueError) as raised:
        call()
    assert len(str(raised.value)) < 1000


def test_a_huge_bad_value_makes_a_short_message() -> None:
    with pytest.raises(ValueError) as raised:
        parse_key("x" * (1 << 20))
    assert len(str(raised.value)) < 1000


def test_a_chunk_id_of_a_trillion_costs_nothing() -> None:
    """Reassembly once built set(range(max(chunk_id) + 1)): 10**12 exhausted memory."""
    first = PAYLOADS[0]
    from dataclasses import replace

    chunks = [replace(first, chunk=Chunk(0, 0, False)), replace(first, chunk=Chunk(10**12, 3))]
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(ValueError, match=r"missing chunk ids \[1, 2, .*and \d+ more"):
            reassemble(chunks)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.process_time() - started < SECONDS and peak < ALLOCATION_BUDGET


def test_the_largest_legal_header_is_decoded() -> None:
    """A header at the 1 MiB limit, all block ids, decodes to exactly those ids. How fast
    is a benchmark row (``benchmarks.codec``: against ``json.loads`` of the same bytes),
    not a timed test."""
    header, tensors = _header_and_frames(PAYLOADS[0], checksum=False)
    header["block_ids"] = list(range(140_000))
    head = json.dumps(header, separators=(",", ":")).encode()
    assert len(head) < 1 << 20
    payload = decode([head, *tensors])
    assert payload.block_ids == tuple(range(140_000))
    assert payload.request_id == PAYLOADS[0].request_id


def test_a_receiver_can_require_checksums() -> None:
    plain = [bytes(f) for f in encode(PAYLOADS[0])]
    with pytest.raises(WireError, match="this receiver requires one"):
        decode(plain, require_checksum=True)
    assert decode([bytes(f) for f in encode(PAYLOADS[0], checksum=True)], require_checksum=True)
