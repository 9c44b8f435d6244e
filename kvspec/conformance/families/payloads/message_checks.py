"""Checks that a message describing an invalid payload is refused by the decoder [PAYLOAD-1].

A valid message of the spec (one edge's payload, encoded) is changed in one way each — an
unknown or missing key, a tensor at odds with the metadata, a missing fp8 scale, a value
out of range — and every change must be refused
(:func:`~kvspec.conformance.refusals.refuse_all`).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.draws import TENSOR_PINS, TENSOR_WEIGHT, Setup, tensor_examples
from kvspec.conformance.draws.messages import header_of, one_payload, wire_frames, with_header
from kvspec.conformance.refusals import Probe, refuse_all
from kvspec.tensors.dtypes import DTYPES


def _invalid_payloads(frames: list[bytes], rng: random.Random) -> list[Probe]:
    """The message describing a payload that breaks PAYLOAD-1 in one way each: an unknown
    or missing key, a tensor at odds with the metadata, a missing fp8 scale, a value out
    of range; each with the value its refusal must name ("refused, naming the value")."""
    header = header_of(frames)
    found: list[Probe] = []

    def changed(
        obligation: str,
        what: str,
        edit: Callable[[dict], None],
        naming: tuple[object, ...],
        kept: list[bytes] = frames,
    ) -> None:
        copied = copy.deepcopy(header)
        edit(copied)
        found.append((obligation, what, with_header(kept, copied), naming))

    changed(
        "PAYLOAD-1.1",
        "an unknown metadata key",
        lambda h: h["metadata"].update(compression=0),
        ("compression",),
    )
    for key in ("block_size", "seq_len", "tp_head_slice", "dtype"):

        def drop(h: dict, key: str = key) -> None:
            h["metadata"].pop(key)

        changed("PAYLOAD-1.1", f"no metadata key {key!r}", drop, (key, f"metadata.{key}"))
    changed(
        "PAYLOAD-1.1",
        "an unknown tp_head_slice key",
        lambda h: h["metadata"]["tp_head_slice"].update(stride=1),
        ("stride",),
    )
    changed(
        "PAYLOAD-1.1",
        "no chunk key 'final'",
        lambda h: h["metadata"]["chunk"].pop("final"),
        ("final",),
    )
    dtype = header["metadata"]["dtype"]
    same = [n for n, d in DTYPES.items() if n != dtype and d.itemsize == DTYPES[dtype].itemsize]
    caches = [i for i, e in enumerate(header["tensors"]) if e["field"].endswith("_cache")]
    if same:
        i = rng.choice(caches)
        entry = header["tensors"][i]

        def retype(h: dict, i: int = i) -> None:
            h["tensors"][i]["dtype"] = same[0]

        changed(
            "PAYLOAD-1.2",
            f"{entry['field']}[{entry['layer']}] of dtype {same[0]} in a {dtype} payload",
            retype,
            (same[0], f"torch.{same[0]}"),
        )
    seq_len = header["metadata"]["seq_len"]
    changed(
        "PAYLOAD-1.2",
        "a seq_len one more than its tensors hold",
        lambda h: h["metadata"].update(seq_len=seq_len + 1),
        (seq_len + 1, seq_len),
    )
    scales = [i for i, e in enumerate(header["tensors"]) if e["field"].endswith("_scale")]
    if scales:
        i = rng.choice(scales)
        kept = [f for j, f in enumerate(frames) if j != i + 1]

        def unlisted(h: dict, i: int = i) -> None:
            h["tensors"].pop(i)

        changed(
            "PAYLOAD-1.3",
            f"{header['tensors'][i]['field']} of layer {header['tensors'][i]['layer']} missing",
            unlisted,
            (header["tensors"][i]["field"],),
            kept,
        )
    changed("PAYLOAD-1.4", "block_size 0", lambda h: h["metadata"].update(block_size=0), (0,))
    changed("PAYLOAD-1.4", "a block id -1", lambda h: h["block_ids"].append(-1), (-1,))
    changed("PAYLOAD-1.4", "an empty request id", lambda h: h.update(request_id=""), ("",))
    return found


@check(
    "PAYLOAD-1",
    "refuses-invalid-payload",
    "a message describing an invalid payload (keys, shapes, dtypes, scales, values) is refused",
    needs=("wire",),
    strategy=tensor_examples,
    examples=TENSOR_PINS[:2],
    weight=TENSOR_WEIGHT,
    covers=("PAYLOAD-1.1", "PAYLOAD-1.2", "PAYLOAD-1.3", "PAYLOAD-1.4"),
)
def refuses_invalid_payload(ctx: Context, example: Example) -> None:
    setup = Setup(ctx, example)
    frames = wire_frames(one_payload(setup))
    refuse_all(ctx, setup, _invalid_payloads(frames, random.Random(setup.seed)))
