"""A stranger of another uid (``nobody``) against listening ports: ``python -m
tests.sim.stranger_uid`` (issue 45).

It is started as root, because this machine's Python lives under ``/root``, which other
users cannot reach; it imports everything it needs, then drops to uid and gid 65534 for
good before it opens a socket, so every connection the run sees is another user's.

It reads one JSON line on standard input, ``{"ports": [...], "rounds": N}``, and then:

1. sends every hostile sequence of :mod:`tests.sim.test_hostile_sequences` (ZeroMQ
   multipart messages of every shape, forged hellos, reads and control events, raw byte
   streams cut anywhere) to every port, once;
2. sends a forged pull read to every port and waits for any reply: what it receives is
   counted (KV, or anything else);
3. opens a slow connection to every port (half a ZeroMQ greeting) and holds it;
4. writes ``{"uid", "sent", "received", "held"}`` as one line and, while the run goes on,
   sends the sequences ``rounds`` more times (a port gone meanwhile is skipped), until
   standard input closes; then it writes the final counts as a second line and exits.
"""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401 - socket's lookups load it lazily, from /root
import json
import os
import socket
import sys

import zmq

from tests.sim.test_hostile_sequences import ZMQ_SEQUENCES, _attack, _greeting

NOBODY = 65534


def _drop_privileges() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit("the stranger is still root")


def _replies(endpoints: list[str]) -> int:
    """Bytes that come back to forged reads, one per endpoint."""
    context = zmq.Context.instance()
    received = 0
    for endpoint in endpoints:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart(ZMQ_SEQUENCES["forged pull read"])
        while sock.poll(300):
            received += sum(len(f) for f in sock.recv_multipart())
        sock.close()
    return received


def _held(ports: list[int]) -> list[socket.socket]:
    """A slow connection to every port: half a greeting, then nothing."""
    held = []
    for port in ports:
        with contextlib.suppress(OSError):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(_greeting()[:5])
            held.append(conn)
    return held


def main() -> None:
    order = json.loads(sys.stdin.readline())
    ports, rounds = [int(p) for p in order["ports"]], int(order["rounds"])
    _drop_privileges()
    endpoints = [f"tcp://127.0.0.1:{p}" for p in ports]
    sent = _attack(endpoints, 1)
    received = _replies(endpoints)
    held = _held(ports)
    counts = {"uid": os.getuid(), "sent": sent, "received": received, "held": len(held)}
    print(json.dumps(counts), flush=True)
    for _ in range(rounds):  # while the run goes on; its ports close at its end
        for endpoint in endpoints:
            with contextlib.suppress(OSError):
                counts["sent"] += _attack([endpoint], 1)
    sys.stdin.read()  # until the run is over
    for conn in held:
        conn.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
