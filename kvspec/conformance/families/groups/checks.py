"""Checks of hybrid models: layer groups, state parts, sliding windows, chunked local
attention and the bytes of each group [GROUP-1..3, STATE-1..2, WINDOW-1, LOCAL-1].

Models are drawn as small hybrids (every kind, random layer maps) over the TP sizes of
the adapter's domain; the expected values are the spec's own functions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, vacuous
from kvspec.conformance.checks.expectations import changed_values, expect, expect_refused
from kvspec.conformance.draws import spec_plan, spec_rule
from kvspec.conformance.draws.hybrids import (
    KINDS,
    STATES,
    group_data,
    hybrid_model,
    hybrid_tp_sizes,
)
from kvspec.conformance.transfer_config import TransferConfig, handed
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import ChunkedLocal, group_from_dict
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import (
    StateRead,
    part_offsets,
    part_units,
    plan_state_reads,
    state_elements,
)

LOCAL = ("chunked", "full", "sliding")
"""Kinds drawn beside chunked local attention [LOCAL-1] (KINDS leaves it out, so the
examples the older checks draw stay as they were)."""


@st.composite
def _cases(draw: st.DrawFn, adapter: Adapter, kinds: tuple[str, ...] | None = None) -> Example:
    tps = hybrid_tp_sizes(adapter)
    model = draw(hybrid_model(kinds))
    pp = [p for p in adapter.domain.pp_sizes if p <= model["num_layers"]] or [1]
    source = StageLayout(draw(st.sampled_from(tps)), draw(st.sampled_from(pp)))
    target = StageLayout(draw(st.sampled_from(tps)), draw(st.sampled_from(pp)))
    policy = draw(st.sampled_from(adapter.drawn_policies))
    return {
        "case": TransferCase(source, target, ModelShape.from_dict(model), policy).to_dict(),
        "seq_len": draw(st.integers(0, 96)),
        "block_size": draw(st.sampled_from([1, 4, 16])),
    }


def _case(ctx: Context, example: Example) -> TransferCase:
    case = TransferCase.from_dict(example["case"])
    if case.policy not in ctx.adapter.drawn_policies:
        raise OutsideDomain
    return case


# GROUP-1.1: the default is today's uniform model ------------------------------------------
@st.composite
def _uniform(draw: st.DrawFn, adapter: Adapter) -> Example:
    tps = hybrid_tp_sizes(adapter)
    model = ModelShape(draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 4, 8])), 4)
    case = TransferCase(
        StageLayout(draw(st.sampled_from(tps))),
        StageLayout(draw(st.sampled_from(tps))),
        model,
        draw(st.sampled_from(adapter.drawn_policies)),
    )
    return {"case": case.to_dict(), "seq_len": draw(st.integers(1, 64)), "block_size": 16}


@check(
    "GROUP-1",
    "uniform-default",
    "a model without groups is one full-attention group moving what today's plan moves",
    needs=("group-bytes",),
    strategy=_uniform,
    covers=("GROUP-1.1",),
)
def _uniform_default(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    seq_len = example["seq_len"]
    want = {(0, e.src, e.dst): e.nbytes(seq_len) for e in spec_plan(ctx.adapter, case).edges}
    got = dict(ctx.adapter.group_bytes(case, seq_len, example["block_size"]))
    expect(
        got == want,
        f"{case.model.describe()} (no layer groups) is one full-attention group: its edges move "
        f"{want} bytes as the uniform plan's [GROUP-1.1, PLAN-5]; the implementation says {got}",
    )


# refusals of layer maps and group facts [GROUP-1.2..4, GROUP-2.1..3, GROUP-3.3, STATE-1.3] --
_BREAKS: dict[str, str] = {
    "GROUP-1.2": "a layer map of another length than num_layers",
    "GROUP-1.3": "a layer map naming a group that does not exist",
    "GROUP-1.4": "a group that no layer belongs to",
    "GROUP-2.1": "a group size below its minimum, or not an integer",
    "GROUP-2.2": "a Mamba-2 group count that does not divide its heads",
    "GROUP-2.3": "an unknown group kind",
    "GROUP-3.3": "a layout that cannot hold one group's heads",
    "STATE-1.3": "a state part whose units do not fit attention TP",
    "LOCAL-1.3": "a chunk below 1 token (0 does not mean full attention)",
}


def _bad_models(draw: st.DrawFn, model: dict[str, Any], obligation: str) -> list[dict[str, Any]]:
    """``model`` broken against ``obligation``, in each way the obligation names."""
    bad = copy.deepcopy(model)
    if obligation == "GROUP-1.2":  # one layer too many, and one too few
        short = copy.deepcopy(model)
        short["layers"] = short["layers"][:-1]
        bad["layers"] = bad["layers"] + [0]
        return [bad, short]
    if obligation == "GROUP-1.3":
        bad["layers"][draw(st.integers(0, len(bad["layers"]) - 1))] = len(bad["groups"]) + 1
        return [bad]
    if obligation == "GROUP-1.4":
        bad["groups"].append(draw(group_data(draw(st.sampled_from(KINDS)))))
        return [bad]
    if obligation == "GROUP-2.1":
        sized = [g for g in bad["groups"] if any(isinstance(v, int) for v in g.values())]
        if not sized:  # only MLP-only layers (kind none, no sizes): break a group of its own
            sized = [draw(group_data("mamba1"))]
            bad["groups"].append(sized[0])
            bad["layers"].append(len(bad["groups"]))
            bad["num_layers"] += 1
        group = draw(st.sampled_from(sized))
        fact = draw(st.sampled_from(sorted(k for k, v in group.items() if isinstance(v, int))))
        minimum = {"conv_kernel": 2, "num_spec": 0}.get(fact, 1)
        group[fact] = draw(st.sampled_from([minimum - 1, float(group[fact]), str(group[fact])]))
        return [bad]
    if obligation == "GROUP-2.2":
        heads = draw(st.sampled_from([2, 4, 8]))  # units that TP 2 holds: only the ratio is bad
        extra = {**draw(group_data("mamba2")), "num_heads": heads, "n_groups": heads * 2}
    elif obligation == "GROUP-2.3":
        kind = draw(st.sampled_from(["chunked_attention", "swa", "Mamba2", "kda", "linear"]))
        extra = {**draw(group_data("full")), "kind": kind}
    elif obligation == "GROUP-3.3":
        extra = {**draw(group_data("draft")), "num_kv_heads": 3, "attention": "mha"}
    elif obligation == "LOCAL-1.3":
        extra = {**draw(group_data("chunked")), "chunk": draw(st.sampled_from([0, -1, -8192]))}
    else:  # STATE-1.3
        extra = {**draw(group_data("gdn")), "num_k_heads": 3, "num_v_heads": 3}
    bad["groups"].append(extra)  # a layer of a group of its own, the break in it
    bad["layers"].append(len(bad["groups"]))
    bad["num_layers"] += 1
    return [bad]


@st.composite
def _broken(draw: st.DrawFn, adapter: Adapter, obligations: tuple[str, ...]) -> Example:
    """A valid hybrid model and, for every obligation, the same model broken against it:
    the check tries every break on every example, so none waits on the draw."""
    model = draw(hybrid_model())
    source, target = StageLayout(1).to_dict(), StageLayout(2).to_dict()
    config = {"source": source, "target": target, "seq_len": 8}
    return {
        "good": {**config, "model": model},
        "breaks": [
            {"obligation": o, "bad": {**config, "model": bad}}
            for o in obligations
            for bad in _bad_models(draw, model, o)
        ],
    }


def _refusal_check(clause: str, obligations: tuple[str, ...]) -> None:
    @check(
        clause,
        "refuses-" + clause.lower().replace("-", ""),
        "; ".join(_BREAKS[o] for o in obligations) + ": each refused, the valid model accepted",
        needs=("models",),
        strategy=lambda adapter: _broken(adapter, obligations),
        covers=obligations,
    )
    def run(ctx: Context, example: Example) -> None:
        if 2 not in hybrid_tp_sizes(ctx.adapter):
            raise OutsideDomain
        for config in (example["good"], *(b["bad"] for b in example["breaks"])):
            handed(config)
        ctx.adapter.validate_model(example["good"])
        for broken in example["breaks"]:

            def validate(bad: TransferConfig = broken["bad"]) -> object:
                refuse: Callable[..., object] = ctx.adapter.validate_model  # its result is shown
                return refuse(bad)

            expect_refused(
                broken["obligation"],
                f"{_BREAKS[broken['obligation']]} ({broken['bad']['model']})",
                validate,
                naming=changed_values(example["good"], broken["bad"]),
                accepted=broken["bad"],
            )


_refusal_check("GROUP-1", ("GROUP-1.2", "GROUP-1.3", "GROUP-1.4"))
_refusal_check("GROUP-2", ("GROUP-2.1", "GROUP-2.2", "GROUP-2.3"))
_refusal_check("GROUP-3", ("GROUP-3.3",))
_refusal_check("STATE-1", ("STATE-1.3",))
_refusal_check("LOCAL-1", ("LOCAL-1.3",))


# GROUP-3: the bytes of every edge of every group ---------------------------------------------
@check(
    "GROUP-3",
    "bytes-per-group",
    "every edge of every layer group moves the bytes of its own group's facts, layers and "
    "tokens (a sliding window's, block-aligned); states the same at every length",
    needs=("group-bytes",),
    strategy=_cases,
    examples=(
        {
            "case": TransferCase(
                StageLayout(1),
                StageLayout(2, 2),
                ModelShape(
                    5,
                    4,
                    2,
                    groups=(
                        group_from_dict(
                            {"kind": "sliding", "num_kv_heads": 4, "head_dim": 2, "window": 6}
                        ),
                        group_from_dict({"kind": "draft", "num_kv_heads": 2, "head_dim": 3}),
                    ),
                    layers=(1, 0, 1, 0, 2),
                ),
            ).to_dict(),
            "seq_len": 21,
            "block_size": 4,
        },
    ),
    covers=(
        "GROUP-3.1",
        "GROUP-3.2",
        "GROUP-1.5",
        "GROUP-2.4",
        "WINDOW-1.1",
        "WINDOW-1.2",
    ),
)
def _bytes_per_group(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    seq_len, block = example["seq_len"], example["block_size"]
    for length in (seq_len, seq_len + 2 * block + 1):
        plan = case.group_plan(length, spec_rule(ctx.adapter, case), block_size=block)
        want = plan.bytes_per_edge()
        got = dict(ctx.adapter.group_bytes(case, length, block))
        for key in sorted(set(want) | set(got)):
            if want.get(key, 0) != got.get(key, 0):
                group, src, dst = key
                facts = case.model.layer_groups[group].describe()
                edge = next((e for e in plan.edges if (e.group, e.src, e.dst) == key), None)
                detail = (
                    ""
                    if edge is None
                    else f" (layers {list(edge.layers)}, tokens "
                    f"{'all' if edge.tokens is None else edge.tokens.describe()})"
                )
                expect(
                    False,
                    f"{case.source.describe()} -> {case.target.describe()}, {length} tokens, "
                    f"block {block}: group {group} {facts}, edge {src} -> {dst}{detail} moves "
                    f"{want.get(key, 0)} bytes [{_obligation(case.model, group)}]; the "
                    "implementation says "
                    f"{got.get(key, 0)}",
                )


def _obligation(model: ModelShape, group: int) -> str:
    """The obligation an edge's bytes of ``group`` answer to."""
    kind = model.layer_groups[group].kind
    return {
        "sliding": "WINDOW-1.1",
        "chunked": "LOCAL-1.1, LOCAL-1.2",
        "draft": "GROUP-2.4, GROUP-3.1",
        "full": "GROUP-3.1, WINDOW-1.2",
    }.get(kind, "GROUP-3.2") + ", GROUP-1.5"


# STATE-1: which units of each part a rank holds ----------------------------------------------
@check(
    "STATE-1",
    "part-units",
    "every part of a state is split by its own unit count: heads, groups (replicated when "
    "fewer than ranks), channels",
    needs=("state-ownership",),
    strategy=lambda adapter: _cases(adapter, STATES),
    covers=("STATE-1.1", "STATE-1.2"),
)
def _part_units(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    model = case.model
    for index, group in enumerate(model.layer_groups):
        if group.per_token:
            continue
        for layout in (case.source, case.target):
            for rank in layout.ranks():
                want = part_units(group, layout.attn_tp, layout.locate(rank).attn_tp_rank)
                got = {
                    k: list(v)
                    for k, v in ctx.adapter.state_units(layout, model, index, rank).items()
                }
                expect(
                    got == {k: list(v) for k, v in want.items()},
                    f"{layout.describe()}, rank {rank}: group {index} {group.describe()} holds "
                    f"{ {k: list(v) for k, v in want.items()} } [STATE-1.1, STATE-1.2]; the "
                    "implementation "
                    f"says {got}",
                )


# STATE-2: every element read from the same element -------------------------------------------
def _state_values(group: Any, tp: int, attn_rank: int, layer: int) -> list[tuple]:
    """One rank's state layer as coordinates: (layer, part, unit, element) per element."""
    values: list[tuple] = []
    for part in group.parts():
        for unit in part_units(group, tp, attn_rank)[part.name]:
            values.extend((layer, part.name, unit, e) for e in range(part.unit_elements))
    return values


@check(
    "STATE-2",
    "reads",
    "a receiver's state, filled by its reads from the senders' states, holds every element "
    "once and each the same (layer, part, unit, element)",
    needs=("state-reads",),
    strategy=lambda adapter: _cases(adapter, ("mamba2", "gdn", "mamba1")),
    examples=(
        {  # Falcon-H1-like: one Mamba-2 group, P TP1 -> D TP2 (vllm#55208)
            "case": TransferCase(
                StageLayout(1),
                StageLayout(2),
                ModelShape(
                    2,
                    2,
                    2,
                    groups=(
                        group_from_dict(
                            {
                                "kind": "mamba2",
                                "num_heads": 4,
                                "head_dim": 2,
                                "n_groups": 1,
                                "d_state": 3,
                                "conv_kernel": 4,
                            }
                        ),
                    ),
                    layers=(1, 0),
                ),
            ).to_dict(),
            "seq_len": 8,
            "block_size": 4,
        },
    ),
    covers=("STATE-2.1", "STATE-2.2", "STATE-2.3"),
)
def _reads(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    model, source, target = case.model, case.source, case.target
    checked = False
    for index, group in enumerate(model.layer_groups):
        if group.per_token or not group.parts():
            continue
        layers = model.group_layers(index)
        reads = plan_state_reads(
            source, target, model, index, policy=case.policy, rule=spec_rule(ctx.adapter, case)
        )
        expected_dsts = {r.dst for r in reads}
        for dst in sorted(expected_dsts):
            where = target.locate(dst)
            size = state_elements(group, target.attn_tp)
            filled: dict[int, list[Any]] = {}
            read_from: dict[tuple[int, int], int] = {}  # (layer, element) -> its sender
            for src, layer, src_at, dst_at, length in ctx.adapter.state_reads(case, index, dst):
                expect(
                    layer in layers,
                    f"receiver {dst} read layer {layer}, not of group {index} [STATE-2.1]",
                )
                sender = _state_values(
                    group, source.attn_tp, source.locate(src).attn_tp_rank, layer
                )
                mine = filled.setdefault(layer, [None] * size)
                expect(
                    src_at >= 0
                    and src_at + length <= len(sender)
                    and dst_at >= 0
                    and dst_at + length <= size,
                    f"group {index}: read {src}:{src_at}+{length} -> {dst}:{dst_at} falls outside "
                    f"a state layer ({len(sender)} / {size} elements) [STATE-2.1]",
                )
                for i in range(length):
                    expect(
                        mine[dst_at + i] is None,
                        f"group {index}: receiver {dst} element {dst_at + i} of layer {layer} is "
                        "read twice [STATE-2.1]",
                    )
                    mine[dst_at + i] = sender[src_at + i]
                    read_from[(layer, dst_at + i)] = src
            held = [layer for layer in layers if layer in _layers_of(target, model, dst)]
            for layer in held:
                want = _state_values(group, target.attn_tp, where.attn_tp_rank, layer)
                got = filled.get(layer, [None] * size)
                wrong = [i for i in range(size) if got[i] != want[i]]
                expect(
                    not wrong,
                    f"{source.describe()} -> {target.describe()}, group {index} "
                    f"{group.describe()}: receiver {dst} layer {layer} element {wrong[:1]} should "
                    f"be {[want[i] for i in wrong[:1]]} (layer, part, unit, element) but is "
                    f"{[got[i] for i in wrong[:1]]}; {len(wrong)} of {size} wrong, offsets "
                    f"{part_offsets(group, source.attn_tp)} -> "
                    f"{part_offsets(group, target.attn_tp)} "
                    "[STATE-2.1, STATE-2.2]",
                )
                checked = True
            _check_senders(case, index, dst, reads, read_from)
    if not checked:
        vacuous()


def _check_senders(
    case: TransferCase,
    group: int,
    dst: int,
    reads: tuple[StateRead, ...],
    read_from: dict[tuple[int, int], int],
) -> None:
    """Every element of receiver ``dst`` came from the sender the plan's policy picks for
    its unit (the spec's ``reads``, made under the adapter's rule) [STATE-2.3, PLAN-4]."""
    for r in reads:
        if r.dst != dst:
            continue
        for i in range(r.length):
            got = read_from.get((r.layer, r.dst_offset + i))
            expect(
                got == r.src,
                f"{case.source.describe()} -> {case.target.describe()}, group {group} "
                f"{case.model.layer_groups[group].describe()}: receiver {dst} reads part "
                f"{r.part} of layer {r.layer} (element {r.dst_offset + i}) from source rank "
                f"{got}, but policy {case.policy!r} picks rank {r.src} of its holders "
                "[STATE-2.3, PLAN-4]",
            )


def _layers_of(layout: StageLayout, model: ModelShape, rank: int) -> range:
    from kvspec.topology.ownership import layer_ranges

    return layer_ranges(layout, model.num_layers)[layout.locate(rank).pp_rank]


@check(
    "WINDOW-1",
    "window-bytes",
    "a sliding-window group moves its block-aligned window; full and draft groups beside it "
    "every token",
    needs=("group-bytes",),
    strategy=lambda adapter: _cases(adapter, ("sliding", "full", "draft")),
    covers=("WINDOW-1.1", "WINDOW-1.2"),
)
def _window_bytes(ctx: Context, example: Example) -> None:
    _bytes_per_group(ctx, example)


# LOCAL-1: chunked local attention moves its current chunk -----------------------------------
def _local_case(source: int, target: int, chunk: int) -> dict[str, Any]:
    """A pinned case TP ``source`` -> TP ``target``: own attention, one chunked group of
    ``chunk`` tokens, one window."""
    model = ModelShape(
        4,
        4,
        2,
        groups=(
            group_from_dict({"kind": "chunked", "num_kv_heads": 2, "head_dim": 2, "chunk": chunk}),
            group_from_dict({"kind": "sliding", "num_kv_heads": 4, "head_dim": 2, "window": 6}),
        ),
        layers=(1, 0, 1, 2),
    )
    return TransferCase(StageLayout(source), StageLayout(target), model).to_dict()


def _has_chunked(example: Example) -> bool:
    return any(g.get("kind") == "chunked" for g in example["case"]["model"]["groups"])


@check(
    "LOCAL-1",
    "chunk-bytes",
    "a chunked local-attention group moves its current chunk, block-aligned, never a window "
    "reaching into the previous chunk; full and sliding groups beside it their own tokens",
    needs=("group-bytes",),
    strategy=lambda adapter: _cases(adapter, LOCAL).filter(_has_chunked),
    examples=(
        {  # chunk 10, 25 tokens, blocks of 4: tokens 20-24 (a window of 10 would start at 12)
            "case": _local_case(1, 2, 10),
            "seq_len": 25,
            "block_size": 4,
        },
        {  # chunk 8, 13 tokens, blocks of 16: the chunk 8-12 extended back to token 0
            "case": _local_case(2, 1, 8),
            "seq_len": 13,
            "block_size": 16,
        },
    ),
    covers=("LOCAL-1.1",),
)
def _chunk_bytes(ctx: Context, example: Example) -> None:
    _bytes_per_group(ctx, example)


@st.composite
def _chunk_boundaries(draw: st.DrawFn, adapter: Adapter) -> Example:
    example = draw(_cases(adapter, LOCAL).filter(_has_chunked))
    model = ModelShape.from_dict(example["case"]["model"])
    # A group of kind 'chunked' is a ChunkedLocal.
    chunks = [cast(ChunkedLocal, g).chunk for g in model.layer_groups if g.kind == "chunked"]
    chunk = draw(st.sampled_from(chunks))
    return {**example, "seq_len": chunk * draw(st.integers(1, 3))}


@check(
    "LOCAL-1",
    "chunk-boundary",
    "a request whose length is a multiple of a chunked group's chunk moves nothing of that "
    "group, however the chunk and the blocks line up",
    needs=("group-bytes",),
    strategy=_chunk_boundaries,
    examples=(
        {  # chunk 10, 10 tokens, blocks of 4: the block 8-11 is not the current chunk
            "case": _local_case(1, 4, 10),
            "seq_len": 10,
            "block_size": 4,
        },
        {  # chunk 8, 8 tokens, blocks of 16
            "case": _local_case(4, 1, 8),
            "seq_len": 8,
            "block_size": 16,
        },
    ),
    covers=("LOCAL-1.2",),
)
def _chunk_boundary(ctx: Context, example: Example) -> None:
    case = _case(ctx, example)
    seq_len, block = example["seq_len"], example["block_size"]
    boundary = [  # a group of kind 'chunked' is a ChunkedLocal
        i
        for i, g in enumerate(case.model.layer_groups)
        if g.kind == "chunked" and seq_len and seq_len % cast(ChunkedLocal, g).chunk == 0
    ]
    if not boundary:
        vacuous()
    got = dict(ctx.adapter.group_bytes(case, seq_len, block))
    for key, n in sorted(got.items()):
        group, src, dst = key
        expect(
            group not in boundary or n == 0,
            f"{case.source.describe()} -> {case.target.describe()}, {seq_len} tokens, block "
            f"{block}: group {group} {case.model.layer_groups[group].describe()} is on a chunk "
            f"boundary, so edge {src} -> {dst} moves nothing [LOCAL-1.2]; the implementation "
            f"says {n} bytes",
        )
    _bytes_per_group(ctx, {**example, "seq_len": seq_len})
