"""The ``ports`` vectors: KV ports of stages, ranks and replicas, of ranks in
attention-DP groups, and the ones refused [PORT-1, PORT-2, STAGE-2].
"""

from __future__ import annotations

import random
from typing import Any

from kvspec.conformance.adapter import FullAdapter, provided_capabilities
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.naming.ports import PortScheme, port, rank_port
from kvspec.topology.stage import StageLayout


def export(rng: random.Random) -> tuple[list[Case], Tensors]:
    cases = []
    for i in range(24):
        args: dict[str, Any] = {
            "base": rng.choice([20000, 50000, 65000]),
            "stage": rng.randint(0, 18),
            "rank": rng.randint(0, 70),
            "replica": rng.randint(0, 3),
        }
        try:
            number: int | None = port("kv", **args)
        except ValueError:
            number = None
        cases.append(
            {"id": f"port-{i:03d}", "clauses": ["PORT-1", "PORT-2"], "args": args, "port": number}
        )
    for i in range(12):  # ranks of stages with attention-DP groups [PORT-1, STAGE-2]
        layout = StageLayout(rng.choice([4, 8]), rng.randint(1, 2), dp=rng.choice([2, 4]))
        scheme = PortScheme(dp_stride=rng.choice([None, 4096]))
        args = {
            "base": rng.choice([20000, 50000]),
            "stage": rng.randint(0, 15),
            "rank": rng.randrange(layout.world_size),
            "replica": rng.randint(0, 1),
        }
        try:
            number = rank_port("kv", layout=layout, scheme=scheme, **args)
        except ValueError:
            number = None
        cases.append(
            {
                "id": f"port-dp-{i:03d}",
                "clauses": ["PORT-1", "PORT-2", "STAGE-2"],
                "args": args,
                "layout": layout.to_dict(),
                "dp_stride": scheme.dp_stride,
                "port": number,
            }
        )
    return cases, {}


def check(adapter: FullAdapter, case: Case, tensors: Tensors) -> str | None:
    try:
        if "layout" in case:
            if "dp-ports" not in provided_capabilities(adapter):
                raise NotApplicable("needs dp-ports")
            got = adapter.stage_port(
                layout=StageLayout.from_dict(case["layout"]),
                scheme=PortScheme(dp_stride=case["dp_stride"]),
                **case["args"],
            )
        else:
            got = adapter.kv_port(**case["args"])
    except NotApplicable:
        raise
    except Exception as error:
        return None if case["port"] is None else f"refused {case['args']}: {error!r}"
    if got != case["port"]:
        return f"KV port of {case['args']} is {got}, expected {case['port']} (null = refuse)"
    return None


FAMILY = Family("ports", ("ports",), export, check)
