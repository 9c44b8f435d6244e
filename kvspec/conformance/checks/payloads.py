"""Checks of merging payloads, reassembling chunks and the wire format.

[PAYLOAD-3, CHUNK-2, WIRE-1, WIRE-4].

Wire checks are interoperability checks: what the implementation encodes, the spec
decodes to the same payload, and the other way round; malformed messages are refused.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

from hypothesis import strategies as st

from kvspec.chunks import reassemble, split_chunks
from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, check, expect, fail
from kvspec.conformance.checks.transfer import TENSOR_PINS, Setup, tensor_examples
from kvspec.payload import Payload, merge_payloads, payload_equal, payload_from_shipment
from kvspec.wire import decode, encode


def _inbox(setup: Setup, dst: int, slicing: str = "sender") -> list[tuple[int, Payload]]:
    return [
        (s.edge.src, payload_from_shipment(setup.plan, s, "req-1", block_ids=[]))
        for s in setup.shipments_to(dst, slicing)
    ]


def _same(a: Payload, b: Payload) -> bool:
    return payload_equal(a, b)


@check(
    "PAYLOAD-3",
    "merge",
    "shards merge in source-rank order whatever the arrival; disagreeing shards are refused",
    needs=("payload",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=0.5,
)
def merge(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    rng = random.Random(setup.seed)
    for dst in setup.case.target.ranks():
        inbox = _inbox(setup, dst, rng.choice(["sender", "receiver"]))
        want = merge_payloads(setup.plan, dst, inbox)
        shuffled = rng.sample(inbox, len(inbox))
        got = ctx.adapter.merge(setup.case, dst, shuffled)
        expect(
            _same(got, want),
            f"{setup.case.describe()}: target rank {dst}'s merge of payloads arriving from "
            f"{[s for s, _ in shuffled]} differs from the spec's [PAYLOAD-3]",
        )
    dst = rng.randrange(setup.case.target.world_size)
    inbox = _inbox(setup, dst)
    if len(inbox) < 2:
        return  # one shard has nothing to disagree with
    src, first = inbox[0]
    wrong = replace(first, request_id="another-request")
    try:
        ctx.adapter.merge(setup.case, dst, [(src, wrong), *inbox[1:]])
    except Exception:
        return
    fail(
        f"{setup.case.describe()}: target rank {dst} merged shards of two requests "
        f"('req-1' and 'another-request') [PAYLOAD-3]"
    )


@check(
    "CHUNK-2",
    "reassemble",
    "chunks reassemble identically in any order; a missing chunk is refused",
    needs=("chunks",),
    strategy=lambda adapter: st.tuples(tensor_examples(adapter), st.integers(2, 4)),
    examples=tuple((pin, 2) for pin in TENSOR_PINS[:2]),
    weight=0.5,
)
def reassembles(ctx: Context, example: Example) -> None:
    base, count = example
    setup = Setup(ctx, base)
    _, whole = _inbox(setup, 0)[0]
    count = min(count, whole.seq_len)
    sizes = [whole.seq_len // count] * count
    sizes[-1] += whole.seq_len - sum(sizes)
    chunks = list(split_chunks(whole, sizes))
    rng = random.Random(setup.seed)
    shuffled = rng.sample(chunks, len(chunks))
    got = ctx.adapter.reassemble(shuffled)
    expect(
        _same(got, reassemble(chunks)),
        f"{setup.case.describe()}: chunks of {sizes} tokens "
        f"arriving as {[c.chunk.chunk_id for c in shuffled]} reassemble wrong [CHUNK-2]",
    )
    if len(chunks) > 1:
        try:
            ctx.adapter.reassemble(shuffled[1:])
        except Exception:
            return
        fail(
            f"{setup.case.describe()}: reassembly without chunk {shuffled[0].chunk.chunk_id} "
            "was accepted [CHUNK-2]"
        )


@check(
    "WIRE-1",
    "interoperate",
    "the implementation's frames decode as the spec's and the other way round",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS,
    weight=0.5,
)
def interoperate(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    for dst in setup.case.target.ranks():
        for src, payload in _inbox(setup, dst):
            ours = decode([bytes(f) for f in ctx.adapter.encode(payload)])
            expect(
                _same(ours, payload),
                f"{setup.case.describe()}: edge {src}->{dst}: the "
                "implementation's frames decode to another payload [WIRE-1]",
            )
            theirs = ctx.adapter.decode([bytes(f) for f in encode(payload)])
            expect(
                _same(theirs, payload),
                f"{setup.case.describe()}: edge {src}->{dst}: the "
                "spec's frames decode to another payload in the implementation [WIRE-1]",
            )


@st.composite
def _damaged(draw: st.DrawFn) -> Example:
    return {
        "base": draw(tensor_examples(Adapter())),
        "damage": draw(
            st.sampled_from(
                [
                    "truncate-frame",
                    "extra-byte",
                    "drop-frame",
                    "dtype-name",
                    "shape",
                    "header-garbage",
                ]
            )
        ),
    }


@check(
    "WIRE-4",
    "refuses-malformed",
    "a malformed message is refused, never decoded into something else",
    needs=("wire",),
    strategy=lambda adapter: _damaged(),
    examples=tuple({"base": TENSOR_PINS[0], "damage": d} for d in ("truncate-frame", "dtype-name")),
    weight=0.5,
)
def refuses_malformed(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example["base"])
    _, payload = _inbox(setup, 0)[0]
    frames = [bytes(f) for f in encode(payload)]
    header = json.loads(frames[0])
    damage = example["damage"]
    if damage == "truncate-frame":
        frames[1] = frames[1][:-1]
    elif damage == "extra-byte":
        frames[1] = frames[1] + b"\0"
    elif damage == "drop-frame":
        frames = frames[:-1]
    elif damage == "dtype-name":
        header["tensors"][0]["dtype"] = "object"
        frames[0] = json.dumps(header).encode()
    elif damage == "shape":
        header["tensors"][0]["shape"] = [-1, *header["tensors"][0]["shape"][1:]]
        frames[0] = json.dumps(header).encode()
    else:
        frames[0] = b"\x80\x04" + frames[0][2:]  # pickle's opening bytes
    try:
        got = ctx.adapter.decode(frames)
    except Exception:
        return
    fail(
        f"{setup.case.describe()}: a message with damage {damage!r} was decoded into a payload "
        f"of {len(got.tensors())} tensors instead of being refused [WIRE-4]"
    )
