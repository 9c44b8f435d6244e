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
so a transfer is posted and done in one call, and the rank's loop is busy meanwhile. The
engine carries no notification with a transfer (:attr:`MooncakeEngine.notifies` is
False): the one-sided path sends it over the run's verified connection once the
transfer is done, which also keeps it in order with the end-of-stream.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import numpy as np

from sim.net import messages
from sim.paths.onesided import OneSidedPath
from sim.paths.onesided_checks import quiet_engines
from sim.run.config import ONE_SIDED_LIBRARIES

MODULE, INSTALL = ONE_SIDED_LIBRARIES["mooncake"]
"""The Mooncake transfer engine's module, and how to install it."""
_RPC = re.compile(r"127\.0\.0\.1:[0-9]{1,5}")


class MooncakeEngine:
    """A Mooncake ``TransferEngine`` (:class:`sim.paths.onesided.Engine`)."""

    label: ClassVar[str] = "Mooncake"
    notifies: ClassVar[bool] = False

    def open(self, name: str, regions: list[tuple[int, int]]) -> bytes:
        quiet_engines()
        from mooncake.engine import TransferEngine

        self.engine: Any = TransferEngine()
        if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("the Mooncake transfer engine did not start on 127.0.0.1 (tcp)")
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
        return int(
            move(
                self.hosts[peer], local[:, 0].tolist(), remote[:, 0].tolist(), local[:, 1].tolist()
            )
        )

    def state(self, handle: Any) -> str:
        return "DONE" if handle == 0 else f"ERR the Mooncake transfer returned {handle}"

    def release(self, handle: Any) -> None:
        return

    def notify(self, peer: str, message: bytes) -> None:
        raise NotImplementedError("Mooncake carries no notification: sim.paths.onesided sends it")

    def notifications(self) -> list[tuple[str, bytes]]:
        return []


class MooncakePath(OneSidedPath):
    """The pull or write path of one rank through the Mooncake transfer engine."""

    engine_class = MooncakeEngine
