"""The ``state-layouts`` vectors: the byte offset of every element of a state page, and
the contiguous runs of a part's units, in each state layout preset
[SLAYOUT-1, SLAYOUT-2].
"""

from __future__ import annotations

import random
from typing import Any, cast

from kvspec.conformance.adapter import FullAdapter, provided_capabilities
from kvspec.conformance.vectors.family import Case, Family, Tensors
from kvspec.conformance.vectors.sampling import small_hybrids
from kvspec.memory.presets import STATE_PRESETS
from kvspec.memory.state_cache import element_offset, state_page, state_runs
from kvspec.topology.groups import StateGroup
from kvspec.topology.model import ModelShape


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i, model in enumerate(small_hybrids(rng, 12)):
        tp = rng.choice([1, 2, 4])
        rank = rng.randrange(tp)
        layout = sorted(STATE_PRESETS)[i % len(STATE_PRESETS)]
        own = state_page(layout, model, 2, attn_tp=tp, attn_tp_rank=rank)
        page_size = rng.choice([None, -(-own.page_size // 16) * 16 + 16 * rng.randint(0, 2)])
        page = state_page(layout, model, 2, attn_tp=tp, attn_tp_rank=rank, page_size=page_size)
        state = cast(StateGroup, model.layer_groups[2])  # these hybrids' state
        offsets = [
            [
                block,
                part.name,
                unit,
                e,
                element_offset(page, block=block, part=part.name, unit=unit, element=e),
            ]
            for block in (0, 1)
            for part in state.parts()
            for unit in page.units[part.name]
            for e in range(part.unit_elements)
        ]
        where: dict[str, Any] = {"attn_tp": tp, "attn_tp_rank": rank, "page_size": page_size}
        runs = [
            {
                "part": part.name,
                "units": [page.units[part.name].start, page.units[part.name].stop],
                "runs": [
                    list(r)
                    for r in state_runs(
                        layout,
                        model,
                        2,
                        **where,
                        block=1,
                        part=part.name,
                        units=page.units[part.name],
                    )
                ],
            }
            for part in state.parts()
        ]
        cases.append(
            {
                "id": f"state-layouts-{i:03d}",
                "clauses": ["SLAYOUT-1", "SLAYOUT-2"],
                "layout": layout,
                "model": model.to_dict(),
                "group": 2,
                **where,
                "page_bytes": page.page_size,
                "offsets": offsets,
                "runs": runs,
            }
        )
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    model = ModelShape.from_dict(case["model"])
    where = {k: case[k] for k in ("attn_tp", "attn_tp_rank", "page_size")}
    for block, part, unit, element, offset in case["offsets"]:
        got = adapter.state_offset(
            case["layout"],
            model,
            case["group"],
            **where,
            block=block,
            part=part,
            unit=unit,
            element=element,
        )
        if got != offset:
            where_text = f"block {block}, part {part}, unit {unit}, element {element}"
            return f"{where_text}: byte {got}, expected {offset}"
    if "state-runs" not in provided_capabilities(adapter):
        return None
    for entry in case["runs"]:
        got_runs = [
            list(r)
            for r in adapter.state_runs(
                case["layout"],
                model,
                case["group"],
                **where,
                block=1,
                part=entry["part"],
                units=range(*entry["units"]),
            )
        ]
        if got_runs != entry["runs"]:
            return f"part {entry['part']}: runs {got_runs[:4]}, expected {entry['runs'][:4]}"
    return None


FAMILY = Family("state-layouts", ("state-layout",), export, check)
