"""``torchrun ... -m sim.node <the flags of sim run>``: the simulated cluster on many hosts.

Every torchrun worker runs this with the same flags (``--host`` aside: each worker's own
address, the one its senders bind and publish). The workers meet in torch.distributed's
store (:mod:`sim.net.rendezvous`): each publishes its address and a hash of its
configuration (a mismatch is refused, naming both workers), claims its fixed share of
the sim's ranks by its global rank (:func:`sim.harness.multihost.shares`) and proves the
ports of the ranks its host runs [PORT-3]. Every worker is given the run's key out of
band (--key-file, a file only its owner can read, or KVSPEC_SIM_KEY in the launcher's
environment; never on a command line) and derives from it the secret its ranks prove in
their handshakes and the key that signs every value it puts on the store, which has no
authentication of its own: nothing secret rests there, and a value a stranger writes is
refused (sim.net.auth, sim.net.rendezvous). Worker 0 then coordinates the run and prints
the report ``sim run`` prints, with a line per host; the other workers relay
(:mod:`sim.harness.multihost`).

With ``--transport gloo`` (CPU) or ``--transport nccl`` (GPU, one worker per node) the
tensor frames go over torch.distributed send/recv between the rank processes of every
host, which meet in the same store (:mod:`sim.net.p2p`); control and headers stay on ZMQ.

Workers wait for each other on the board for at most ``--timeout`` seconds. Launched
without torchrun it refuses to start (``python -m sim run`` is the one-host entry).
Exit status as ``sim run``'s on worker 0; elsewhere 0 when the coordinator ended the
run, 1 when it was lost, 2 when the run was refused.

example (on each of two nodes, --host that node's own address; key: the same file on both):
  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 \\
      -m sim.node --source-tp 2 --target-tp 2 --kv-heads 4 --host 10.0.0.1 --transport gloo \\
      --key-file ~/.kvspec-sim-key
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from kvspec import __version__
from kvspec.console.args import Parser
from kvspec.console.output import STDOUT, check_writable, write_json
from kvspec.naming.ports import port
from sim.books.report import SimReport
from sim.cli import add_run_arguments, config_from_args
from sim.harness.multihost import Agent, Coordinator, shares
from sim.harness.progress import ProgressBar
from sim.harness.validation import exposure, validate
from sim.net.auth import KEY_ENV, RunSecret, board_key, run_key
from sim.net.endpoints import RankId, all_ranks, port_is_free
from sim.net.rendezvous import Board, BoardError
from sim.run.config import SimConfig

PROG = "python -m sim.node"


def build_parser() -> argparse.ArgumentParser:
    """``python -m sim.node``'s own parser: this module's help, then ``sim run``'s flags."""
    parser = Parser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"kvspec sim.node {__version__}")
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        help="the run's key, the same on every host: a file only you can read holding 64 hex "
        f"digits (else ${KEY_ENV})",
    )
    add_run_arguments(parser)
    return parser


def refuse(message: str) -> int:
    print(f"{PROG}: refused: {message}", file=sys.stderr)
    return 2


def check_host_ports(
    config: SimConfig, share: list[list[RankId]], hosts: list[str], worker: int
) -> None:
    """[PORT-3] per host: the KV ports of every rank this worker's host runs are distinct,
    and this worker's own are free on its address."""
    if config.ports != "spec":
        return
    mine = hosts[worker]
    on_host = [w for w in range(len(hosts)) if hosts[w] == mine]
    numbers: dict[int, str] = {}
    for w in on_host:
        for who in share[w]:
            if who.stage == config.last_stage:
                continue  # receivers bind no KV port
            number = port("kv", config.base_port, who.stage, who.rank, who.replica)
            if number in numbers:
                raise ValueError(
                    f"host {mine}: port {number} of {who.name} is also {numbers[number]}'s [PORT-3]"
                )
            numbers[number] = who.name
            if w == worker and not port_is_free(config.host, number):
                raise ValueError(
                    f"host {mine}: port {number} for {who.name} is taken; choose another "
                    "--base-port (the same on every host) or use --ports os"
                )


def main(argv: Sequence[str] | None = None) -> int:
    import torch.distributed as dist

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not dist.is_torchelastic_launched():
        return refuse(
            "run me under torchrun (torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d "
            "--rdzv-endpoint HOST:PORT -m sim.node ...); on one host use python -m sim run"
        )
    try:
        check_writable(args.json)
        if args.base_port == "auto":
            raise ValueError(
                "--base-port auto: each host would choose its own base; give the same number "
                "on every host, or use --ports os"
            )
        config = config_from_args(args)
        if config.transport in ("inproc", "nixl", "mooncake"):
            raise ValueError(
                f"--transport {config.transport}: hosts talk over tcp (or gloo/nccl for the "
                "tensor frames); a one-sided engine across hosts is not built"
            )
        local_workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if config.transport == "nccl" and local_workers > 1:
            raise ValueError(
                f"--transport nccl with {local_workers} workers on this node: run one worker "
                "per node (--nproc-per-node 1); it places its rank processes on GPUs 0, 1, ..."
            )
        if config.host in ("0.0.0.0", "*", "::"):
            raise ValueError(
                f"--host {config.host}: give this host's own address; it is published to the "
                "other hosts, which must be able to reach it"
            )
        key = run_key(args.key_file)
        worker, workers = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        here = shares(all_ranks(config), workers)[worker]
        validate(config, processes_here=-(-len(here) // config.ranks_per_process))
    except ValueError as error:
        return refuse(str(error))
    join_s = config.timeout  # how long workers wait for each other: the run's --timeout
    try:
        store, _, workers = next(dist.rendezvous("env://", timeout=timedelta(seconds=join_s)))
    except Exception as error:
        print(
            f"{PROG}: worker {worker}: cannot reach the rendezvous store: {error}", file=sys.stderr
        )
        return 2
    env = os.environ
    run = f"{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    # Bound to this torchrun run and its store (a port the OS chose for this run), so a
    # value signed in another run with the same key and --rdzv-id is refused here.
    context = f"{run}@{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    board = Board(store, worker, workers, run, key=board_key(key, context))
    try:
        records = board.join(config.host, config.to_dict(), time.monotonic() + join_s)
        hosts = [str(r.get("host")) for r in records]
        share = shares(all_ranks(config), workers)
        check_host_ports(config, share, hosts, worker)
        board.claim([r.tag for r in share[worker]], config.host)
        secret = RunSecret.derive(key, context)
    except (BoardError, ValueError) as error:
        return refuse(f"worker {worker} on {config.host}: {error}")
    except Exception as error:  # the store's own errors (a timeout, a lost connection)
        print(f"{PROG}: worker {worker}: the rendezvous store failed: {error}", file=sys.stderr)
        return 2
    board.start_watchdog(lambda idle: _cut_off(worker, config.host, idle))
    if worker != 0:
        code, problem = Agent(config, board, secret).serve()
        if problem:
            print(f"{PROG}: worker {worker} on {config.host}: {problem}", file=sys.stderr)
        return code
    return _coordinate(args, config, board, hosts, secret, share)


def _cut_off(worker: int, host: str, idle: float) -> None:
    """The store has not answered for ``idle`` seconds: this host is cut off. End now;
    the rank processes end within a second once their parent is gone."""
    print(
        f"{PROG}: worker {worker} on {host}: cut off: the rendezvous store has not answered "
        f"for {idle:.0f} s; ending this host's ranks",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def _coordinate(
    args: argparse.Namespace,
    config: SimConfig,
    board: Board,
    hosts: list[str],
    secret: RunSecret,
    share: list[list[RankId]],
) -> int:
    exposed = exposure(config)
    if exposed:
        print(f"{PROG}: exposed: {exposed}", file=sys.stderr)
    bar = None if args.quiet else ProgressBar(config.requests * config.replicas)
    coordinator = Coordinator(config, board, hosts, secret, progress=bar.update if bar else None)
    board.start_beating()
    code = 2
    try:
        report = coordinator.run()
        code = _status(report)
    finally:
        if bar:
            bar.close()
        coordinator.tell_exit(code)
    per_host = host_lines(hosts, share, coordinator)
    if args.json != STDOUT:
        print(report.render())
        print("\n".join(per_host))
    if args.json:
        data: dict[str, Any] = report.to_dict()
        data["hosts"] = [
            {
                "worker": w,
                "host": hosts[w],
                "ranks": [r.tag for r in share[w]],
                "lost": coordinator.lost.get(w),
            }
            for w in range(len(hosts))
        ]
        write_json(args.json, data)
    return code


def _status(report: SimReport) -> int:
    """The exit status ``sim run`` gives the same report."""
    if report.interrupted:
        return 130
    if report.setup_error:
        return 2
    return 0 if report.ok else 1


def host_lines(hosts: list[str], share: list[list[RankId]], coordinator: Coordinator) -> list[str]:
    """One line per torchrun worker: its host, its ranks, and whether any died or it was lost."""
    lines = [f"hosts: {len(hosts)} torchrun worker(s)"]
    for w, host in enumerate(hosts):
        tags = [r.tag for r in share[w]]
        dead = [t for t in tags if t in coordinator.dead]
        state = (
            coordinator.lost[w]
            if w in coordinator.lost
            else f"{len(dead)} rank(s) died: {', '.join(dead)}"
            if dead
            else "all ranks ran to the end"
        )
        role = "coordinator" if w == 0 else "agent"
        lines.append(f"  worker {w} ({role}) on {host}: {' '.join(tags)} — {state}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
