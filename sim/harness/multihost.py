"""The cluster across hosts: one :class:`~sim.harness.cluster.Cluster`, its control through
the store.

Under torchrun each worker hosts its share of the sim's ranks as rank processes, and
talks to them exactly as ``sim run`` does: over its own loopback control socket, each
rank proving the run's secret. What differs is only where the parent's decisions are
made. Worker 0 runs the :class:`Coordinator`: the whole run's :class:`Cluster` (the
ready barrier, *go*, results, deaths, *finish*, books, the report), whose commands for
another worker's ranks and whose events from them travel through the board
(:mod:`sim.net.rendezvous`). Every other worker runs an :class:`Agent`: it starts its
ranks, relays their events to the coordinator and the coordinator's commands to them,
reports which of them died and how, and stops them when told or when the coordinator
is lost. Receivers look senders' endpoints up on the board. A worker whose heartbeat
stops (its host died or its link was cut) counts as the death of all its ranks, so its
peers fail the requests they owed with that reason instead of waiting for the deadline.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from sim.books.report import SimReport
from sim.harness.cluster import BOOKS_TIMEOUT_S, STOP_TIMEOUT_S, Cluster, Progress, _Abort
from sim.net.auth import RunSecret
from sim.net.endpoints import RankId
from sim.net.rendezvous import LOST_S, Board
from sim.run.config import SimConfig

POLL_MS = 20
DONE_TIMEOUT_S = STOP_TIMEOUT_S + 3.0
"""How long the coordinator waits for the other workers to confirm their ranks stopped."""
DUMP_TIMEOUT_S = 2.0
EXIT_TIMEOUT_S = 30.0
"""How long a worker whose ranks stopped waits for the coordinator's exit status."""


def shares(ranks: list[RankId], workers: int) -> list[list[RankId]]:
    """Worker ``w`` hosts a fixed, contiguous share of the run's ranks (same on any host)."""
    if workers > len(ranks):
        raise ValueError(
            f"{workers} torchrun workers but the run has only {len(ranks)} ranks: every "
            "worker must host at least one (use fewer workers or a larger run)"
        )
    n = len(ranks)
    return [ranks[w * n // workers : (w + 1) * n // workers] for w in range(workers)]


def senders(ranks: list[RankId], config: SimConfig) -> list[str]:
    return [r.tag for r in ranks if r.stage < config.last_stage]


def torchrun_store() -> tuple[str, int]:
    """The store torchrun's workers share (the address ``env://`` reads), where the rank
    processes of every host meet for ``--transport gloo|nccl`` [sim.net.p2p]."""
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


class Coordinator(Cluster):
    """Worker 0: the run's :class:`Cluster`, its own share local, the rest over the board."""

    def __init__(
        self,
        config: SimConfig,
        board: Board,
        hosts: list[str],
        secret: RunSecret,
        *,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(config, progress=progress)
        self.secret = secret
        self.board = board
        self.host_of_worker = hosts
        self.share = shares(self.ranks, board.workers)
        self.worker_of = {r.tag: w for w, share in enumerate(self.share) for r in share}
        self.others = list(range(1, board.workers))
        self.outbox: dict[int, list[dict[str, Any]]] = {w: [] for w in self.others}
        self.remote_dead: dict[str, str] = {}
        self.lost: dict[int, str] = {}
        self.done: dict[int, dict[str, Any]] = {}
        self.stacks: dict[int, str] = {}
        self.last_check = 0.0

    # -- the seams of Cluster --------------------------------------------------------
    def _start_hosts(self, ranks: list[RankId] | None = None) -> None:
        super()._start_hosts(self.share[0])

    def _p2p_store(self) -> tuple[str, int]:
        return torchrun_store()

    def _p2p_shares(self) -> list[list[RankId]]:
        return self.share

    def _command(self, tag: str, command: dict[str, Any]) -> None:
        worker = self.worker_of[tag]
        if worker == 0:
            if command.get("cmd") == "connect":
                command = {"cmd": "connect", "endpoints": self._endpoints()}
            super()._command(tag, command)
        elif worker not in self.lost:
            if command.get("cmd") == "connect":
                command = {"cmd": "connect"}  # the agent looks the endpoints up itself
            self.outbox[worker].append({"rank": tag, "cmd": command})

    def _broadcast(self, command: dict[str, Any], *, only: list[str] | None = None) -> None:
        if command.get("cmd") in ("go", "finish"):  # for anyone watching the store
            with suppress(_Abort):
                self._guard(lambda: self.board.put("phase", {"phase": command["cmd"]}))
        super()._broadcast(command, only=only)
        with suppress(_Abort):  # booked as an error; the next poll ends the run
            self._flush()

    def _poll(self, timeout_ms: int) -> None:
        self._flush()
        super()._poll(timeout_ms)
        self._pump()

    def _on_event(self, tag: str, event: dict[str, Any]) -> None:
        if event.get("ev") == "bound" and self.worker_of[tag] == 0:
            self._guard(lambda: self.board.publish_endpoint(tag, event.get("endpoint")))
        super()._on_event(tag, event)

    def _find_dead(self) -> list[str]:
        newly = super()._find_dead()
        for tag, how in list(self.remote_dead.items()):
            if tag not in self.dead:
                self.dead[tag] = how
                newly.append(tag)
        return newly

    def _stop(self, *, fast: bool) -> None:
        try:
            super()._stop(fast=fast)
        finally:
            self._end_agents()

    def _dump_stacks(self) -> str:
        local = super()._dump_stacks()
        with suppress(_Abort):
            for worker in self.others:
                if worker not in self.lost:
                    self.outbox[worker].append({"dump": True})
            self._flush()
            end = time.monotonic() + DUMP_TIMEOUT_S
            while time.monotonic() < end and set(self.stacks) | set(self.lost) < set(self.others):
                time.sleep(POLL_MS / 1000)
                self._pump()
        remote = [
            f"=== worker {w} on {self.host_of_worker[w]} ===\n{text}"
            for w, text in sorted(self.stacks.items())
            if text
        ]
        return "\n".join(filter(None, [local, *remote]))

    def _report(self, wall: float) -> SimReport:
        if self.board.forged:  # mailbox batches on the store no worker of this run signed
            self.strangers["forged board messages"] += self.board.forged
        report = super()._report(wall)
        per = max(1, self.config.ranks_per_process)
        report.processes = sum(math.ceil(len(share) / per) for share in self.share)
        return report

    # -- the board -------------------------------------------------------------------
    def _endpoints(self) -> dict[str, str]:
        return self._guard(lambda: self.board.endpoints(senders(self.ranks, self.config)))

    def _guard(self, action: Callable[[], Any]) -> Any:
        """Run a board operation; an unreachable store ends the run with the reason."""
        try:
            return action()
        except Exception as error:  # the store's errors are RuntimeError subclasses
            text = f"the rendezvous store is unreachable: {type(error).__name__}: {error}"
            if self.setup_error is None and not self.ready:
                self.setup_error = text
            self.errors.append(text)
            raise _Abort from None

    def _flush(self) -> None:
        for worker, batch in self.outbox.items():
            if batch and worker not in self.lost:

                def post(w: int = worker, b: list[dict[str, Any]] = batch) -> None:
                    self.board.post(w, b)

                self._guard(post)
            batch.clear()

    def _pump(self) -> None:
        """Events from the other workers' ranks, their deaths, and their liveness."""
        received = self._guard(lambda: self.board.receive(self.others))
        for worker, message in received:
            tag = message.get("rank")
            if "event" in message and isinstance(tag, str) and self.worker_of.get(tag) == worker:
                self._on_event(tag, message["event"])
            elif "died" in message:
                for tag in message.get("died", []):
                    if self.worker_of.get(tag) == worker:
                        self.remote_dead[tag] = str(message.get("how", "its process died"))
            elif "done" in message:
                self.done[worker] = message
                self.strangers.update(message.get("strangers", {}))
            elif "stacks" in message:
                self.stacks[worker] = str(message["stacks"])
            else:
                self.strangers["board messages"] += 1
        now = time.monotonic()
        if now - self.last_check < 1.0:
            return
        self.last_check = now
        for worker in self.others:
            if worker in self.lost or worker in self.done:
                continue

            def silent_for(w: int = worker) -> float:
                return self.board.silent_for(w)

            silent = self._guard(silent_for)
            if silent > LOST_S:
                self.lost[worker] = (
                    f"worker {worker} on {self.host_of_worker[worker]} was lost "
                    f"(no heartbeat for {silent:.0f} s: its host died or its link was cut)"
                )
                for who in self.share[worker]:
                    self.remote_dead.setdefault(who.tag, self.lost[worker])

    def tell_exit(self, code: int) -> None:
        """Every other worker exits with the run's status, so torchrun's agents agree: a
        worker that succeeded while another failed would wait at torchrun's exit barrier."""
        for worker in self.others:
            if worker not in self.lost:
                with suppress(Exception):
                    self.board.post(worker, [{"exit": code}])
        self.board.stop_beating()

    def _end_agents(self) -> None:
        """Tell every other worker the run is over; wait until their ranks have stopped."""
        try:
            for worker in self.others:
                if worker not in self.lost:
                    self.outbox[worker].append({"end": True})
            self._flush()
            end = time.monotonic() + DONE_TIMEOUT_S
            while time.monotonic() < end and set(self.done) | set(self.lost) < set(self.others):
                time.sleep(POLL_MS / 1000)
                self._pump()
        except _Abort:
            return
        silent = sorted(set(self.others) - set(self.done) - set(self.lost))
        if silent:
            self.errors.append(
                f"workers {silent} did not confirm their ranks stopped within "
                f"{DONE_TIMEOUT_S:g} s of the end"
            )


class Agent(Cluster):
    """A worker other than 0: its share of ranks, relayed to and from the coordinator."""

    def __init__(self, config: SimConfig, board: Board, secret: RunSecret) -> None:
        super().__init__(config)
        self.secret = secret
        self.board = board
        self.share = shares(self.ranks, board.workers)[board.worker]
        self.local = {r.tag for r in self.share}
        self.outbox: list[dict[str, Any]] = []
        self.ended = False
        self.last_check = 0.0
        self.connect_endpoints: dict[str, str] | None = None

    def _p2p_store(self) -> tuple[str, int]:
        return torchrun_store()

    def _p2p_shares(self) -> list[list[RankId]]:
        return shares(self.ranks, self.board.workers)

    def serve(self) -> tuple[int, str | None]:
        """Run until the coordinator ends the run: (exit status, the reason when it
        ended otherwise). The status is the coordinator's, so torchrun's agents agree."""
        setup = max(60.0, self.config.timeout)
        deadline = time.monotonic() + 2 * setup + self.config.timeout
        deadline += 2 * BOOKS_TIMEOUT_S + DONE_TIMEOUT_S + 2 * LOST_S
        problem = None
        self.board.start_beating()
        self._open_control()
        try:
            self._start_hosts(self.share)
            while not self.ended:
                self._poll(POLL_MS)
                newly = self._find_dead()
                if newly:
                    self.outbox.append({"died": newly, "how": self.dead[newly[0]]})
                self.board.post(0, self.outbox)
                self.outbox = []
                self._relay()
                if time.monotonic() > deadline:
                    problem = "the run outlived every deadline; the coordinator never ended it"
                    break
        except KeyboardInterrupt:
            problem = "interrupted (Ctrl-C)"
        except Exception as error:  # the store's errors: the coordinator's host is gone
            problem = f"lost the coordinator (worker 0): {type(error).__name__}: {error}"
        finally:
            try:
                self._stop(fast=problem is not None)
            finally:
                self.control.close(linger=0)
                if self.dump_dir is not None:
                    shutil.rmtree(self.dump_dir, ignore_errors=True)
        if problem is not None:
            self.board.stop_beating()
            return 1, problem
        try:
            if self.board.forged:
                self.strangers["forged board messages"] += self.board.forged
            self.board.post(0, [{"done": True, "strangers": dict(self.strangers)}])
            return self._await_exit(), None
        except Exception as error:
            return 1, f"lost the coordinator at the end: {type(error).__name__}: {error}"
        finally:
            self.board.stop_beating()

    def _await_exit(self) -> int:
        """The run's exit status, as the coordinator tells it once its report is made."""
        end = time.monotonic() + EXIT_TIMEOUT_S
        while time.monotonic() < end:
            for _, message in self.board.receive([0]):
                code = message.get("exit")
                if isinstance(code, int) and not isinstance(code, bool):
                    return code
            time.sleep(POLL_MS / 1000)
        raise TimeoutError(f"no exit status from the coordinator within {EXIT_TIMEOUT_S:g} s")

    def _on_event(self, tag: str, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "bound":
            self.board.publish_endpoint(tag, event.get("endpoint"))
        elif kind == "fault":  # _stop must know which ranks hang
            self.announced[tag] = str(event.get("kind"))
        elif kind == "result":
            self.results[self.by_tag[tag]][str(event.get("request"))] = event
        elif kind == "sent":
            self.sender_stats[tag] = event
        elif kind == "ready" and event.get("sends"):
            self.active_senders.add(tag)
        self.outbox.append({"rank": tag, "event": event})

    def _relay(self) -> None:
        for _, message in self.board.receive([0]):
            tag, command = message.get("rank"), message.get("cmd")
            if isinstance(tag, str) and tag in self.local and isinstance(command, dict):
                if command.get("cmd") == "connect":
                    if self.connect_endpoints is None:
                        self.connect_endpoints = self.board.endpoints(
                            senders(self.ranks, self.config)
                        )
                    command = {"cmd": "connect", "endpoints": self.connect_endpoints}
                self._command(tag, command)
            elif message.get("dump"):
                self.board.post(0, [{"stacks": self._dump_stacks()}])
            elif message.get("end"):
                self.ended = True
        now = time.monotonic()
        if now - self.last_check >= 1.0:
            self.last_check = now
            silent = self.board.silent_for(0)
            if silent > LOST_S:
                raise TimeoutError(f"no heartbeat from worker 0 for {silent:.0f} s")
