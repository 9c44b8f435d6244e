"""``--transport mooncake``: the one-sided paths (:mod:`sim.paths.onesided`) through the Mooncake
transfer engine over TCP, on DRAM (``pip install 'kvspec[mooncake]'``:
``mooncake-transfer-engine-non-cuda``, which needs ``libibverbs1`` from the system even
over TCP).

Each rank process starts one ``TransferEngine`` as ``initialize("127.0.0.1",
"P2PHANDSHAKE", "tcp", "")`` — no metadata server: peers find each other's segments by
a handshake on the engine's RPC port — and registers its cache regions. Its metadata
for a peer is a JSON object naming its agent name and its RPC endpoint
(``127.0.0.1:PORT``), parsed strictly by :meth:`MooncakeEngine.add_peer`. A key's list is
one ``batch_transfer_sync_read`` or ``batch_transfer_sync_write`` of (address, length)
rows: Mooncake's Python API waits for a batch (``get_batch_transfer_status`` blocks too),
so a transfer is posted and done in one call, and the rank's loop is busy meanwhile.

**A list longer than the engine's queue.** Mooncake's TCP transport admits at most
``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`` transfers (rows) to one peer at once (1024 by
default); past that a second queue of ``MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER`` (1024)
waits up to ``MC_TCP_ADMISSION_TIMEOUT_MS`` (1000 ms) for room, and a row beyond both
fails at once ("TCP lane queue-full rejection", ``tcp_transport.cpp``), failing the whole
batch with -1. A key's list grows with the request (TP4 -> TP2 over ``flash_attn``, 4
layers: 8 rows a token, so 3,072 from 384 tokens), so :func:`batch_transfer` posts it as
consecutive batches of at most :func:`queue_depth` rows, each waited for, which never
leaves a row to wait for admission: the same rows, in order, at any size.

The engine carries no notification with a transfer (:attr:`MooncakeEngine.notifies` is
False): the one-sided path sends it over the run's verified connection once the
transfer is done, which also keeps it in order with the end-of-stream.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from sim.net import messages
from sim.paths.onesided import OneSidedPath
from sim.paths.onesided_checks import quiet_engines
from sim.run.config import ONE_SIDED_LIBRARIES

MODULE, INSTALL = ONE_SIDED_LIBRARIES["mooncake"]
"""The Mooncake transfer engine's module, and how to install it."""
_RPC = re.compile(r"127\.0\.0\.1:[0-9]{1,5}")
_WHOLE = re.compile(r"\s*\+?[0-9]{1,12}")
QUEUE_VARIABLE = "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"
QUEUE_DEFAULT = 1024
"""The transfers Mooncake's TCP transport admits to one peer at once unless
:data:`QUEUE_VARIABLE` says otherwise (it takes 1 to 65535: ``tcp_transport.cpp``)."""

Batch = Callable[[str, list[int], list[int], list[int]], int]
"""``TransferEngine.batch_transfer_sync_write`` or ``_read``: (peer, local addresses,
remote addresses, lengths) -> 0, or a negative status."""


def queue_depth() -> int:
    """How many rows one batch may hold so that none waits for admission: the value of
    :data:`QUEUE_VARIABLE` in this process where the engine takes it (a whole number from
    1 to 65535, as its ``strtoull`` reads it), else :data:`QUEUE_DEFAULT`, which the
    engine then uses too."""
    value = os.environ.get(QUEUE_VARIABLE, "")
    depth = int(value) if _WHOLE.fullmatch(value) else 0
    return depth if 1 <= depth <= 65535 else QUEUE_DEFAULT


def batch_transfer(
    move: Batch, peer: str, local: np.ndarray, remote: np.ndarray, op: str = "WRITE"
) -> str | None:
    """Move the (address, length) rows of ``local`` to or from ``remote``'s at ``peer`` as
    consecutive batches of at most :func:`queue_depth` rows, each waited for; None when
    every batch is done, else which rows failed and the status the engine returned (the
    rest not posted)."""
    depth = queue_depth()
    here, there, lengths = local[:, 0].tolist(), remote[:, 0].tolist(), local[:, 1].tolist()
    for start in range(0, len(lengths), depth):
        end = start + depth
        status = int(move(peer, here[start:end], there[start:end], lengths[start:end]))
        if status != 0:
            rows = f"rows {start}..{min(end, len(lengths)) - 1} of {len(lengths)}"
            return f"the Mooncake batch {op} of {rows} to {peer} returned {status}"
    return None


START_TRIES = 8
"""How many engines a rank starts before it gives up on a free port: the engine picks its
own RPC and data ports, and another process on the host (a rank of this run or of another)
can take one between its pick and its bind."""


def _started(engine_class: Callable[[], Any]) -> Any:
    """A Mooncake engine started on 127.0.0.1 over TCP, a fresh one tried again when the
    port it picked was taken meanwhile ("bind: Address already in use")."""
    for attempt in range(START_TRIES):
        engine = engine_class()
        try:
            status = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        except RuntimeError as error:
            if "Address already in use" not in str(error) or attempt == START_TRIES - 1:
                raise
            continue
        if status != 0:
            raise RuntimeError("the Mooncake transfer engine did not start on 127.0.0.1 (tcp)")
        return engine
    raise AssertionError("unreachable")


class MooncakeEngine:
    """A Mooncake ``TransferEngine`` (:class:`sim.paths.onesided.Engine`)."""

    label: ClassVar[str] = "Mooncake"
    notifies: ClassVar[bool] = False

    def open(self, name: str, regions: list[tuple[int, int]]) -> bytes:
        quiet_engines()
        from mooncake.engine import TransferEngine

        self.engine: Any = _started(TransferEngine)
        for address, length in regions:
            if self.engine.register_memory(address, length) != 0:
                raise RuntimeError(f"Mooncake refused to register {length} bytes of DRAM")
        self.hosts: dict[str, str] = {}
        rpc = f"127.0.0.1:{self.engine.get_rpc_port()}"
        return messages.dump({"agent": name, "rpc": rpc})

    def add_peer(self, name: str, metadata: bytes) -> bool:
        try:
            peer = messages.load(metadata, limit=messages.MAX_ENVELOPE)
        except (messages.MessageError, json.JSONDecodeError):
            return False
        rpc = peer.get("rpc")
        if set(peer) != {"agent", "rpc"} or peer["agent"] != name or not isinstance(rpc, str):
            return False
        if not _RPC.fullmatch(rpc) or not 0 < int(rpc.split(":")[1]) < 65536:
            return False
        self.hosts[name] = rpc
        return True

    def post(self, op: str, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes) -> Any:
        move = (
            self.engine.batch_transfer_sync_read
            if op == "READ"
            else self.engine.batch_transfer_sync_write
        )
        return batch_transfer(move, self.hosts[peer], local, remote, op)

    def state(self, handle: Any) -> str:
        return "DONE" if handle is None else f"ERR {handle}"

    def release(self, handle: Any) -> None:
        return

    def notify(self, peer: str, message: bytes) -> None:
        raise NotImplementedError("Mooncake carries no notification: sim.paths.onesided sends it")

    def notifications(self) -> list[tuple[str, bytes]]:
        return []


class MooncakePath(OneSidedPath):
    """The pull or write path of one rank through the Mooncake transfer engine."""

    engine_class = MooncakeEngine
