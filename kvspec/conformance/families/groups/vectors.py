"""The ``groups`` vectors: the plans of hybrid models, every layer group's bytes on every
edge, the tokens a sliding window or a chunked local group needs, and plans with the
sender's and the receiver's own block sizes
[GROUP-1, GROUP-2, GROUP-3, WINDOW-1, WINDOW-2, LOCAL-1, STATE-1, BLOCK-1].

The model presets and small hybrids come first, then chunked models from their own
stream, then the two-block-size cases from theirs, so older cases stay as they were.
"""

from __future__ import annotations

import random

from kvspec.conformance.adapter import FullAdapter, NotProvided
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.sampling import hybrid_cases
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.case import TransferCase
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import ChunkedLocal, SlidingWindow, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.windows import chunk_tokens, window_tokens


def _chunked_cases(rng: random.Random) -> list[tuple[TransferCase, int, int]]:
    """(case, seq_len, block_size) of small models with a chunked local-attention group
    [LOCAL-1]: lengths inside a chunk, on a chunk boundary that is not a block boundary,
    and on one that is."""
    found = []
    for _ in range(8):
        chunk, block = rng.randint(2, 24), rng.choice([1, 4, 16])
        chunked = {"kind": "chunked", "num_kv_heads": rng.choice([1, 2, 4]), "head_dim": 2}
        model = ModelShape(
            4,
            rng.choice([1, 2, 4]),
            2,
            groups=(group_from_dict({**chunked, "chunk": chunk}),),
            layers=(1, 0, 1, 0),
        )
        source, target = rng.choice([(1, 4), (4, 1), (2, 4), (4, 2)])
        for seq_len in (rng.randint(1, 80), chunk * rng.randint(1, 3)):
            found.append(
                (TransferCase(StageLayout(source), StageLayout(target), model), seq_len, block)
            )
    return found


WINDOW_STATE = ModelShape(
    4,
    2,
    256,
    groups=(
        group_from_dict({"kind": "sliding", "num_kv_heads": 2, "head_dim": 256, "window": 128}),
        group_from_dict(
            {
                "kind": "mamba2",
                "num_heads": 32,
                "head_dim": 64,
                "n_groups": 2,
                "d_state": 64,
                "conv_kernel": 4,
            }
        ),
    ),
    layers=(0, 1, 2, 2),
)
"""A window beside a Mamba-2 state whose vLLM block size is 144 tokens at TP1 and 80 at
TP4 [BLOCK-1], so its P/D plans have two block sizes by construction [WINDOW-2]."""


def _block_size_cases(rng: random.Random) -> list[tuple[TransferCase, int, int, int, bool]]:
    """(case, seq_len, sender block size, receiver block size, derived) [WINDOW-2]: the
    window-and-state hybrid TP1 <-> TP4 at the block sizes vLLM derives per TP (planned one
    way, refused the other at some lengths), then small window and chunk models at drawn
    pairs of block sizes, some of which need evicted tokens."""
    found = []
    blocks = {tp: hybrid_block_size(WINDOW_STATE, tp) for tp in (1, 4)}
    for source, target in ((1, 4), (4, 1)):
        case = TransferCase(StageLayout(source), StageLayout(target), WINDOW_STATE)
        for seq_len in (100, 1000, rng.randint(129, 2000)):
            found.append((case, seq_len, blocks[source], blocks[target], True))
    for _ in range(6):
        kind = rng.choice(["sliding", "chunked"])
        group = {"kind": kind, "num_kv_heads": rng.choice([1, 2, 4]), "head_dim": 2}
        group["window" if kind == "sliding" else "chunk"] = rng.randint(2, 24)
        model = ModelShape(4, 2, 2, groups=(group_from_dict(group),), layers=(1, 0, 1, 0))
        source, target = rng.choice([(1, 4), (4, 1), (2, 4), (4, 2)])
        sender, receiver = rng.choice([(4, 8), (8, 4), (12, 8), (8, 12), (3, 16)])
        case = TransferCase(StageLayout(source), StageLayout(target), model)
        found.append((case, rng.randint(1, 80), sender, receiver, False))
    return found


def _needed_tokens(model: ModelShape, seq_len: int, block: int) -> tuple[list[dict], list[dict]]:
    """The tokens a receiver with ``block``-token blocks needs of each sliding-window and
    each chunked group, as the vectors record them [WINDOW-1, LOCAL-1]."""
    groups = list(enumerate(model.layer_groups))
    windows = [
        {
            "group": g,
            "window": group.window,
            "tokens": window_tokens(group.window, seq_len, block).to_list(),
        }
        for g, group in groups
        if isinstance(group, SlidingWindow)
    ]
    chunks = [
        {
            "group": g,
            "chunk": group.chunk,
            "tokens": chunk_tokens(group.chunk, seq_len, block).to_list(),
        }
        for g, group in groups
        if isinstance(group, ChunkedLocal)
    ]
    return windows, chunks


def _block_size_vectors(start: int, rng: random.Random) -> list[Case]:
    cases: list[Case] = []
    for i, (case, seq_len, sender, receiver, derived) in enumerate(_block_size_cases(rng)):
        entry: Case = {
            "id": f"groups-{start + i:03d}",
            "clauses": ["GROUP-3", "WINDOW-1", "LOCAL-1", "WINDOW-2"]
            + (["BLOCK-1"] if derived else []),
            **case.to_dict(),
            "seq_len": seq_len,
            "block_size": receiver,
            "source_block_size": sender,
        }
        entry["windows"], chunks = _needed_tokens(case.model, seq_len, receiver)
        if chunks:
            entry["chunks"] = chunks
        if derived:
            entry["derived_block_sizes"] = {
                str(layout.attn_tp): hybrid_block_size(case.model, layout.attn_tp)
                for layout in (case.source, case.target)
            }
        try:
            plan = plan_groups(
                case.source,
                case.target,
                case.model,
                seq_len=seq_len,
                source_block_size=sender,
                target_block_size=receiver,
            )
        except ValueError as error:
            entry["refused"] = str(error)
        else:
            entry["edges"] = [e.to_dict() for e in plan.edges]
        cases.append(entry)
    return cases


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    # Chunked cases come last, from their own stream: the older cases stay as they were.
    older = hybrid_cases(rng)
    more = _chunked_cases(random.Random(f"{rng.random()}:chunked"))
    for i, (case, seq_len, block) in enumerate(older + more):
        plan = plan_groups(
            case.source,
            case.target,
            case.model,
            seq_len=seq_len,
            block_size=block,
            policy=case.policy,
        )
        windows, chunks = _needed_tokens(case.model, seq_len, block)
        cases.append(
            {
                "id": f"groups-{i:03d}",
                "clauses": ["GROUP-1", "GROUP-2", "GROUP-3", "WINDOW-1", "STATE-1"]
                + (["LOCAL-1"] if chunks else []),
                **case.to_dict(),
                "seq_len": seq_len,
                "block_size": block,
                "windows": windows,
                **({"chunks": chunks} if chunks else {}),
                "edges": [e.to_dict() for e in plan.edges],
            }
        )
    # Two block sizes per plan come after those, from their own stream [WINDOW-2, BLOCK-1].
    cases += _block_size_vectors(len(cases), random.Random(f"{rng.random()}:block sizes"))
    return cases, {}


def _check_block_sizes(adapter: FullAdapter, case: Case, transfer: TransferCase) -> str | None:
    """A plan with the sender's and the receiver's own block sizes [WINDOW-2, BLOCK-1]."""
    for tp, want in case.get("derived_block_sizes", {}).items():
        try:
            derived = adapter.hybrid_block_size(transfer.model, int(tp), None)
        except NotProvided:
            break
        if derived != want:
            return f"block size at attention TP {tp}: {derived}, expected {want} [BLOCK-1]"
    sender, receiver = case["source_block_size"], case["block_size"]
    try:
        tokens = adapter.window_tokens(transfer, case["seq_len"], sender, receiver)
    except NotProvided:
        raise NotApplicable("the adapter gives no window tokens per block size") from None
    except ValueError as error:
        if "refused" in case:
            return None
        return f"blocks {sender} -> {receiver}: refused ({error}), expected a plan [WINDOW-2]"
    if "refused" in case:
        return (
            f"blocks {sender} -> {receiver}: planned, expected refused: {case['refused']} "
            "[WINDOW-2]"
        )
    kinds = transfer.model.layer_groups
    want = {
        (e["group"], e["src"], e["dst"]): [tuple(r) for r in e["tokens"]]
        for e in case["edges"]
        if isinstance(kinds[e["group"]], SlidingWindow | ChunkedLocal)
    }
    got = {k: [tuple(r) for r in v] for k, v in dict(tokens).items() if v}
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            return (
                f"blocks {sender} -> {receiver}: group {key[0]}, edge {key[1]} -> {key[2]} "
                f"carries {got.get(key)}, expected {want.get(key)} [WINDOW-2]"
            )
    return None


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    transfer = TransferCase.from_dict(case)
    if transfer.policy not in adapter.drawn_policies:
        raise NotApplicable(f"policy {transfer.policy!r} not implemented by the adapter")
    if "source_block_size" in case:
        return _check_block_sizes(adapter, case, transfer)
    want = {(e["group"], e["src"], e["dst"]): e["nbytes"] for e in case["edges"]}
    got = dict(adapter.group_bytes(transfer, case["seq_len"], case["block_size"]))
    for key in sorted(set(want) | set(got)):
        if want.get(key, 0) != got.get(key, 0):
            group, src, dst = key
            return (
                f"group {group}, edge {src} -> {dst}: {got.get(key, 0)} bytes, expected "
                f"{want.get(key, 0)}"
            )
    return None


FAMILY = Family("groups", ("group-bytes",), export, check)
