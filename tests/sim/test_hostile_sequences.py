"""Hostile frame sequences against every socket a sim run binds (issue 30, [sim.net.auth]).

A stranger on the host sees the run's listening ports (``ss -ltn``) and nothing else. It
replays, against the coordinator's control socket and every sender's KV socket, the
sequences that put a ZeroMQ socket in danger: multipart messages of every shape, a part
over the socket's size limit after a small one, forged hellos and pull reads, and, over
raw TCP below ZeroMQ, a connection cut in the middle of a multipart message or of one
frame. The run must still verify every request, and no rank may die (libzmq aborts a
process when a socket reaches an invalid state, which would show as a dead rank).

The sequences are data (:data:`ZMQ_SEQUENCES`, :data:`RAW_SEQUENCES`); each is sent a
fixed number of times, never for a span of time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import Cluster
from sim.net import messages
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from tests.sim.runs import MHA, assert_all_verified, small_run

OVER_LIMIT = messages.MAX_CONTROL + 1
"""Bigger than the control limit and than a small run's KV-socket limit."""

_READ = json.dumps({"read": "req_0_0_0_0", "n": 1, "seq": 0}).encode()

ZMQ_SEQUENCES: dict[str, list[bytes]] = {
    "one empty part": [b""],
    "three empty parts": [b"", b"", b""],
    "sixty-four parts": [b"x"] * 64,
    "over the limit after a small part": [b"a", b"x" * OVER_LIMIT],
    "over the limit, then more parts": [b"x" * OVER_LIMIT, b"b", b"c"],
    "forged hello": [messages.hello(0, "00" * 16, "forged")],
    "forged hello with a trailing part": [messages.hello(0, "00" * 16, "forged"), b"junk"],
    "forged pull read": [_READ, b"\0" * 40],
    "forged pull read, four parts": [_READ, b"\0" * 40, b"", b"x"],
    "not json": [b"\x80\x04not json"],
    "forged control event": [b'{"ev": "result", "request": "req-0-0000", "ok": false}'],
}
"""Multipart messages a stranger's DEALER sends to a bound socket."""


def _greeting() -> bytes:
    """ZMTP 3.0, NULL mechanism, as a client (RFC 23)."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    body = bytes([len(name)]) + name
    for key, value in properties.items():
        body += bytes([len(key)]) + key + struct.pack(">I", len(value)) + value
    return b"\x04" + bytes([len(body)]) + body


def _frame(body: bytes, *, more: bool) -> bytes:
    return bytes([1 if more else 0, len(body)]) + body


_READY = _command(b"READY", {b"Socket-Type": b"DEALER"})

RAW_SEQUENCES: dict[str, bytes] = {
    "garbage before any greeting": b"GET / HTTP/1.0\r\n\r\n" * 4,
    "greeting, then cut": _greeting(),
    "cut in the middle of a multipart message": _greeting()
    + _READY
    + _frame(b"first", more=True)
    + _frame(b"second", more=True),
    "cut in the middle of one frame": _greeting() + _READY + b"\x01\x64" + b"x" * 10,
    "a frame claiming 2**62 bytes": _greeting() + _READY + b"\x03" + struct.pack(">Q", 1 << 62),
    "a socket type that cannot talk to it": _greeting()
    + _command(b"READY", {b"Socket-Type": b"SUB"})
    + _frame(b"x", more=False),
}
"""Byte streams a stranger writes on a raw TCP connection and then closes."""


def _host_port(endpoint: str) -> tuple[str, int]:
    host, _, number = endpoint.removeprefix("tcp://").rpartition(":")
    return host, int(number)


def _attack(endpoints: list[str], rounds: int) -> int:
    """Every sequence ``rounds`` times against every endpoint; returns how many were sent."""
    context = zmq.Context.instance()
    sent = 0
    for _ in range(rounds):
        for endpoint in endpoints:
            for frames in ZMQ_SEQUENCES.values():
                stranger = context.socket(zmq.DEALER)
                stranger.setsockopt(zmq.LINGER, 200)
                stranger.connect(endpoint)
                stranger.send_multipart(frames)
                stranger.close()
                sent += 1
            for stream in RAW_SEQUENCES.values():
                address = _host_port(endpoint)
                # a socket that refuses us part-way is within its rights
                with (
                    socket.create_connection(address, timeout=5) as raw,
                    contextlib.suppress(OSError),
                ):
                    raw.sendall(stream)
                sent += 1
    return sent


class _AttackedCluster(Cluster):
    """A run whose coordinator, once every rank has bound and before any rank connects,
    waits while a stranger attacks what ``ss -ltn`` would show it: the control socket and
    every sender's KV socket. Every sequence thus reaches live sockets, however busy the
    machine, and the ranks read it while the run goes on."""

    rounds = 2
    sent = 0

    def _on_bound_all(self) -> None:
        super()._on_bound_all()
        assert self.control_endpoint is not None
        targets = [self.control_endpoint, *(ep for ep in self.endpoints.values() if ep)]
        self.sent = _attack(targets, self.rounds)


def _run_attacked(config: SimConfig) -> tuple[SimReport, int]:
    cluster = _AttackedCluster(config)
    report = cluster.run()
    return report, cluster.sent


class _AbortedCluster(Cluster):
    """A run in which one sender's process aborts (SIGABRT, as libzmq's failed assertions
    do) once every rank has bound. ``aborted`` is that process, to read how it died."""

    aborted: Any = None

    def _on_bound_all(self) -> None:
        super()._on_bound_all()
        sender = next(h for h in self.hosts if any(who.stage == 0 for who in h.tags))
        self.aborted = sender.process
        os.kill(sender.process.pid, signal.SIGABRT)


def _config(transfer: str) -> SimConfig:
    return small_run(
        (StageLayout(2), StageLayout(2)),
        MHA,
        requests=30,
        transfer=transfer,
        faults=parse_faults("delay=5ms"),
    )


@pytest.mark.parametrize("transfer", ["push", "pull", "write"])
def test_hostile_sequences_cost_no_verified_request(transfer: str) -> None:
    report, sent = _run_attacked(_config(transfer))
    assert sent > 0, "the stranger never found a socket to attack"
    assert_all_verified(report)
    assert not report.dead, f"a stranger killed {report.dead}"
    assert sum(report.strangers.values()) >= 1, report.strangers


def test_a_rank_that_aborts_is_reported_dead_and_its_requests_fail_with_reasons() -> None:
    """Should any socket still abort its process, the run says which rank died and how,
    and accounts for every request, instead of running into its deadline."""
    config = _config("pull")
    cluster = _AbortedCluster(config)
    report = cluster.run()
    assert len(report.dead) == 1, report.render()
    # The report must name the signal the OS says the process died of. That is SIGABRT
    # alone, but under pytest the fork inherits pytest's faulthandler, whose SIGABRT
    # handler can itself fault while it dumps every thread (CI saw signal 11), so the
    # truth, not a constant, is what the report is held to.
    code = cluster.aborted.exitcode
    assert code is not None and code < 0, f"the aborted rank exited with {code}"
    assert f"killed by signal {-code}" in report.render()
    assert report.verified + report.failed == config.requests
    assert report.failed >= 1
    assert not report.timed_out, "the run waited for its deadline instead"
    assert all(o.reasons for o in report.outcomes if not o.ok)


def test_every_sequence_is_exercised() -> None:
    """The tables hold what the docstring promises, so a trimmed table is noticed."""
    shapes: dict[str, Callable[[Any], bool]] = {
        "a part over the limit": lambda fs: any(len(f) > messages.MAX_CONTROL for f in fs),
        "more than two parts": lambda fs: len(fs) > 2,
        "an empty part": lambda fs: b"" in fs,
    }
    for name, has in shapes.items():
        assert any(has(frames) for frames in ZMQ_SEQUENCES.values()), name
    assert any(b"\x01" in s[64:] for s in RAW_SEQUENCES.values())
