"""Show the transfer plan between two stage layouts.

Every receiver rank gets each (head, layer, token) it owns from exactly one sender
[PLAN-2]; the table lists the edges, what each rank sends and receives, and the bytes
moved for one request compared with the minimum. Any two layouts that each hold the
model are planned, by intersecting what the ranks hold [PLAN-1, PLAN-6]: TP sizes that
do not divide, context parallelism (token shards) on either side, attention-DP groups.

examples:
  kvspec plan --source-tp 8 --target-tp 2 --kv-heads 4
  kvspec plan --source-tp 2 --source-pp 2 --target-tp 4 --kv-heads 8 --layers 61
  kvspec plan --source-tp 4 --target-tp 8 --attention mla --latent-dim 576
  kvspec plan --source-tp 6 --target-tp 3 --kv-heads 12 --policy balanced --json -
  kvspec plan --source-tp 4 --target-tp 6 --kv-heads 12
  kvspec plan --source-tp 1 --target-tp 4 --model qwen3-next-80b-a3b
  kvspec plan --source-tp 8 --target-tp 8 --target-cp 2 --cp-rule interleave:1 --kv-heads 4
  kvspec plan --source-tp 8 --source-dp 2 --target-tp 4 --target-dcp 2 --kv-heads 2 \\
      --cp-rule interleave:16 --source-dp-rank 1

A stage of tp ranks per pipeline stage may hold dp attention-DP groups of cp
context-parallel groups (rank = pp_rank*tp + (dp_rank*cp + cp_rank)*attn_tp +
attn_tp_rank [STAGE-2]); --*-dcp shares each head's tokens among the ranks that
replicate it [CP-3]; --cp-rule names how tokens are split [CP-1]: contiguous[:B],
interleave:I, round_robin_blocks:B, zigzag. A plan with token shards is for one
request of --seq-len tokens; with attention DP, for the DP ranks the router chose.

--model NAME plans a named hybrid preset (shapes only, each cited in
kvspec/topology/model_presets.py) group by group and prints the bytes each layer group
moves [GROUP-3]; sliding windows and chunks are aligned to the target's block size, and
a plan whose target needs tokens the source evicted under its own is refused [WINDOW-2].

A configuration the spec refuses exits with status 2, says which rule it breaks and
lists nearby configurations that are valid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvspec.console.args import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_PARALLEL,
    int_in,
)
from kvspec.console.nearby import Knob, nearby, print_hints
from kvspec.console.output import STDOUT, add_json_option, check_writable, write_json
from kvspec.console.stage_options import (
    SIDES,
    add_parallel_arguments,
    groups_from_args,
    is_sized,
    model_from_args,
    parallel_knobs,
)
from kvspec.console.units import human_bytes
from kvspec.core.dtype_names import DTYPE_NAMES
from kvspec.topology.group_plan import GroupPlan, plan_groups
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS
from kvspec.topology.ownership import stage_ownership
from kvspec.topology.plan import POLICIES, TransferPlan, check_layouts, plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

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
    add_parallel_arguments(parser.add_argument_group("attention groups and token shards"))
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        choices=tuple(PRESETS),
        metavar="NAME",
        help=f"a named hybrid model preset instead of the options below ({', '.join(PRESETS)})",
    )
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
    model.add_argument("--dtype", choices=DTYPE_NAMES, default="bfloat16", help="(bfloat16)")
    out = parser.add_argument_group("output")
    out.add_argument("--policy", choices=POLICIES, default="lowest", help="replica choice (lowest)")
    out.add_argument(
        "--seq-len",
        type=int_in(1, 1 << 24),
        default=1024,
        metavar="N",
        help="request tokens for byte counts and token shards (1024)",
    )
    for side in SIDES:
        out.add_argument(
            f"--{side}-block-size",
            type=int_in(1, 1 << 16),
            default=16,
            metavar="B",
            help=f"the {side}'s cache block size, which its token rule must fit (16) [CP-2]",
        )
    add_json_option(out, "the plan")


def run(args: argparse.Namespace) -> int:
    try:
        check_writable(args.json)
    except ValueError as error:
        print(f"kvspec plan: refused: {error}", file=sys.stderr)
        return 2
    try:
        source, target, model = _stages_and_model(args)
        for side, layout in zip(SIDES, (source, target), strict=True):
            layout.check_block_size(getattr(args, f"{side}_block_size"))
        if model.hybrid:
            return _run_groups(args, source, target, model)
        plan = plan_transfer(
            source,
            target,
            model,
            policy=args.policy,
            seq_len=args.seq_len,
            source_dp=args.source_dp_rank,
            target_dp=args.target_dp_rank,
        )
    except ValueError as error:
        print(f"kvspec plan: refused: {error}", file=sys.stderr)
        print_hints(nearby_valid(args), sys.stderr)
        return 2
    report = plan_report(plan, args.seq_len)
    if args.json != STDOUT:
        print(render(plan, report))
    if args.json:
        write_json(args.json, report)
    return 0


def _run_groups(
    args: argparse.Namespace, source: StageLayout, target: StageLayout, model: ModelShape
) -> int:
    """``kvspec plan --model NAME``: the plan of every layer group and its bytes [GROUP-3]."""
    plan = plan_groups(
        source,
        target,
        model,
        seq_len=args.seq_len,
        source_block_size=args.source_block_size,
        target_block_size=args.target_block_size,
        policy=args.policy,
        source_dp=args.source_dp_rank,
        target_dp=args.target_dp_rank,
    )
    if args.json != STDOUT:
        print(render_groups(plan, args.model))
    if args.json:
        write_json(args.json, plan.to_dict())
    return 0


def render_groups(plan: GroupPlan, name: str) -> str:
    """The bytes each layer group of a hybrid model moves, one line per group [GROUP-3]."""
    lines = [
        f"{name}: {plan.source.describe()} -> {plan.target.describe()}, "
        f"{plan.seq_len} tokens, policy {plan.policy}"
        + (
            f", blocks {plan.sender_block_size} -> {plan.receiver_block_size} tokens"
            if plan.sender_block_size != plan.receiver_block_size
            else ""
        ),
        f"{'group':>5}  {'kind':<8} {'layers':>6} {'edges':>5} {'bytes':>12}  facts",
    ]
    totals = plan.bytes_by_group()
    for index, group in enumerate(plan.model.layer_groups):
        edges = sum(1 for e in plan.edges if e.group == index)
        layers = len(plan.model.group_layers(index))
        lines.append(
            f"{index:>5}  {group.kind:<8} {layers:>6} {edges:>5} "
            f"{human_bytes(totals[index]):>12}  {group.describe()}"
        )
    lines.append(f"total {human_bytes(plan.nbytes())} ({plan.nbytes()} B)")
    return "\n".join(lines)


def _stages_and_model(args: argparse.Namespace) -> tuple[StageLayout, StageLayout, ModelShape]:
    model = model_from_args(args)
    source = StageLayout(
        args.source_tp,
        args.source_pp,
        _partition(args.source_partition),
        **groups_from_args(args, "source"),
    )
    target = StageLayout(
        args.target_tp,
        args.target_pp,
        _partition(args.target_partition),
        **groups_from_args(args, "target"),
    )
    return source, target, model


def _partition(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"a layer partition is comma-separated integers, got {text!r}") from None


def check_args(args: argparse.Namespace) -> None:
    """Every refusal ``kvspec plan`` can meet, without making the plan: the layouts, the
    model on both sides, the rules against the request and the caches, the DP ranks
    [PLAN-1, STAGE-2, CP-1..3, DP-1]."""
    source, target, model = _stages_and_model(args)
    check_layouts(source, target, model)
    for side, layout in zip(SIDES, (source, target), strict=True):
        layout.check_block_size(getattr(args, f"{side}_block_size"))
        if layout.token_shards > 1:
            layout.rule.check_request(layout.token_shards, args.seq_len)
        rank = getattr(args, f"{side}_dp_rank")
        if rank >= layout.dp:
            raise ValueError(f"{side} DP rank {rank} is out of range [DP-1]")


def nearby_valid(args: argparse.Namespace, *, count: int = 3) -> list[str]:
    """Closest valid alternatives that change one thing: source TP, target TP or the head
    count, and where they are given, a side's cp, dcp, dp, rule size, DP rank or the
    request length."""
    if not is_sized(args):
        return []
    blocks = {side: getattr(args, f"{side}_block_size") for side in SIDES}
    knobs = parallel_knobs(args, block_sizes=blocks)
    if "zigzag" in (args.cp_rule, args.source_cp_rule, args.target_cp_rule):
        lengths = range(1, 4 * MAX_PARALLEL)
        knobs.append(Knob("seq_len", lengths, lambda found: f"--seq-len {found[0]} or more"))
    return nearby(args, check_args, knobs, count=count)


def _rank_entry(plan: TransferPlan, side: str, rank: int) -> dict[str, Any]:
    """One rank's row of the report: its coordinates and what it holds of the request."""
    layout = plan.source if side == "source" else plan.target
    owner = plan.owner(side, rank)
    entry: dict[str, Any] = {
        "rank": rank,
        "pp_rank": owner.pp_rank,
        "tp_rank": owner.tp_rank,
        "heads": [owner.heads.start, owner.heads.stop],
        "layers": [owner.layers.start, owner.layers.stop],
    }
    if not layout.first_release:
        where = layout.locate(rank)
        entry.update(dp_rank=where.dp_rank, cp_rank=where.cp_rank, dcp_rank=where.dcp_rank)
        entry["active"] = owner.active
    if plan.seq_len is not None:
        entry["tokens"] = None if owner.tokens is None else owner.tokens.to_list()
    return entry


def plan_report(plan: TransferPlan, seq_len: int) -> dict[str, Any]:
    """The plan with byte counts for one request, per-rank fan-in/out and totals."""
    report = plan.to_dict()
    report["seq_len"] = seq_len
    for entry, edge in zip(report["edges"], plan.edges, strict=True):
        entry["bytes"] = edge.nbytes(seq_len)
        entry["bytes_receiver_side"] = edge.nbytes(seq_len, slicing="receiver")
    stage_ownership(plan.source, plan.model)  # refuses a layout that cannot hold the model
    report["source_ranks"] = [
        {
            **_rank_entry(plan, "source", rank),
            "fan_out": len(plan.targets_of(rank)),
            "bytes_out": sum(e.nbytes(seq_len) for e in plan.edges_from(rank)),
        }
        for rank in plan.source.ranks()
    ]
    report["target_ranks"] = [
        {
            **_rank_entry(plan, "target", rank),
            "fan_in": len(plan.sources_of(rank)),
            "bytes_in": sum(e.nbytes(seq_len) for e in plan.edges_to(rank)),
        }
        for rank in plan.target.ranks()
    ]
    minimum = plan.minimum_nbytes(seq_len)
    report["totals"] = {
        "edges": len(plan.edges),
        "bytes_sender_side": plan.nbytes(seq_len),
        "bytes_receiver_side": plan.nbytes(seq_len, slicing="receiver"),
        "bytes_minimum": minimum,
    }
    return report


def rank_formula(layout: StageLayout) -> str:
    """The stage-rank formula of a layout with its numbers [STAGE-1, STAGE-2, CP-3]."""
    if layout.dp == 1 and layout.cp == 1:
        text = f"rank = pp_rank*{layout.tp} + tp_rank"
    else:
        inner = "cp_rank" if layout.dp == 1 else f"dp_rank*{layout.cp} + cp_rank"
        if layout.cp == 1:
            inner = "dp_rank"
        group = f"({inner})" if "+" in inner else inner
        text = f"rank = pp_rank*{layout.tp} + {group}*{layout.attn_tp} + attn_tp_rank"
    if layout.dcp > 1:
        text += f"; dcp_rank = attn_tp_rank % {layout.dcp}"
    if layout.token_shards > 1:
        shard = (
            "cp_rank"
            if layout.dcp == 1
            else ("dcp_rank" if layout.cp == 1 else f"cp_rank*{layout.dcp} + dcp_rank")
        )
        text += f"; token shard {shard} of {layout.token_shards} by {layout.cp_rule}"
    return text


def render(plan: TransferPlan, report: dict[str, Any]) -> str:
    """The human-readable form of :func:`plan_report`."""
    totals = report["totals"]
    sharded = plan.seq_len is not None
    lines = [
        f"transfer plan  {plan.source.describe()} -> {plan.target.describe()}   "
        f"(replica policy: {plan.policy})",
        f"model          {plan.model.describe()}",
        f"request        {report['seq_len']} tokens",
    ]
    if not (plan.source.first_release and plan.target.first_release):
        lines += [
            f"source ranks   {rank_formula(plan.source)}",
            f"target ranks   {rank_formula(plan.target)}",
        ]
    if plan.source.dp > 1 or plan.target.dp > 1:
        lines.append(
            f"router         the request lives on source DP rank {plan.source_dp} and target "
            f"DP rank {plan.target_dp}"
        )
    lines += [
        "",
        f"edges ({totals['edges']}):",
        f"  {'src':>4} {'(pp,tp)':>8}    {'dst':>4} {'(pp,tp)':>8}  {'heads':>7}  {'layers':>7}  "
        f"{'slice':>8}  {'bytes':>10}" + ("  tokens" if sharded else ""),
    ]
    coords_src = {r["rank"]: (r["pp_rank"], r["tp_rank"]) for r in report["source_ranks"]}
    coords_dst = {r["rank"]: (r["pp_rank"], r["tp_rank"]) for r in report["target_ranks"]}
    for e in report["edges"]:
        if "heads_in_shard" in e:
            piece = f"h{_span(e['heads_in_shard'])}/{e['shard_heads']}"
        else:
            piece = (
                "whole" if e["num_slices"] == 1 else f"{e['offset_in_shard']} of {e['num_slices']}"
            )
        tokens = f"  {_tokens(e.get('tokens'))}" if sharded else ""
        lines.append(
            f"  {e['src']:>4} {_coords(coords_src[e['src']]):>8} -> {e['dst']:>4} "
            f"{_coords(coords_dst[e['dst']]):>8}  {_span(e['heads']):>7}  {_span(e['layers']):>7}  "
            f"{piece:>8}  {human_bytes(e['bytes']):>10}{tokens}"
        )
    lines += ["", "source ranks:", _rank_header("fan-out", "bytes out", sharded)]
    for r in report["source_ranks"]:
        lines.append(_rank_line(r, r["fan_out"], r["bytes_out"], sharded))
    idle = [
        r["rank"]
        for r in report["source_ranks"]
        if r["fan_out"] == 0 and r.get("active", True) and r.get("tokens") != []
    ]
    if idle:
        lines.append(
            f"  idle senders {idle}: every head they hold is sent by a replica (policy "
            f"{plan.policy})"
        )
    lines += ["", "target ranks:", _rank_header("fan-in", "bytes in", sharded)]
    for r in report["target_ranks"]:
        lines.append(_rank_line(r, r["fan_in"], r["bytes_in"], sharded))
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


def _tokens(ranges: list[list[int]] | None) -> str:
    if ranges is None:
        return "all"
    return Tokens.from_list(ranges).describe(limit=3) if ranges else "none"


def _rank_header(fan: str, nbytes: str, sharded: bool = False) -> str:
    return f"  {'rank':>4} {'(pp,tp)':>8}  {'heads':>7}  {'layers':>7}  {fan:>7}  {nbytes:>10}" + (
        "  tokens" if sharded else ""
    )


def _rank_line(r: dict[str, Any], fan: int, nbytes: int, sharded: bool = False) -> str:
    if not r.get("active", True):
        return (
            f"  {r['rank']:>4} {_coords((r['pp_rank'], r['tp_rank'])):>8}  another DP group "
            f"(dp_rank {r['dp_rank']}): none of this request"
        )
    tokens = f"  {_tokens(r.get('tokens'))}" if sharded else ""
    return (
        f"  {r['rank']:>4} {_coords((r['pp_rank'], r['tp_rank'])):>8}  {_span(r['heads']):>7}  "
        f"{_span(r['layers']):>7}  {fan:>7}  {human_bytes(nbytes):>10}{tokens}"
    )


def _coords(pp_tp: tuple[int, int]) -> str:
    return f"({pp_tp[0]},{pp_tp[1]})"


def _span(bounds: list[int]) -> str:
    start, stop = bounds
    return str(start) if stop - start == 1 else f"{start}-{stop - 1}"


def _ratio(value: int, minimum: int) -> str:
    return "1.00x" if minimum == 0 else f"{value / minimum:.2f}x"
