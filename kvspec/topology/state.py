"""Per-request state over TP: which rank holds which units of each part, and where a
receiver reads each of its elements [STATE-1, STATE-2].

A state layer (Mamba, GDN) is one fixed-size state per request, not per token. Each
part is split by its own unit (heads, groups, channels) with the head rules
[HEAD-1, HEAD-2]: a Mamba-2 ``x|B|C`` conv state is x by heads but B and C by groups,
so with one group every rank holds a replica of B and C while x is split (vLLM 0.33.0
``mamba_mixer2.py``; hybrids.md §2). A flat split of the concatenated conv state, or
offsets scaled by the TP ratio for every part, misreads a replicated part: "one rank
read[s] C as B and both ranks read temporal state as C" (vllm#55208; hybrids.md §3).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import itemsize
from kvspec.topology.groups import StateGroup, StatePart
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import check_heads, head_replicas, layer_ranges, owned_heads
from kvspec.topology.plan import ReplicaChoice, ReplicaRule, choose_replica, replica_rule
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "STATE-1",
        "Each state part is split by its own units",
        "A state group's parts are split over a stage's attention-TP ranks each by its own "
        "unit count, with HEAD-1 and HEAD-2: Mamba-2 x and the temporal state by heads, B and "
        "C by groups (with fewer groups than ranks each rank holds a replica of the group of "
        "its heads), GDN Q and K by key heads, V and the temporal state by value heads, "
        "Mamba-1 conv and temporal state by channel [vLLM 0.33.0 mamba_utils, mamba_mixer2]. "
        "The state is per request: every context-parallel rank holds the same state [vLLM "
        "0.33.0 kv_cache_interface: 'Mamba state is replicated across DCP/PCP ranks']. A part "
        "whose units neither split nor replicate evenly over attention TP is refused, naming "
        "the group and the part.",
        obligations=(
            must("attention-TP rank r holds HEAD-1/HEAD-2's units of each part's own unit count"),
            must("with fewer groups than ranks, B and C are replicated: the group of the heads"),
            refuses("a state part whose units neither split nor replicate over attention TP"),
        ),
    ),
    Clause(
        "STATE-2",
        "A receiver reads each state part at its own offset",
        "A rank stores a state layer as its parts in order, each as its units ascending, each "
        "unit width x rows contiguous elements (the dim-first DS conv layout vLLM's "
        "heterogeneous-TP transfer requires [vLLM 0.33.0 nixl base_worker]). Every element a "
        "receiver holds is read once, from a sender holding the same (layer, part, unit), at "
        "that unit's offset in the sender's own copy of the part: a replicated part is read "
        "whole, never at an offset scaled by the TP ratio [vllm#55208]. The sender of a "
        "replicated unit is chosen by the plan's policy [PLAN-4] among the source's "
        "context-parallel rank 0 holders of the request's DP group.",
        obligations=(
            must("every element of a receiver's state is read once, from the same element"),
            must("a part replicated on either side is read at the unit's own offset in the sender"),
            must(
                "a replicated unit is read from the holder the plan's policy picks, a declared "
                "(field) rule's included [PLAN-4]"
            ),
        ),
    ),
)


@dataclass(frozen=True)
class StateRead:
    """One contiguous read of a state layer: ``length`` elements from ``src``'s offset to
    ``dst``'s [STATE-2]."""

    src: int
    dst: int
    layer: int
    part: str
    src_offset: int
    dst_offset: int
    length: int


def check_state(group: StateGroup, attn_tp: int, *, name: str = "state") -> None:
    """Refuse a state whose parts cannot be split or replicated over ``attn_tp`` [STATE-1]."""
    for part in group.parts():
        try:
            check_heads(part.units, attn_tp)
        except ValueError as error:
            raise ValueError(
                f"{name} {group.kind}: part {part.name} of {part.units} units over attention-TP "
                f"{attn_tp}: {error} [STATE-1]"
            ) from None


def part_units(group: StateGroup, attn_tp: int, attn_tp_rank: int) -> dict[str, range]:
    """Each part's units that attention-TP rank ``attn_tp_rank`` holds [STATE-1]."""
    check_state(group, attn_tp)
    return {p.name: owned_heads(p.units, attn_tp, attn_tp_rank) for p in group.parts()}


def part_offsets(group: StateGroup, attn_tp: int) -> dict[str, int]:
    """Where each part starts in one rank's state layer, in elements [STATE-2]."""
    offsets, at = {}, 0
    for part in group.parts():
        offsets[part.name] = at
        at += len(owned_heads(part.units, attn_tp, 0)) * part.unit_elements
    return offsets


def state_elements(group: StateGroup, attn_tp: int) -> int:
    """Elements of one rank's state layer [STATE-2]."""
    return sum(len(owned_heads(p.units, attn_tp, 0)) * p.unit_elements for p in group.parts())


def part_itemsize(group: StateGroup, part: str, model: ModelShape) -> int:
    """Bytes per element of a state part: the temporal part ('ssm') in the state's
    ssm_dtype when it has one, every other part in the model's dtype [GROUP-2]."""
    return itemsize((part == "ssm" and group.ssm_dtype) or model.dtype)


def _holders(
    layout: StageLayout, dp_rank: int, layers: tuple[int, ...], num_layers: int
) -> list[tuple[int, int, tuple[int, ...]]]:
    """(rank, attn_tp_rank, group layers it holds) of every rank of the request's DP group
    whose PP stage holds a layer of the group."""
    stages = layer_ranges(layout, num_layers)
    found = []
    for rank in layout.ranks():
        where = layout.locate(rank)
        held = tuple(i for i in layers if i in stages[where.pp_rank])
        if where.dp_rank == dp_rank and held:
            found.append((rank, where.attn_tp_rank, held))
    return found


def plan_state_reads(
    source: StageLayout,
    target: StageLayout,
    model: ModelShape,
    group_index: int,
    *,
    policy: str = "lowest",
    rule: ReplicaRule | None = None,
    source_dp: int = 0,
    target_dp: int = 0,
) -> tuple[StateRead, ...]:
    """Every read that moves state group ``group_index`` of one request [STATE-1, STATE-2].

    A replicated unit's sender is chosen as a replicated head's is [PLAN-4]: by ``policy``,
    one of kvspec's, or by ``rule`` for a policy of one's own (an engine's field rule),
    shown the unit's holders as TP ranks of the source's context-parallel rank 0 of the
    request's DP group."""
    choose = replica_rule(policy, rule)
    group = model.layer_groups[group_index]
    if group.per_token:
        raise ValueError(f"group {group_index} is {group.kind}, per-token KV, not a state")
    state: StateGroup = group
    layers = model.group_layers(group_index)
    check_state(state, source.attn_tp, name=f"source group {group_index}")
    check_state(state, target.attn_tp, name=f"target group {group_index}")
    src_offsets, dst_offsets = (
        part_offsets(state, source.attn_tp),
        part_offsets(state, target.attn_tp),
    )
    src_stages = layer_ranges(source, model.num_layers)
    senders = {
        (source.locate(r).pp_rank, a): r
        for r, a, _ in _holders(source, source_dp, layers, model.num_layers)
        if source.locate(r).cp_rank == 0
    }
    base = source_dp * source.cp * source.attn_tp  # TP rank of attention-TP rank 0, CP rank 0
    consumers: dict[tuple[int, str, int], int] = defaultdict(int)
    reads: list[StateRead] = []
    for dst, attn_rank, held in _holders(target, target_dp, layers, model.num_layers):
        dst_tp_rank = target.locate(dst).tp_rank
        for pp, stage in enumerate(src_stages):
            stage_layers = [layer for layer in held if layer in stage]
            if not stage_layers:
                continue
            for part in state.parts():
                units = owned_heads(part.units, target.attn_tp, attn_rank)
                chosen = []
                for unit in units:  # receivers ask in ascending rank order [PLAN-4]
                    holders = head_replicas(part.units, source.attn_tp, unit)
                    index = consumers[(pp, part.name, unit)]
                    consumers[(pp, part.name, unit)] += 1
                    choice = ReplicaChoice(
                        head=unit,
                        replicas=range(base + holders.start, base + holders.stop),
                        consumer_index=index,
                        receiver_rank=dst,
                        receiver_tp_rank=dst_tp_rank,
                        source_pp_rank=pp,
                        source_attn_tp=source.attn_tp,
                        target_attn_tp=target.attn_tp,
                    )
                    pick = choose_replica(policy, choose, choice) - base
                    chosen.append((unit, senders[(pp, pick)], pick))
                runs = _runs(chosen, part, units, source, src_offsets, dst_offsets)
                for layer in stage_layers:  # every layer of a stage reads the same runs
                    reads.extend(
                        StateRead(src, dst, layer, part.name, src_at, dst_at, length)
                        for src, src_at, dst_at, length in runs
                    )
    return tuple(reads)


def _runs(
    chosen: list[tuple[int, int, int]],
    part: StatePart,
    units: range,
    source: StageLayout,
    src_offsets: dict[str, int],
    dst_offsets: dict[str, int],
) -> list[tuple[int, int, int, int]]:
    """(sender, source offset, target offset, elements) of a receiver's reads of one part in
    any layer: consecutive units from one sender, merged into one read each [STATE-2]."""
    size = part.unit_elements
    firsts: dict[int, int] = {}  # a sender's first unit, by its attention-TP rank
    runs: list[list[int]] = []
    for unit, src, attn_rank in chosen:
        first = firsts.get(attn_rank)
        if first is None:
            first = firsts[attn_rank] = owned_heads(part.units, source.attn_tp, attn_rank).start
        src_at = src_offsets[part.name] + (unit - first) * size
        dst_at = dst_offsets[part.name] + (unit - units.start) * size
        last = runs[-1] if runs else None
        if (
            last is not None
            and last[0] == src
            and last[1] + last[3] == src_at
            and last[2] + last[3] == dst_at
        ):
            last[3] += size
        else:
            runs.append([src, src_at, dst_at, size])
    return [(src, src_at, dst_at, length) for src, src_at, dst_at, length in runs]
