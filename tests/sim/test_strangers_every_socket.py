"""Another user against every socket a run listens on (issue 45, [sim.net.auth]).

Once every rank has bound and readied, and before the coordinator says go, the ports the
run's processes listen on are read from ``/proc`` (what ``ss -ltnp`` shows: the ZeroMQ
control and KV sockets, and whatever a transfer engine opened) and handed to a stranger
of uid ``nobody`` (:mod:`tests.sim.stranger_uid`): junk, oversize, forged hellos, reads
and events, cut streams, slow connections held through the run, and more of the same
while the run goes on. For a plain run (push, pull), a hybrid and each one-sided
engine that loads here, every request must still verify, no rank die, nothing reach the
stranger and every port the run listens on be attacked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import Cluster
from sim.paths.onesided_checks import unloadable
from sim.run.config import ONE_SIDED_LIBRARIES, SimConfig
from tests.paths import ROOT
from tests.sim.runs import MHA, assert_all_verified, small_run
from tests.sim.test_sim_hybrid import EVERY_KIND, hybrid_run

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/net/tcp").exists(),
    reason="acting as another uid needs root (setuid) and /proc",
)

LISTEN = "0A"
"""A TCP socket's state in ``/proc/net/tcp``: listening."""


def listening_ports(pids: list[int]) -> set[int]:
    """The TCP ports the processes ``pids`` listen on, from ``/proc`` (IPv4 and IPv6)."""
    by_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                by_inode[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    ports = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir() if fds.exists() else ():
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                port = by_inode.get(link[len("socket:[") : -1])
                if port is not None:
                    ports.add(port)
    return ports


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


class _StrangerCluster(Cluster):
    """A run that, just before go, hands every port its rank processes listen on (and its
    own control port) to a stranger of another uid, and lets it go on attacking through
    the run."""

    rounds = 2

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.stranger: Any = None
        self.first: dict[str, int] = {}
        self.ports: set[int] = set()

    def _broadcast(self, message: dict, **how: Any) -> None:
        if message.get("cmd") == "go" and self.stranger is None:
            self._let_the_stranger_in()
        super()._broadcast(message, **how)

    def _let_the_stranger_in(self) -> None:
        pids = [h.process.pid for h in self.hosts if h.process is not None]
        assert self.control_endpoint is not None
        self.ports = listening_ports(pids) | {_port(self.control_endpoint)}
        self.stranger = subprocess.Popen(
            [sys.executable, "-m", "tests.sim.stranger_uid"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.stranger.stdin is not None and self.stranger.stdout is not None
        self.stranger.stdin.write(json.dumps({"ports": sorted(self.ports), "rounds": self.rounds}))
        self.stranger.stdin.write("\n")
        self.stranger.stdin.flush()
        self.first = json.loads(self.stranger.stdout.readline())

    def finish(self) -> dict[str, int]:
        """Close the stranger's standard input and read its final counts."""
        out, _ = self.stranger.communicate(timeout=120)
        assert self.stranger.returncode == 0, out
        return json.loads(out.splitlines()[-1])


def _engine(transport: str) -> Any:
    module, install = ONE_SIDED_LIBRARIES[transport]
    why = unloadable(module)
    mark = pytest.mark.skipif(why is not None, reason=f"{module} {why} ({install})")
    return pytest.param(transport, marks=mark, id=transport)


def _plain(transfer: str, transport: str = "tcp") -> SimConfig:
    return small_run(
        (StageLayout(2), StageLayout(2)),
        MHA,
        requests=4,
        transfer=transfer,
        transport=transport,
        allow_unauthenticated_transport=transport == "mooncake",
    )


RUNS = {
    "push": lambda: _plain("push"),
    "pull": lambda: _plain("pull"),
    "hybrid pull": lambda: hybrid_run(
        StageLayout(2), StageLayout(2), EVERY_KIND, requests=4, transfer="pull"
    ),
}
"""The runs attacked over ZeroMQ alone: a plain run's two kinds of KV socket (a sender's,
pushed from; a source's, read from), and a hybrid's. ``write`` binds what ``pull`` does."""


def _attacked(config: SimConfig) -> tuple[SimReport, _StrangerCluster, dict[str, int]]:
    cluster = _StrangerCluster(config)
    try:
        report = cluster.run()
    finally:
        final = cluster.finish() if cluster.stranger is not None else {}
    return report, cluster, final


def _assert_held(report: SimReport, cluster: _StrangerCluster, final: dict[str, int]) -> None:
    assert cluster.first["uid"] == final["uid"] == 65534, "the stranger was not another user"
    endpoints = {_port(e) for e in cluster.endpoints.values()}
    assert endpoints <= cluster.ports, "a KV port was not found among the listening ones"
    assert cluster.first["held"] == len(cluster.ports), cluster.first
    assert final["sent"] > cluster.first["sent"] > 0, (cluster.first, final)
    assert_all_verified(report)
    assert not report.dead, f"a stranger killed {report.dead}"
    assert cluster.first["received"] == 0, "a stranger received something"
    assert sum(report.strangers.values()) >= 1, report.strangers


@pytest.mark.parametrize("name", sorted(RUNS))
def test_another_user_on_every_port_costs_no_request(name: str) -> None:
    report, cluster, final = _attacked(RUNS[name]())
    _assert_held(report, cluster, final)


@pytest.mark.parametrize(
    ("transport", "transfer"),
    [pytest.param(*_engine("nixl").values, "write", marks=_engine("nixl").marks, id="nixl-write"),
     pytest.param(*_engine("mooncake").values, "pull", marks=_engine("mooncake").marks,
                  id="mooncake-pull")],
)  # fmt: skip
def test_another_user_on_every_port_of_a_one_sided_run_costs_no_request(
    transport: str, transfer: str
) -> None:
    """The engine's own ports too (Mooncake's RPC and data ports, UCX's listeners): the
    junk of a stranger ends no run. (A Mooncake stranger that speaks the engine's protocol
    reads and writes the caches: that run is refused without
    --allow-unauthenticated-transport, test_sim_nixl.py.)"""
    config = _plain(transfer, transport)
    report, cluster, final = _attacked(config)
    _assert_held(report, cluster, final)
    assert cluster.control_endpoint is not None
    zmq_ports = {_port(e) for e in cluster.endpoints.values()} | {_port(cluster.control_endpoint)}
    assert cluster.ports - zmq_ports, f"the {transport} engine's ports were not found"
