"""The stage and model options ``kvspec plan`` and ``python -m sim run`` share: each side's
context-parallel, attention-DP and token-rule flags [STAGE-2, CP-1, CP-3, DP-1], the model
they describe [MODEL-1, MODEL-2, GROUP-1], and the one-change hints for them."""

from __future__ import annotations

import argparse
from typing import Any

from kvspec.console.args import MAX_PARALLEL, int_in
from kvspec.console.nearby import Knob, either, flag_hint
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import model_preset

SIDES: tuple[str, ...] = ("source", "target")


def add_parallel_arguments(group: Any, *, ranks: bool = True) -> None:
    """``--{source,target}-{cp,dcp,dp}``, the token rules and (with ``ranks``) the router's
    DP ranks, as ``kvspec plan`` and ``python -m sim run`` take them [STAGE-2, CP-1, CP-3,
    DP-1]; the sim's router picks DP ranks per request itself."""
    for side in SIDES:
        who = "sender" if side == "source" else "receiver"
        group.add_argument(
            f"--{side}-cp",
            type=int_in(1, MAX_PARALLEL),
            default=1,
            metavar="C",
            help=f"{who} context-parallel groups within TP (1)",
        )
        group.add_argument(
            f"--{side}-dcp",
            type=int_in(1, MAX_PARALLEL),
            default=1,
            metavar="D",
            help=f"{who} decode context parallelism over each head's replicas (1)",
        )
        group.add_argument(
            f"--{side}-dp",
            type=int_in(1, MAX_PARALLEL),
            default=1,
            metavar="N",
            help=f"{who} attention data-parallel groups within TP (1)",
        )
    group.add_argument(
        "--cp-rule",
        default=None,
        metavar="RULE",
        help="token rule of both sides: contiguous[:B], interleave:I, round_robin_blocks:B, "
        "zigzag (contiguous)",
    )
    for side in SIDES:
        group.add_argument(
            f"--{side}-cp-rule", default=None, metavar="RULE", help=f"{side} rule (--cp-rule)"
        )
    for side in SIDES if ranks else ():
        group.add_argument(
            f"--{side}-dp-rank",
            type=int_in(0, MAX_PARALLEL - 1),
            default=0,
            metavar="R",
            help=f"the {side} DP group the router chose for the request (0)",
        )


def groups_from_args(args: argparse.Namespace, side: str) -> dict[str, Any]:
    """The ``dp``, ``cp``, ``dcp`` and ``cp_rule`` of one side's :class:`StageLayout`."""
    rule = getattr(args, f"{side}_cp_rule") or args.cp_rule or "contiguous"
    return {
        "dp": getattr(args, f"{side}_dp"),
        "cp": getattr(args, f"{side}_cp"),
        "dcp": getattr(args, f"{side}_dcp"),
        "cp_rule": rule,
    }


def model_from_args(args: argparse.Namespace) -> ModelShape:
    """The model of the ``--attention --kv-heads --layers --head-dim --latent-dim --dtype``
    options that ``kvspec plan`` and ``python -m sim run`` share [MODEL-1, MODEL-2], or a
    named preset's (``--model``, ``kvspec plan`` only) [GROUP-1]."""
    preset = getattr(args, "model", None)
    if preset is not None:
        if args.kv_heads is not None:
            raise ValueError(f"--kv-heads with --model {preset}: the preset fixes the model")
        return model_preset(preset)
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


def is_sized(args: argparse.Namespace) -> bool:
    """Whether the TP sizes and the head count are given and positive (hints need them)."""
    heads = 1 if args.attention == "mla" else args.kv_heads
    return heads is not None and heads >= 1 and args.source_tp >= 1 and args.target_tp >= 1


def parallel_knobs(args: argparse.Namespace, *, block_sizes: dict[str, int]) -> list[Knob]:
    """The one-change hints of the flags ``kvspec plan`` and ``python -m sim run`` share:
    either side's TP, the head count (MHA), and where they are given, a side's cp, dcp,
    dp, DP rank (``kvspec plan``) and token-rule size, up to twice the largest size in
    play; ``block_sizes`` bounds a side's rule sizes [STAGE-2, CP-1, CP-2, DP-1]."""
    if not is_sized(args):
        return []
    heads = 1 if args.attention == "mla" else args.kv_heads
    limit = range(1, 2 * max(args.source_tp, args.target_tp, heads, 4) + 1)
    source, target = args.source_tp, args.target_tp
    knobs = [
        Knob("target_tp", limit, lambda found: f"--source-tp {source} --target-tp {either(found)}"),
        Knob("source_tp", limit, lambda found: f"--source-tp {either(found)} --target-tp {target}"),
    ]
    if args.attention == "mha":
        both = f"--source-tp {source} --target-tp {target}"
        knobs.append(Knob("kv_heads", limit, lambda found: f"{both} --kv-heads {either(found)}"))
    for side in SIDES:
        for knob in ("cp", "dcp", "dp", "dp_rank"):
            name = f"{side}_{knob}"
            low = 0 if knob == "dp_rank" else 1
            if getattr(args, name, low) == low:
                continue
            flag = f"--{name.replace('_', '-')}"
            values = range(low, max(limit) + 1)
            knobs.append(Knob(name, values, flag_hint(flag)))
        rule = getattr(args, f"{side}_cp_rule") or args.cp_rule
        kind, _, size = (rule or "").partition(":")
        if size.isdigit() and kind:
            sizes = range(1, 2 * max(int(size), block_sizes[side]) + 1)

            def distance(r: str, size: int = int(size)) -> tuple[int, int]:
                return (abs(_rule_size(r) - size), _rule_size(r))

            knobs.append(
                Knob(
                    f"{side}_cp_rule",
                    [f"{kind}:{v}" for v in sizes if v != int(size)],
                    flag_hint(f"--{side}-cp-rule"),
                    distance=distance,
                )
            )
    return knobs


def _rule_size(rule: str) -> int:
    return int(rule.rpartition(":")[2])
