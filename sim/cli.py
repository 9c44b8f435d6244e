"""``python -m sim run``: a simulated cluster moving real KV between real processes.

Every sender and receiver rank is its own OS process on the ports the spec assigns
(loopback by default). Stage-0 ranks fill their paged caches from the
coordinate-hash oracle; every receiving rank checks every element it gets, so no
ground truth travels. The run ends with a report: requests verified or failed (with
reasons), bytes per edge against the plan, throughput and latency.

examples:
  python -m sim run --source-tp 4 --target-tp 2 --kv-heads 2
  python -m sim run --source-tp 8 --target-tp 2 --kv-heads 4 --src-layout flashinfer \\
      --dst-layout flash_attn_hnd --src-block-size 16 --dst-block-size 32 --dtype float8_e4m3fn
  python -m sim run --chain TP4,TP2,TP1 --kv-heads 4 --chunks 3
  python -m sim run --source-tp 2 --source-pp 2 --target-tp 4 --kv-heads 8 --replicas 2
  python -m sim run --source-tp 4 --source-cp 2 --cp-rule interleave:16 --target-tp 6 \\
      --kv-heads 12
  python -m sim run --source-tp 8 --source-dp 2 --target-tp 4 --target-dp 2 --kv-heads 2
  python -m sim run --source-tp 4 --target-tp 2 --kv-heads 4 \\
      --faults drop=0.05,dup=0.05,reorder=0.1,delay=1ms,corrupt=0.02,kill=sender:1@0.5
  python -m sim run --model deepseek-v3-mtp --source-tp 2 --target-tp 2 --requests 2 \\
      --seq-len 8 --transfer pull --faults dup=0.5,reorder=0.5 --ports os

faults (--faults NAME=VALUE,...): drop=P, dup=P, reorder=P, corrupt=P, garbage=P,
late=P (probabilities per data message), abort=P (per request, at the receiver),
reuse=P (per request a sender sends: its blocks handed to another request before the
transfer is done, a stale descriptor [LIFE-3]), delay=5ms, kill=ROLE:RANK@FRACTION,
hang=ROLE:RANK@FRACTION, restart=ROLE:RANK@FRACTION, fail-nth=ROLE:RANK@N (ROLE sender,
receiver or stageN; join several with +). Receivers allocate blocks from a pool as
requests arrive and free them after --hold more requests; a block goes back only when
every transfer that could write it has quiesced [LIFE-3]; --unsafe-reuse breaks that on
purpose.

ports: --ports spec (default) binds every sender on the port of [PORT-1], from
--base-port (auto: the first base whose ports are all free); --ports os lets the
operating system pick each sender's port, which the sender reports to its receivers.

security: every run draws a secret; ranks prove it in signed handshakes, and only
proven peers are sent KV or heard on the control plane. Anything else is dropped and
counted under "strangers". Binding beyond loopback (--host) prints what is exposed;
--require-loopback refuses it. --transport mooncake, whose engine authenticates no
peer, runs only with --allow-unauthenticated-transport, and its report says so first.

exit status: 0 every request verified; 1 a request failed, a rank failed, or the run
hit its deadline; 2 the configuration is refused or the ranks could not start (with
the reason); 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from kvspec import __version__
from kvspec.console.args import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    Parser,
    cache_layout_ref,
    int_in,
    number_in,
    seconds_in,
)
from kvspec.console.exits import run_to_exit
from kvspec.console.nearby import Knob, flag_hint, nearby, print_hints
from kvspec.console.output import STDOUT, add_json_option, check_writable, write_json
from kvspec.console.stage_options import (
    SIDES,
    add_parallel_arguments,
    groups_from_args,
    model_from_args,
    parallel_knobs,
)
from kvspec.memory.cache_layout import get_layout
from kvspec.tensors.dtypes import DTYPES
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.model_presets import PRESETS as MODEL_PRESETS
from kvspec.topology.plan import POLICIES
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import run_simulation
from sim.harness.progress import ProgressBar
from sim.harness.validation import exposure, validate
from sim.net.endpoints import find_free_base
from sim.run.config import (
    LIMITS,
    PORT_MODES,
    TRANSFERS,
    TRANSPORTS,
    SimConfig,
    parse_seq_len,
    parse_stage,
)
from sim.run.faults import parse_faults

RANKS = int_in(1, LIMITS.ranks)
PROG = "python -m sim run"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvspec sim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a simulated transfer and verify every element",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(run)
    return parser


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    """Every flag of ``sim run`` (``sim.node`` takes the same ones)."""
    stages = run.add_argument_group("stages")
    stages.add_argument("--source-tp", type=RANKS, default=4, metavar="S", help="sender TP (4)")
    stages.add_argument("--target-tp", type=RANKS, default=2, metavar="T", help="receiver TP (2)")
    stages.add_argument("--source-pp", type=RANKS, default=1, metavar="P", help="sender PP (1)")
    stages.add_argument("--target-pp", type=RANKS, default=1, metavar="Q", help="receiver PP (1)")
    add_parallel_arguments(run.add_argument_group("attention groups and token shards"), ranks=False)
    stages.add_argument(
        "--chain",
        metavar="TP4,TP2,TP1",
        help="a chain of stages instead of source/target, e.g. TP4,TP2,TP1 or PP2xTP2,TP4",
    )
    stages.add_argument(
        "--replicas",
        type=int_in(1, LIMITS.replicas),
        default=1,
        help="independent replica groups (1)",
    )
    model = run.add_argument_group("model")
    model.add_argument(
        "--model",
        choices=tuple(MODEL_PRESETS),
        default=None,
        metavar="NAME",
        help="a named hybrid preset, every layer group moved and verified in its own regions, "
        "by the group plan [GROUP-3], with the other flags as for any model (two TP/PP "
        f"stages, push or pull, --stream, --faults but abort/late/reuse/restart/fail-nth): "
        f"{', '.join(MODEL_PRESETS)}",
    )
    model.add_argument(
        "--kv-heads",
        type=int_in(1, MAX_HEADS),
        default=None,
        metavar="H",
        help="KV heads (MHA/GQA)",
    )
    model.add_argument(
        "--head-dim", type=int_in(1, MAX_HEAD_DIM), default=64, metavar="D", help="head dim (64)"
    )
    model.add_argument(
        "--layers", type=int_in(1, MAX_LAYERS), default=4, metavar="L", help="layers (4)"
    )
    model.add_argument("--attention", choices=("mha", "mla"), default="mha", help="(mha)")
    model.add_argument(
        "--latent-dim", type=int_in(1, MAX_HEAD_DIM), default=64, help="MLA latent width (64)"
    )
    model.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="(bfloat16)")
    caches = run.add_argument_group("caches")
    for flag in ("--src-layout", "--dst-layout"):  # a preset, or a layout file [LAYOUT-5]
        caches.add_argument(
            flag,
            type=cache_layout_ref,
            default=None,
            metavar="PRESET|FILE.json",
            help="a preset (kvspec layouts lists them) or a layout file (flash_attn; mla for MLA)",
        )
    caches.add_argument(
        "--transfer",
        choices=TRANSFERS,
        default="push",
        help="push payloads; pull: receivers read byte ranges from the senders' caches; write: "
        "senders write byte ranges from their caches into the receivers', zero-copy (push)",
    )
    caches.add_argument(
        "--src-block-size", type=int_in(1, LIMITS.block_size), default=16, metavar="B", help="(16)"
    )
    caches.add_argument(
        "--dst-block-size", type=int_in(1, LIMITS.block_size), default=16, metavar="B", help="(16)"
    )
    caches.add_argument(
        "--vllm-block-size",
        action="store_true",
        help="with --model: each stage's block size derived from the model and its TP as vLLM "
        "does for a hybrid, the block-size flags as the user's minimum [BLOCK-1]",
    )
    work = run.add_argument_group("workload")
    work.add_argument(
        "--requests",
        type=int_in(1, LIMITS.requests),
        default=8,
        metavar="N",
        help="requests per replica (8)",
    )
    work.add_argument("--seq-len", default="16:128", metavar="MIN:MAX", help="tokens (16:128)")
    work.add_argument(
        "--chunks",
        type=int_in(1, LIMITS.chunks),
        default=1,
        metavar="K",
        help="chunks per request (1)",
    )
    work.add_argument(
        "--stream",
        default="off",
        metavar="MODE",
        help="layers: send each layer's KV as soon as it is computed; chunks:N: the layers "
        "in N groups; whole: compute every layer, then send [STREAM-1]. A streamed run is "
        "preceded by the same run with whole, and the report compares their KV-ready "
        "latency (off)",
    )
    work.add_argument(
        "--layer-compute-ms",
        type=number_in(0, LIMITS.layer_compute_ms, "milliseconds"),
        default=1.0,
        metavar="MS",
        help="simulated compute per layer when streaming (1)",
    )
    work.add_argument(
        "--slicing", choices=("sender", "receiver"), default="sender", help="(sender)"
    )
    work.add_argument(
        "--policy", choices=POLICIES, default="lowest", help="replica choice (lowest)"
    )
    work.add_argument(
        "--seed", type=int_in(0, (1 << 63) - 1), default=0, help="oracle and workload seed (0)"
    )
    where = run.add_argument_group("where")
    where.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="(cpu)")
    where.add_argument("--host", default="127.0.0.1", help="address senders bind (127.0.0.1)")
    where.add_argument(
        "--require-loopback",
        action="store_true",
        help="refuse a run any of whose ports would listen beyond loopback (a --host "
        "elsewhere, or --transport mooncake, whose engine binds every interface), naming "
        "the interface",
    )
    where.add_argument(
        "--allow-unauthenticated-transport",
        action="store_true",
        help="run --transport mooncake anyway: its engine authenticates no peer, so anyone "
        "who reaches its port (any local user) can read and write every rank's cache; the "
        "report says so in its first lines",
    )
    where.add_argument(
        "--ports",
        choices=PORT_MODES,
        default="spec",
        help="spec: the ports of [PORT-1] from --base-port; os: any free port each (spec)",
    )
    where.add_argument(
        "--base-port",
        default="20000",
        metavar="N",
        help="with --ports spec, KV ports start here (20000); 'auto' finds a base whose "
        "ports are all free",
    )
    where.add_argument(
        "--ranks-per-process",
        type=int_in(1, LIMITS.ranks_per_process),
        default=1,
        metavar="N",
        help="host N ranks per process, each with its own sockets (1)",
    )
    where.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="tcp",
        help="tcp: one process per rank group, ZMQ between them; inproc: threads in this "
        "process; gloo (CPU) or nccl (GPU): as tcp, but the tensor frames go over "
        "torch.distributed send/recv; nixl or mooncake: with --transfer pull|write, the "
        "bytes go one-sided through NIXL over UCX or the Mooncake transfer engine, DRAM "
        "(pip install 'kvspec[nixl]' or 'kvspec[mooncake]') (tcp)",
    )
    run.add_argument(
        "--no-checksum",
        dest="checksum",
        action="store_false",
        help="send without the wire format's CRC-32s (corruption is then caught by the oracle)",
    )
    run.add_argument(
        "--hold",
        type=int_in(0, LIMITS.requests),
        default=2,
        metavar="N",
        help="a receiver keeps a verified request's blocks while N more arrive, then frees "
        "them for reuse (2)",
    )
    run.add_argument(
        "--unsafe-reuse",
        action="store_true",
        help="break the quiescence rule on purpose [LIFE-3, LIFE-4]: blocks of aborted or "
        "restarted transfers go back at once and late writes land; the oracle shows the "
        "corruption and the trace checker the broken rule",
    )
    run.add_argument(
        "--require-checksum",
        action="store_true",
        help="receivers refuse any message without the wire format's CRC-32s [WIRE-6]",
    )
    run.add_argument(
        "--verify-after",
        action="store_true",
        help="verify once every request has arrived, so throughput excludes verification",
    )
    run.add_argument("--faults", default=None, metavar="SPEC", help="faults to inject (none)")
    run.add_argument(
        "--timeout",
        type=seconds_in(0, LIMITS.timeout_s),
        default=120.0,
        metavar="SECONDS",
        help="run deadline (120)",
    )
    add_json_option(run, "the report")
    run.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    if args.chain is not None:
        stages = tuple(parse_stage(s) for s in args.chain.split(","))
    else:
        stages = (
            StageLayout(args.source_tp, args.source_pp, **groups_from_args(args, "source")),
            StageLayout(args.target_tp, args.target_pp, **groups_from_args(args, "target")),
        )
    model = model_from_args(args)
    default_layout = "mla" if model.attention == "mla" else "flash_attn"
    source_block, target_block = args.src_block_size, args.dst_block_size
    if getattr(args, "vllm_block_size", False):
        if not model.hybrid:
            raise ValueError(
                "--vllm-block-size derives a hybrid's block sizes; it needs --model NAME"
            )
        # Each stage's block size as vLLM derives it from the model and its TP, the flags
        # the user's block size it raises [BLOCK-1]; the two differ by construction.
        source_block = hybrid_block_size(model, stages[0].attn_tp, block_size=source_block)
        target_block = hybrid_block_size(model, stages[-1].attn_tp, block_size=target_block)
    return SimConfig(
        stages=stages,
        model=model,
        src_layout=get_layout(args.src_layout or default_layout),  # parsed here, once
        dst_layout=get_layout(args.dst_layout or default_layout),
        src_block_size=source_block,
        dst_block_size=target_block,
        requests=args.requests,
        seq_len=parse_seq_len(args.seq_len),
        chunks=args.chunks,
        replicas=args.replicas,
        slicing=args.slicing,
        policy=args.policy,
        device=args.device,
        host=args.host,
        require_loopback=args.require_loopback,
        allow_unauthenticated_transport=args.allow_unauthenticated_transport,
        ports=args.ports,
        base_port=20000 if args.base_port == "auto" else _port(args.base_port),
        faults=parse_faults(args.faults),
        seed=args.seed,
        timeout=args.timeout,
        ranks_per_process=args.ranks_per_process,
        transport=args.transport,
        checksum=args.checksum,
        require_checksum=args.require_checksum,
        hold=args.hold,
        unsafe_reuse=args.unsafe_reuse,
        verify_after=args.verify_after,
        transfer=args.transfer,
        stream=args.stream,
        layer_compute_ms=args.layer_compute_ms,
    )


def checked_config(args: argparse.Namespace) -> SimConfig:
    """The run ``args`` ask for, refused (``ValueError``) exactly as ``sim run`` refuses it,
    before any process starts or any tensor is allocated."""
    config = config_from_args(args)
    if args.base_port == "auto" and config.ports == "spec":
        config = replace(config, base_port=find_free_base(config))
    validate(config)
    return config


def nearby_runs(args: argparse.Namespace, *, count: int = 3) -> list[str]:
    """Runs one change away from a refused ``args`` that :func:`checked_config` accepts,
    closest first: the knobs ``kvspec plan`` hints at, and with token shards, each cache's
    block size [CP-2]. A ``--chain`` sets the stages itself: no TP is hinted at."""
    if args.chain is not None:
        return []
    blocks = {"source": args.src_block_size, "target": args.dst_block_size}
    knobs = parallel_knobs(args, block_sizes=blocks)
    sharded = any(getattr(args, f"{side}_{k}") > 1 for side in SIDES for k in ("cp", "dcp"))
    for name in ("src_block_size", "dst_block_size") if sharded else ():
        sizes = range(1, min(LIMITS.block_size, 4 * max(getattr(args, name), 16)) + 1)
        knobs.append(Knob(name, sizes, flag_hint(f"--{name.replace('_', '-')}")))
    return nearby(args, checked_config, knobs, count=count)


def _port(text: str) -> int:
    try:
        return int_in(1, 65535)(text)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"--base-port: {error} (or 'auto')") from None


def main(argv: Sequence[str] | None = None, *, started: tuple[float, str] | None = None) -> int:
    """``sim run``; ``started`` is (``time.time()``, what it is) of the command's start, for
    the report's wall time (``python -m sim`` passes the process's; by default, now)."""
    if started is None:
        started = (time.time(), "sim.cli.main being called")
    parser = build_parser()
    return run_to_exit(lambda: _run(parser.parse_args(argv), started), PROG)


def _run_once(config: SimConfig, quiet: bool) -> SimReport:
    bar = None if quiet else ProgressBar(config.requests * config.replicas)
    try:
        return run_simulation(config, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()


def _run(args: argparse.Namespace, started: tuple[float, str]) -> int:
    try:
        check_writable(args.json)
    except ValueError as error:
        print(f"{PROG}: refused: {error}", file=sys.stderr)
        return 2
    try:
        config = checked_config(args)
    except ValueError as error:
        print(f"{PROG}: refused: {error}", file=sys.stderr)
        print_hints(nearby_runs(args), sys.stderr)
        return 2
    exposed = exposure(config)
    if exposed:
        print(f"{PROG}: exposed: {exposed}", file=sys.stderr)
    baseline = None
    if config.stream_groups:  # the whole-request twin, measured first [STREAM-1]
        baseline = _run_once(replace(config, stream="whole"), args.quiet)
        if baseline.interrupted:
            print(baseline.render())
            return 130
    report = _run_once(config, args.quiet)
    report.baseline = baseline
    report.time_command(*started)
    if args.json != STDOUT:
        print(report.render())
    if args.json:
        write_json(args.json, report.to_dict())
    if report.interrupted:
        return 130
    if report.setup_error:
        print(f"{PROG}: refused: the run could not start: {report.setup_error}", file=sys.stderr)
        return 2
    return 0 if report.ok else 1
