"""The processes (or, in-process, the threads) that host a run's ranks: how they start
(fork where it is safe, else spawn) and what each runs (:func:`sim.rank.loop.run_ranks`)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiprocess

from sim.net.endpoints import RankId
from sim.rank.loop import run_ranks


@dataclass
class Host:
    """A group of ranks sharing one process (or, in-process, one thread per rank)."""

    tags: list[RankId]
    process: Any = None
    threads: list[threading.Thread] = field(default_factory=list)
    dump_file: Path | None = None

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        return any(t.is_alive() for t in self.threads)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.exitcode


def process_context(device: str) -> Any:  # a multiprocess context (the package is untyped)
    """fork where it is safe: ranks start in milliseconds with torch already imported.

    CUDA does not survive a fork, so ranks on a GPU (and ranks off Linux) are spawned.
    """
    fork = sys.platform.startswith("linux") and device != "cuda"
    return multiprocess.get_context("fork" if fork else "spawn")


def host_main(
    config_json: dict[str, Any],
    tags: list[tuple[int, int, int]],
    control: str,
    secret: str,
    dump_file: str,
    parent: int,
    p2p: dict[str, Any] | None = None,
) -> None:
    """Entry point of a rank-hosting process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    dump = open(dump_file, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)

    def orphan_watch() -> None:  # never outlive the parent
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=orphan_watch, daemon=True).start()
    run_ranks(config_json, tags, control, secret, p2p=p2p)
