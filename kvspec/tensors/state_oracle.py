"""The coordinate-hash oracle for per-request state: every element known from its global
coordinates, like KV [ORACLE-7].

A state layer (Mamba, GDN) holds parts (conv ``x|B|C``, ``Q|K|V``, the temporal ``ssm``),
each split over attention TP by its own units [STATE-1]. An element's hash is the
oracle's start for (seed, request) [ORACLE-1], then absorb of the layer, the part's
index in its group, the global unit and the element's index inside the unit, in that
order; its value is that hash in the part's dtype by ORACLE-2 (the temporal part in
the state's ``ssm_dtype`` when it has one [GROUP-2]). So any rank fills exactly the
units it holds and any receiver checks what it got with no ground truth sent, as for
KV [ORACLE-4]. Comparisons are bit for bit [ORACLE-5].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.core.clause import Clause, must
from kvspec.core.require import require_int
from kvspec.tensors.dtypes import raw_bits
from kvspec.tensors.oracle import _start, _values, absorb
from kvspec.topology.groups import StateGroup
from kvspec.topology.model import ModelShape
from kvspec.topology.state import check_state, part_units

CLAUSES = (
    Clause(
        "ORACLE-7",
        "The state oracle",
        "An element of a per-request state [STATE-1] is known from its global coordinates "
        "like KV: its hash is mix(seed mod P), then absorb of the request value, the layer, "
        "the part's index in its group (Mamba-1: conv 0, ssm 1; Mamba-2: x 0, B 1, C 2, ssm "
        "3; GDN: Q 0, K 1, V 2, ssm 3), the global unit (head, group or channel) and the "
        "element's index inside the unit (0 to width x rows - 1, in the unit's stored order "
        "[STATE-2]), in that order [ORACLE-1]; its value is that hash in the part's dtype by "
        "ORACLE-2 (the temporal part in the state's ssm_dtype when it has one [GROUP-2]). A "
        "rank fills exactly the units it holds, each under its global unit index.",
        obligations=(
            must(
                "every state element is the hash of (seed, request, layer, part index, global "
                "unit, element), in the part's dtype"
            ),
        ),
    ),
)


def state_group(model: ModelShape, group: int) -> StateGroup:
    """Group ``group`` of ``model``, refused unless it is a per-request state [STATE-1]."""
    require_int("group", group, minimum=0)
    if group >= len(model.layer_groups):
        raise ValueError(
            f"group {group} is outside the model's groups 0..{len(model.layer_groups) - 1}"
        )
    found = model.layer_groups[group]
    if found.per_token:
        raise ValueError(f"group {group} is {found.kind}, per-token KV, not a state [STATE-1]")
    return found


def part_dtype(model: ModelShape, group: StateGroup, part: str) -> str:
    """The dtype of a state part: the temporal part ('ssm') in the state's ``ssm_dtype``
    when it has one, every other part in the model's dtype [GROUP-2]."""
    return (part == "ssm" and group.ssm_dtype) or model.dtype


def oracle_state(
    model: ModelShape,
    group: int,
    request_id: str,
    *,
    layers: tuple[int, ...],
    attn_tp: int = 1,
    attn_tp_rank: int = 0,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The oracle's state of ``request_id`` that attention-TP rank ``attn_tp_rank`` of
    ``attn_tp`` holds in ``layers`` of state group ``group``: by part name, a tensor
    ``[len(layers), units held, width * rows]`` in the part's dtype [STATE-1]."""
    state = state_group(model, group)
    check_state(state, attn_tp, name=f"group {group}")
    mine = set(model.group_layers(group))
    outside = [layer for layer in layers if layer not in mine]
    if outside:
        raise ValueError(
            f"layer(s) {outside} are not in group {group} (its layers: "
            f"{sorted(mine)[:8]}{'...' if len(mine) > 8 else ''}) [GROUP-1]"
        )
    device = torch.device(device)
    units = part_units(state, attn_tp, attn_tp_rank)
    start = _start(seed, request_id)
    lay = torch.tensor(layers, dtype=torch.int64, device=device).view(-1, 1, 1)
    out: dict[str, torch.Tensor] = {}
    for index, part in enumerate(state.parts()):
        held = units[part.name]
        unit = torch.arange(held.start, held.stop, dtype=torch.int64, device=device).view(1, -1, 1)
        element = torch.arange(part.unit_elements, dtype=torch.int64, device=device).view(1, 1, -1)
        h = absorb(torch.full((1, 1, 1), start, dtype=torch.int64, device=device), lay)
        h = absorb(h, index)
        h = absorb(absorb(h, unit), element)
        shape = (len(layers), len(held), part.unit_elements)
        out[part.name] = _values(h.expand(shape).contiguous(), part_dtype(model, state, part.name))
    return out


@dataclass(frozen=True)
class StateMismatch:
    """The first element of a state that differs from the oracle [ORACLE-5]."""

    layer: int
    part: str
    unit: int
    element: int
    expected_bits: int
    got_bits: int


def state_mismatches(
    got: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    *,
    layers: tuple[int, ...],
    first_units: dict[str, int],
) -> tuple[int, StateMismatch | None]:
    """How many elements of ``got`` differ from ``expected`` bit for bit, and the first in
    global coordinates (``first_units``: each part's first held unit) [ORACLE-5]."""
    total, first = 0, None
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.shape != want.shape or have.dtype != want.dtype:
            shape = None if have is None else (tuple(have.shape), have.dtype)
            raise ValueError(
                f"state part {name}: expected {tuple(want.shape)} {want.dtype}, got {shape}"
            )
        differ = raw_bits(have.cpu()) != raw_bits(want.cpu())
        count = int(differ.sum())
        if count and first is None:
            li, ui, ei = (int(i) for i in differ.nonzero()[0])
            first = StateMismatch(
                layers[li],
                name,
                first_units[name] + ui,
                ei,
                int(raw_bits(want.cpu())[li, ui, ei]),
                int(raw_bits(have.cpu())[li, ui, ei]),
            )
        total += count
    return total, first
