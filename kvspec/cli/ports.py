"""Show the ports a deployment binds, and whether any two collide.

Every (purpose, replica, rank, stage) gets base + offset + replica*1024 + rank*16 +
stage by default [PORT-1]; the table lists each endpoint's KV-transfer, forwarding and
orchestrator port, and the verdict proves them distinct or names each colliding pair
[PORT-3]. Stages are numbered in the order given unless a spec sets id=.

examples:
  kvspec ports --base 50000 --stage tp=2,replicas=2 --stage tp=1,replicas=2
  kvspec ports --stage tp=4,pp=2 --stage tp=2 --stage tp=1
  kvspec ports --stage tp=8,dp=2 --dp-stride 4096 --json -
  kvspec ports --stage tp=8 --stage tp=8 --stage tp=8 --stage tp=8 --stage tp=8

A stage SPEC is comma-separated key=value with keys tp, pp, replicas, dp and id
(defaults 1, 1, 1, 1 and its position). A deployment whose ports collide or leave
the collision-free domain prints its map, then exits with status 2 and every reason.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

from kvspec.console.args import MAX_PARALLEL, MAX_PORT, int_in, quote
from kvspec.console.output import STDOUT, add_json_option, check_writable, write_json
from kvspec.naming.ports import (
    PURPOSES,
    DeployedStage,
    Deployment,
    PortMap,
    PortScheme,
    port_map,
)
from kvspec.topology.stage import StageLayout

NAME = "ports"
HELP = "show the ports of a deployment and prove they are distinct"

_STAGE_KEYS = ("tp", "pp", "replicas", "dp", "id")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stage",
        action="append",
        required=True,
        metavar="SPEC",
        help="one stage, e.g. tp=2,pp=2,replicas=2 (repeat per stage, in stage-id order)",
    )
    parser.add_argument("--base", type=int_in(1, MAX_PORT), default=50000, help="base port (50000)")
    scheme = parser.add_argument_group("scheme (defaults are the compatible ones)")
    defaults = PortScheme()
    for purpose in PURPOSES:
        scheme.add_argument(
            f"--{purpose}-offset",
            type=int_in(0, MAX_PORT),
            default=defaults.offset(purpose),
            metavar="N",
            help=f"offset of {purpose} ports ({defaults.offset(purpose)})",
        )
    scheme.add_argument(
        "--rank-stride",
        type=int_in(1, MAX_PORT),
        default=defaults.rank_stride,
        metavar="N",
        help=f"port step between ranks; stage ids must stay below it ({defaults.rank_stride})",
    )
    scheme.add_argument(
        "--replica-stride",
        type=int_in(1, MAX_PORT),
        default=defaults.replica_stride,
        metavar="N",
        help=f"port step between replicas ({defaults.replica_stride})",
    )
    scheme.add_argument(
        "--dp-stride",
        type=int_in(1, MAX_PORT),
        default=None,
        metavar="N",
        help="port step between data-parallel ranks (none: dp must be 1)",
    )
    add_json_option(parser, "the port map")


def run(args: argparse.Namespace) -> int:
    try:
        check_writable(args.json)
        deployment = Deployment(args.base, tuple(_stage(i, s) for i, s in enumerate(args.stage)))
        scheme = PortScheme(
            kv_offset=args.kv_offset,
            forward_offset=args.forward_offset,
            orchestrator_offset=args.orchestrator_offset,
            rank_stride=args.rank_stride,
            replica_stride=args.replica_stride,
            dp_stride=args.dp_stride,
        )
    except ValueError as error:
        print(f"kvspec ports: refused: {error}", file=sys.stderr)
        return 2
    total = sum(s.layout.world_size * s.replicas * s.dp * len(PURPOSES) for s in deployment.stages)
    if total > MAX_PORT:
        print(
            f"kvspec ports: refused: the deployment needs {total} ports; only 1..{MAX_PORT} exist",
            file=sys.stderr,
        )
        return 2
    ports = port_map(deployment, scheme=scheme)
    if args.json != STDOUT:
        print(render(ports))
    if args.json:
        write_json(args.json, report(ports))
    if not ports.ok:
        print(f"kvspec ports: refused: {ports.verdict()}", file=sys.stderr)
        return 2
    return 0


def _stage(position: int, spec: str) -> DeployedStage:
    values: dict[str, int] = {}
    for part in spec.split(",")[: len(_STAGE_KEYS) + 1]:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _STAGE_KEYS or key in values:
            raise ValueError(
                f"stage spec {quote(spec)}: expected comma-separated key=value with keys "
                f"{', '.join(_STAGE_KEYS)}, each once; got {quote(part)}"
            )
        high = MAX_PORT if key == "id" else MAX_PARALLEL
        try:
            values[key] = int_in(0 if key == "id" else 1, high)(value.strip())
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"stage spec {quote(spec)}: {key} {error}") from None
    layout = StageLayout(values.get("tp", 1), values.get("pp", 1))
    return DeployedStage(
        values.get("id", position), layout, values.get("replicas", 1), values.get("dp", 1)
    )


def report(ports: PortMap) -> dict[str, Any]:
    """The port map as plain data."""
    return {
        "base": ports.deployment.base,
        "scheme": asdict(ports.scheme),
        "stages": [
            {
                "id": s.stage_id,
                "tp": s.layout.tp,
                "pp": s.layout.pp,
                "replicas": s.replicas,
                "dp": s.dp,
            }
            for s in ports.deployment.stages
        ],
        "endpoints": [asdict(e) for e in ports.endpoints],
        "ok": ports.ok,
        "problems": list(ports.problems),
        "collisions": [[asdict(a), asdict(b)] for a, b in ports.collisions],
    }


def render(ports: PortMap) -> str:
    """One row per (stage, dp rank, replica, rank) with its port for each purpose."""
    deployment = ports.deployment
    show_dp = any(s.dp > 1 for s in deployment.stages)
    stages = ", ".join(s.describe() for s in deployment.stages)
    colliding = {e.port for pair in ports.collisions for e in pair}
    lines = [
        f"port map  base {deployment.base}: {stages}",
        f"scheme    {ports.scheme.describe()}",
        "",
        f"  {'stage':>5}  {'dp':>3}  {'replica':>7}  {'rank':>4}  {'(pp,tp)':>7}  "
        f"{'kv':>6}  {'forward':>7}  {'orchestrator':>12}"
        if show_dp
        else f"  {'stage':>5}  {'replica':>7}  {'rank':>4}  {'(pp,tp)':>7}  "
        f"{'kv':>6}  {'forward':>7}  {'orchestrator':>12}",
    ]
    rows: dict[tuple[int, int, int, int], dict[str, int]] = {}
    for e in ports.endpoints:
        rows.setdefault((e.stage, e.dp_rank, e.replica, e.rank), {})[e.purpose] = e.port
    layouts = {s.stage_id: s.layout for s in deployment.stages}

    def cell(row: dict[str, int], purpose: str, width: int) -> str:
        if purpose not in row:
            return f"{'-':>{width}}"
        mark = "*" if row[purpose] in colliding else ""
        return f"{str(row[purpose]) + mark:>{width}}"

    for (stage, dp_rank, replica, rank), row in rows.items():
        pp_rank, tp_rank = layouts[stage].coords(rank)
        dp = f"{dp_rank:>3}  " if show_dp else ""
        lines.append(
            f"  {stage:>5}  {dp}{replica:>7}  {rank:>4}  {f'({pp_rank},{tp_rank})':>7}  "
            f"{cell(row, 'kv', 6)}  {cell(row, 'forward', 7)}  {cell(row, 'orchestrator', 12)}"
        )
    lines.append("")
    if ports.ok:
        lines.append(f"verdict   {ports.verdict()}")
    else:
        lines.append("verdict   refused; * marks a port two endpoints share (reasons below)")
    return "\n".join(lines)
