"""Show the transfer plan between two stage layouts.

Every receiver rank gets each (head, layer) it owns from exactly one sender [PLAN-2];
the table lists the edges, what each rank sends and receives, and the bytes moved
for one request compared with the minimum.

examples:
  kvspec plan --source-tp 8 --target-tp 2 --kv-heads 4
  kvspec plan --source-tp 2 --source-pp 2 --target-tp 4 --kv-heads 8 --layers 61
  kvspec plan --source-tp 4 --target-tp 8 --attention mla --latent-dim 576
  kvspec plan --source-tp 6 --target-tp 3 --kv-heads 12 --policy balanced --json -

A configuration the spec refuses exits with status 2, says which rule it breaks and
lists nearby configurations that are valid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvspec.cli.args import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_PARALLEL,
    int_in,
)
from kvspec.cli.output import STDOUT, add_json_option, check_writable, write_json
from kvspec.tensors.dtypes import DTYPES
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.plan import POLICIES, TransferPlan, check_plannable, plan_transfer
from kvspec.topology.stage import StageLayout

NAME = "plan"
HELP = "show which rank sends which heads and layers to which"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    stages = parser.add_argument_group("stages")
    stages.add_argument(
        "--source-tp",
        type=int_in(1, MAX_PARALLEL),
        required=True,
        metavar="S",
        help="sender TP size",
    )
    stages.add_argument(
        "--target-tp",
        type=int_in(1, MAX_PARALLEL),
        required=True,
        metavar="T",
        help="receiver TP size",
    )
    stages.add_argument(
        "--source-pp",
        type=int_in(1, MAX_PARALLEL),
        default=1,
        metavar="P",
        help="sender PP size (1)",
    )
    stages.add_argument(
        "--target-pp",
        type=int_in(1, MAX_PARALLEL),
        default=1,
        metavar="Q",
        help="receiver PP size (1)",
    )
    stages.add_argument(
        "--source-partition", metavar="N,N,..", help="explicit layers per sender PP rank"
    )
    stages.add_argument(
        "--target-partition", metavar="N,N,..", help="explicit layers per receiver PP rank"
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--kv-heads", type=int_in(1, MAX_HEADS), metavar="H", help="total KV heads (MHA/GQA)"
    )
    model.add_argument(
        "--layers", type=int_in(1, MAX_LAYERS), default=32, metavar="L", help="layers (32)"
    )
    model.add_argument(
        "--head-dim", type=int_in(1, MAX_HEAD_DIM), default=128, metavar="D", help="head dim (128)"
    )
    model.add_argument("--attention", choices=("mha", "mla"), default="mha", help="(mha)")
    model.add_argument(
        "--latent-dim", type=int_in(1, MAX_HEAD_DIM), default=576, help="MLA latent width (576)"
    )
    model.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="(bfloat16)")
    out = parser.add_argument_group("output")
    out.add_argument("--policy", choices=POLICIES, default="lowest", help="replica choice (lowest)")
    out.add_argument(
        "--seq-len",
        type=int_in(1, 1 << 24),
        default=1024,
        metavar="N",
        help="request tokens for byte counts (1024)",
    )
    add_json_option(out, "the plan")


def run(args: argparse.Namespace) -> int:
    try:
        check_writable(args.json)
    except ValueError as error:
        print(f"kvspec plan: refused: {error}", file=sys.stderr)
        return 2
    try:
        plan = plan_transfer(*_stages_and_model(args), policy=args.policy)
    except ValueError as error:
        print(f"kvspec plan: refused: {error}", file=sys.stderr)
        hints = nearby_valid(args)
        if hints:
            print("nearby valid configurations:", file=sys.stderr)
            for hint in hints:
                print(f"  {hint}", file=sys.stderr)
        return 2
    report = plan_report(plan, args.seq_len)
    if args.json != STDOUT:
        print(render(plan, report))
    if args.json:
        write_json(args.json, report)
    return 0


def model_from_args(args: argparse.Namespace) -> ModelShape:
    """The model of the ``--attention --kv-heads --layers --head-dim --latent-dim --dtype``
    options that ``kvspec plan`` and ``python -m sim run`` share [MODEL-1, MODEL-2]."""
    if args.attention == "mla":
        if args.kv_heads not in (None, 1):
            raise ValueError(
                f"--kv-heads {args.kv_heads} with --attention mla: an MLA latent has no head "
                "axis; drop --kv-heads and give --latent-dim [MODEL-2]"
            )
        return ModelShape.mla(args.layers, args.latent_dim, dtype=args.dtype)
    if args.kv_heads is None:
        raise ValueError("--kv-heads is required for --attention mha (e.g. --kv-heads 4)")
    return ModelShape(args.layers, args.kv_heads, args.head_dim, dtype=args.dtype)


def _stages_and_model(args: argparse.Namespace) -> tuple[StageLayout, StageLayout, ModelShape]:
    model = model_from_args(args)
    source = StageLayout(args.source_tp, args.source_pp, _partition(args.source_partition))
    target = StageLayout(args.target_tp, args.target_pp, _partition(args.target_partition))
    return source, target, model


def _partition(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"a layer partition is comma-separated integers, got {text!r}") from None


def nearby_valid(args: argparse.Namespace, *, count: int = 3) -> list[str]:
    """Closest valid alternatives that change one of source TP, target TP or head count."""
    heads = 1 if args.attention == "mla" else args.kv_heads
    if heads is None or heads < 1 or args.source_tp < 1 or args.target_tp < 1:
        return []

    def valid(source_tp: int, target_tp: int, kv_heads: int) -> bool:
        try:
            check_plannable(source_tp, target_tp, kv_heads)
        except ValueError:
            return False
        return True

    def closest(values: range, key: int, ok) -> list[int]:
        return sorted((v for v in values if v != key and ok(v)), key=lambda v: (abs(v - key), v))[
            :count
        ]

    limit = range(1, 2 * max(args.source_tp, args.target_tp, heads, 4) + 1)
    hints = []
    targets = closest(limit, args.target_tp, lambda t: valid(args.source_tp, t, heads))
    if targets:
        tps = " or ".join(map(str, targets))
        hints.append(f"--source-tp {args.source_tp} --target-tp {tps}")
    sources = closest(limit, args.source_tp, lambda s: valid(s, args.target_tp, heads))
    if sources:
        hints.append(f"--source-tp {' or '.join(map(str, sources))} --target-tp {args.target_tp}")
    if args.attention == "mha":
        counts = closest(limit, heads, lambda h: valid(args.source_tp, args.target_tp, h))
        if counts:
            hints.append(
                f"--source-tp {args.source_tp} --target-tp {args.target_tp} "
                f"--kv-heads {' or '.join(map(str, counts))}"
            )
    return hints


def plan_report(plan: TransferPlan, seq_len: int) -> dict[str, Any]:
    """The plan with byte counts for one request, per-rank fan-in/out and totals."""
    report = plan.to_dict()
    report["seq_len"] = seq_len
    for entry, edge in zip(report["edges"], plan.edges, strict=True):
        entry["bytes"] = edge.nbytes(seq_len)
        entry["bytes_receiver_side"] = edge.nbytes(seq_len, slicing="receiver")
    report["source_ranks"] = [
        {
            "rank": r.rank,
            "pp_rank": r.pp_rank,
            "tp_rank": r.tp_rank,
            "heads": [r.heads.start, r.heads.stop],
            "layers": [r.layers.start, r.layers.stop],
            "fan_out": len(plan.targets_of(r.rank)),
            "bytes_out": sum(e.nbytes(seq_len) for e in plan.edges_from(r.rank)),
        }
        for r in stage_ownership(plan.source, plan.model)
    ]
    report["target_ranks"] = [
        {
            "rank": r.rank,
            "pp_rank": r.pp_rank,
            "tp_rank": r.tp_rank,
            "heads": [r.heads.start, r.heads.stop],
            "layers": [r.layers.start, r.layers.stop],
            "fan_in": len(plan.sources_of(r.rank)),
            "bytes_in": sum(e.nbytes(seq_len) for e in plan.edges_to(r.rank)),
        }
        for r in stage_ownership(plan.target, plan.model)
    ]
    minimum = plan.minimum_nbytes(seq_len)
    report["totals"] = {
        "edges": len(plan.edges),
        "bytes_sender_side": plan.nbytes(seq_len),
        "bytes_receiver_side": plan.nbytes(seq_len, slicing="receiver"),
        "bytes_minimum": minimum,
    }
    return report


def render(plan: TransferPlan, report: dict[str, Any]) -> str:
    """The human-readable form of :func:`plan_report`."""
    totals = report["totals"]
    lines = [
        f"transfer plan  {plan.source.describe()} -> {plan.target.describe()}   "
        f"(replica policy: {plan.policy})",
        f"model          {plan.model.describe()}",
        f"request        {report['seq_len']} tokens",
        "",
        f"edges ({totals['edges']}):",
        f"  {'src':>4} {'(pp,tp)':>8}    {'dst':>4} {'(pp,tp)':>8}  {'heads':>7}  {'layers':>7}  "
        f"{'slice':>8}  {'bytes':>10}",
    ]
    coords_src = {r["rank"]: (r["pp_rank"], r["tp_rank"]) for r in report["source_ranks"]}
    coords_dst = {r["rank"]: (r["pp_rank"], r["tp_rank"]) for r in report["target_ranks"]}
    for e in report["edges"]:
        piece = "whole" if e["num_slices"] == 1 else f"{e['offset_in_shard']} of {e['num_slices']}"
        lines.append(
            f"  {e['src']:>4} {_coords(coords_src[e['src']]):>8} -> {e['dst']:>4} "
            f"{_coords(coords_dst[e['dst']]):>8}  {_span(e['heads']):>7}  {_span(e['layers']):>7}  "
            f"{piece:>8}  {human_bytes(e['bytes']):>10}"
        )
    lines += ["", "source ranks:", _rank_header("fan-out", "bytes out")]
    for r in report["source_ranks"]:
        lines.append(_rank_line(r, r["fan_out"], r["bytes_out"]))
    idle = [r["rank"] for r in report["source_ranks"] if r["fan_out"] == 0]
    if idle:
        lines.append(
            f"  idle senders {idle}: every head they hold is sent by a replica (policy "
            f"{plan.policy})"
        )
    lines += ["", "target ranks:", _rank_header("fan-in", "bytes in")]
    for r in report["target_ranks"]:
        lines.append(_rank_line(r, r["fan_in"], r["bytes_in"]))
    minimum = totals["bytes_minimum"]
    lines += [
        "",
        "totals:",
        f"  moved, sender-side slicing    {human_bytes(totals['bytes_sender_side']):>10}  "
        f"({_ratio(totals['bytes_sender_side'], minimum)} the minimum)",
        f"  moved, receiver-side slicing  {human_bytes(totals['bytes_receiver_side']):>10}  "
        f"({_ratio(totals['bytes_receiver_side'], minimum)} the minimum)",
        f"  minimum (each receiver gets what it owns, once)  {human_bytes(minimum)}",
    ]
    return "\n".join(lines)


def _rank_header(fan: str, nbytes: str) -> str:
    return f"  {'rank':>4} {'(pp,tp)':>8}  {'heads':>7}  {'layers':>7}  {fan:>7}  {nbytes:>10}"


def _rank_line(r: dict[str, Any], fan: int, nbytes: int) -> str:
    return (
        f"  {r['rank']:>4} {_coords((r['pp_rank'], r['tp_rank'])):>8}  {_span(r['heads']):>7}  "
        f"{_span(r['layers']):>7}  {fan:>7}  {human_bytes(nbytes):>10}"
    )


def _coords(pp_tp: tuple[int, int]) -> str:
    return f"({pp_tp[0]},{pp_tp[1]})"


def _span(bounds: list[int]) -> str:
    start, stop = bounds
    return str(start) if stop - start == 1 else f"{start}-{stop - 1}"


def _ratio(value: int, minimum: int) -> str:
    return "1.00x" if minimum == 0 else f"{value / minimum:.2f}x"


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ``8.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
