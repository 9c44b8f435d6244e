"""Show the byte ranges a pull connector posts for a transfer: the DESC plan and its count.

For every edge of the transfer plan [PLAN-2], the two ranks' registered caches (one
preset and block size per side) and a request's block ids, the spec's descriptor
list writes the receiver's share once from the right bytes, inside the registered
regions, in the fewest ranges the layout pair allows [DESC-1..3].

examples:
  kvspec desc --source-tp 8 --target-tp 2 --kv-heads 4 --src-layout vllm_packed_hnd \\
      --dst-layout sglang_mha
  kvspec desc --source-tp 2 --target-tp 2 --kv-heads 8 --src-layout vllm_packed_nhd \\
      --dst-layout vllm_packed_hnd --edge 0:0 --show 4
  kvspec desc --source-tp 4 --target-tp 4 --kv-heads 4 --contiguous --json -
  kvspec desc ... --edge 0:0 --check list.json     # judge a connector's list

Block ids are a shuffled table (--seed), as a busy engine's are; --contiguous gives
the best case. A refused configuration, a region too small for the block ids, or a
--check list that overlaps, overruns or misses bytes exits with status 2 and names the
values and the rule.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import TYPE_CHECKING, Any

from kvspec.cli import plan as plan_cli
from kvspec.console.args import int_in
from kvspec.console.output import STDOUT, check_writable, write_json
from kvspec.core.untrusted_input import InputRefused, loads, read_regular_file
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import TransferPlan, plan_transfer

# The layouts and descriptors (and so torch) are imported where they are used, so that
# `kvspec --help` and every other command start without them.
if TYPE_CHECKING:
    from kvspec.memory.descriptors import DescriptorPlan, RegisteredCache

NAME = "desc"
HELP = "show the byte-range descriptors (and their count) that realise a transfer"

MAX_ATOMS = 50_000_000
"""The most (layer, token, head, field) cells one command plans: beyond it, refused."""
MAX_CHECK_BYTES = 64 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan_cli.add_arguments(parser)
    desc = parser.add_argument_group("descriptors")
    desc.add_argument("--src-layout", metavar="PRESET", help="sender's layout (flash_attn; mla)")
    desc.add_argument("--dst-layout", metavar="PRESET", help="receiver's layout (as the sender)")
    desc.add_argument("--src-block-size", type=int_in(1, 1 << 16), default=16, metavar="N")
    desc.add_argument("--dst-block-size", type=int_in(1, 1 << 16), default=16, metavar="N")
    desc.add_argument("--edge", metavar="S:D", help="only the edge from sender S to receiver D")
    desc.add_argument(
        "--contiguous", action="store_true", help="block ids in order (default: shuffled)"
    )
    desc.add_argument("--seed", type=int_in(0, 2**31), default=0, help="block-id shuffle (0)")
    desc.add_argument("--show", type=int_in(0, 1 << 20), default=0, metavar="N")
    desc.add_argument(
        "--dst-region-bytes",
        type=int_in(1, 1 << 62),
        metavar="N",
        help="each receiver region registered with N bytes (default: the whole tensor)",
    )
    desc.add_argument("--check", metavar="FILE", help="judge this JSON list for --edge")


def run(args: argparse.Namespace) -> int:
    try:
        check_writable(args.json)
        plan = plan_transfer(
            *plan_cli._stages_and_model(args),
            policy=args.policy,
            seq_len=args.seq_len,  # the plan of this length where stages split by tokens
            source_dp=args.source_dp_rank,
            target_dp=args.target_dp_rank,
        )
        report = desc_report(plan, args)
    except ValueError as error:
        print(f"kvspec desc: refused: {error}", file=sys.stderr)
        return 2
    if args.json != STDOUT:
        print(render(report))
    if args.json:
        write_json(args.json, report)
    return 0


def _layouts(args: argparse.Namespace, attention: str) -> tuple[str, str]:
    from kvspec.memory.cache_layout import PRESETS, get_layout, holds_attention, layouts_for

    default = "mla" if attention == "mla" else "flash_attn"
    chosen = (args.src_layout or default, args.dst_layout or args.src_layout or default)
    kv = 1 if attention == "mla" else 2
    allowed = layouts_for(attention, cross_layer=True) + tuple(
        n for n, spec in PRESETS.items() if not spec.plain and spec.kv_tensors == kv
    )
    for option, name in zip(("--src-layout", "--dst-layout"), chosen, strict=True):
        spec = get_layout(name)  # a preset, or a layout file [LAYOUT-5]
        if not (
            holds_attention(spec, attention, cross_layer=True)
            or (not spec.plain and spec.kv_tensors == kv)
        ):
            raise ValueError(
                f"{option} {name}: it cannot hold a {attention} model's cache; use one of "
                f"{', '.join(allowed)} [LAYOUT-1]"
            )
    return chosen


def _ids(count: int, total: int, args: argparse.Namespace, salt: str) -> list[int]:
    ids = list(range(total))
    if not args.contiguous:
        random.Random(f"{args.seed}:{salt}").shuffle(ids)
    return ids[:count]


def _edges(plan: TransferPlan, text: str | None) -> list:
    if text is None:
        return list(plan.edges)
    src, sep, dst = text.partition(":")
    if not sep or not src.isdigit() or not dst.isdigit() or len(text) > 12:
        raise ValueError(f"--edge {text!r}: expected S:D, sender and receiver ranks, e.g. 0:1")
    return [plan.edge(int(src), int(dst))]


def _registered(
    plan: TransferPlan,
    rank: int,
    side: str,
    layout: str,
    block_size: int,
    slots: int,
    args: argparse.Namespace,
) -> tuple[RegisteredCache, list[int]]:
    """The rank's registered cache and the request's first block ids, enough for ``slots``
    token slots: the rank's own tokens up to the share's last [CP-1, PAGED-3]."""
    from kvspec.memory.cache_layout import get_layout
    from kvspec.memory.descriptors import RegisteredCache
    from kvspec.memory.paged import blocks_needed

    model = plan.model
    stage = plan.source if side == "src" else plan.target
    owner = rank_ownership(stage, model, rank)
    spec = get_layout(layout)
    block_size = block_size if spec.paged else 1
    stage.check_block_size(block_size)  # the token rule fits the cache [CP-2]
    needed = blocks_needed(slots, block_size)
    total = needed + 2  # a few blocks that hold other requests
    dtype = model.dtype
    if spec.dtypes and model.dtype not in spec.dtypes:
        raise ValueError(
            f"{layout} holds {', '.join(spec.dtypes)} records; the model is {model.dtype} "
            "(--dtype) [LAYOUT-6]"
        )
    cache = RegisteredCache(
        spec,
        len(owner.layers),
        total,
        block_size,
        len(owner.heads),
        model.head_dim,
        dtype,
        tensors_per_layer=model.kv_tensors,
    )
    if side == "dst" and args.dst_region_bytes:
        cache = RegisteredCache.from_dict(
            {
                **cache.to_dict(),
                "region_bytes": dict.fromkeys(cache.regions(), args.dst_region_bytes),
            }
        )
    return cache, _ids(needed, total, args, f"{side}{rank}")


def desc_report(plan: TransferPlan, args: argparse.Namespace) -> dict[str, Any]:
    """Every chosen edge's descriptor plan: its count, bytes and bytes per descriptor."""
    from kvspec.memory.descriptors import plan_descriptors, share_positions

    seq_len = args.seq_len
    src_layout, dst_layout = _layouts(args, plan.model.attention)
    edges = _edges(plan, args.edge)
    if args.check and args.edge is None:
        raise ValueError("--check judges one edge's list: give --edge S:D as well")
    cells = sum(len(e.heads) * len(e.layers) * e.token_count(seq_len) for e in edges) * 4
    if cells > MAX_ATOMS:
        raise ValueError(
            f"{len(edges)} edge(s) x {seq_len} tokens is {cells} cells to plan; at most "
            f"{MAX_ATOMS}: use a shorter --seq-len, fewer --layers or one --edge"
        )
    rows, plans = [], []
    for edge in edges:
        share = share_positions(plan, edge, range(seq_len))
        source, src_ids = _registered(
            plan, edge.src, "src", src_layout, args.src_block_size, share.source_slots, args
        )
        target, dst_ids = _registered(
            plan, edge.dst, "dst", dst_layout, args.dst_block_size, share.target_slots, args
        )
        made = plan_descriptors(
            plan,
            edge,
            source,
            src_ids,
            target,
            dst_ids,
            range(seq_len),
            count_only=not (args.show or args.check),
        )
        plans.append(made)
        rows.append(_row(made, src_ids, dst_ids, args.show))
    report: dict[str, Any] = {
        "transfer": f"{plan.source.describe()} -> {plan.target.describe()}",
        "model": plan.model.describe(),
        "src_layout": src_layout,
        "dst_layout": dst_layout,
        "src_block_size": plans[0].source.block_size,
        "dst_block_size": plans[0].target.block_size,
        "seq_len": seq_len,
        "block_ids": "contiguous" if args.contiguous else f"shuffled (seed {args.seed})",
        "edges": rows,
        "totals": _totals(plans, seq_len),
    }
    if args.check:
        report["check"] = _check(args.check, plans[0])
    return report


def _row(made: DescriptorPlan, src_ids: list[int], dst_ids: list[int], show: int) -> dict:
    e = made.edge
    return {
        "src": e.src,
        "dst": e.dst,
        "heads": [e.heads.start, e.heads.stop],
        "layers": [e.layers.start, e.layers.stop],
        "descriptors": made.count,
        "bytes": made.share_bytes,
        "bytes_per_descriptor": made.share_bytes / made.count if made.count else 0.0,
        "src_block_ids": src_ids,
        "dst_block_ids": dst_ids,
        "first": [d.to_list() for d in made.descriptors[:show]],
    } | ({} if e.tokens is None else {"tokens": e.tokens.to_list()})


def _totals(plans: list[DescriptorPlan], seq_len: int) -> dict[str, Any]:
    count = sum(p.count for p in plans)
    nbytes = sum(p.share_bytes for p in plans)
    return {
        "edges": len(plans),
        "descriptors": count,
        "bytes": nbytes,
        "bytes_per_descriptor": nbytes / count if count else 0.0,
        "descriptors_per_1k_tokens": count * 1000 / seq_len,
    }


def _check(path: str, made: DescriptorPlan) -> dict[str, Any]:
    """Judge the JSON list in ``path`` against the edge's plan; refuse a wrong one [DESC-1]."""
    from kvspec.memory.descriptors import judge_descriptors

    try:
        listed = loads(read_regular_file(path, MAX_CHECK_BYTES), max_depth=2)
    except InputRefused as refusal:
        raise ValueError(
            f"--check {path}: {refusal}; expected a JSON list of 5-element lists"
        ) from None
    if not isinstance(listed, list):
        raise ValueError(f"--check {path}: expected a JSON list of 5-element lists")
    verdict = judge_descriptors(listed, made)
    if not verdict.ok:
        raise ValueError(f"--check {path}: {verdict.problems[0]}")
    return {
        "ok": True,
        "descriptors": verdict.count,
        "minimum": verdict.minimum,
        "bytes": verdict.share_bytes,
    }


def render(report: dict[str, Any]) -> str:
    totals = report["totals"]
    lines = [
        f"descriptors  {report['transfer']}   {report['model']}",
        f"layouts      {report['src_layout']} (blocks of {report['src_block_size']}) -> "
        f"{report['dst_layout']} (blocks of {report['dst_block_size']})",
        f"request      {report['seq_len']} tokens, block ids {report['block_ids']}",
        "",
        f"  {'edge':>9}  {'heads':>7}  {'layers':>7}  {'descriptors':>11}  {'bytes':>10}  "
        f"{'bytes/desc':>10}",
    ]
    for row in report["edges"]:
        lines.append(
            f"  {row['src']:>4} -> {row['dst']:<2} {plan_cli._span(row['heads']):>7}  "
            f"{plan_cli._span(row['layers']):>7}  {row['descriptors']:>11}  "
            f"{plan_cli.human_bytes(row['bytes']):>10}  {row['bytes_per_descriptor']:>10.1f}"
            + (f"  tokens {plan_cli._tokens(row['tokens'])}" if "tokens" in row else "")
        )
        for d in row["first"]:
            lines.append(f"      {d}")
    lines += [
        "",
        f"total: {totals['descriptors']} descriptors for {plan_cli.human_bytes(totals['bytes'])}"
        f" ({totals['bytes_per_descriptor']:.1f} bytes each), "
        f"{totals['descriptors_per_1k_tokens']:.0f} per 1k tokens; each list is the minimum "
        "for its layout pair [DESC-3]",
    ]
    if "check" in report:
        c = report["check"]
        lines.append(
            f"checked: the list writes the share exactly ({c['descriptors']} descriptors, "
            f"the minimum is {c['minimum']})"
        )
    return "\n".join(lines)
