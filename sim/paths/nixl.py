"""``--transport nixl``: the one-sided paths (:mod:`sim.paths.onesided`) through NIXL over UCX,
on DRAM (``pip install 'kvspec[nixl]'``: ``nixl-cu12``, usable on CPU).

Each rank process owns one ``nixl_agent`` with the UCX backend and no progress thread
(NIXL's spins a core; the rank's loop progresses the agent instead, every
:attr:`~sim.paths.onesided.OneSidedPath.poll_ms`). Its metadata is
``get_agent_metadata()``, read on the other side by ``add_remote_agent`` — NIXL's own
deserializer, no pickle — and accepted only when the name it returns is the agent name
the peer must have. A key's list is one ``initialize_xfer`` of two Nx3 DRAM descriptor
lists with the notification riding on it (:attr:`NixlEngine.notifies`); completion is
``check_xfer_state`` for the initiator and ``get_new_notifs`` for the peer. UCX is held
to loopback (``UCX_NET_DEVICES=lo``); on this kind of machine it carries RMA as active
messages over TCP (its shared-memory transports lack the peer-failure handling NIXL asks
for), so both sides must progress, which the rank's loop does.
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

import numpy as np

from sim.paths.onesided import OneSidedPath
from sim.paths.onesided_checks import quiet_engines
from sim.run.config import ONE_SIDED_LIBRARIES

MODULE, INSTALL = ONE_SIDED_LIBRARIES["nixl"]
"""The NIXL package's module, and how to install it."""


class NixlEngine:
    """A NIXL agent (:class:`sim.paths.onesided.Engine`)."""

    label: ClassVar[str] = "NIXL"
    notifies: ClassVar[bool] = True

    def open(self, name: str, regions: list[tuple[int, int]]) -> bytes:
        os.environ["UCX_NET_DEVICES"] = "lo"  # before UCX starts in this process
        quiet_engines()  # NIXL's log goes to stdout
        from nixl_cu12 import nixl_agent, nixl_agent_config

        logging.getLogger("nixl").setLevel(logging.WARNING)
        self.agent: Any = nixl_agent(
            name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        )
        rows = np.array([[a, n, 0] for a, n in regions], dtype=np.uint64)
        self.agent.register_memory(rows, "DRAM")
        return bytes(self.agent.get_agent_metadata())

    def add_peer(self, name: str, metadata: bytes) -> bool:
        added = self.agent.add_remote_agent(metadata)
        return bool((added.decode() if isinstance(added, bytes) else added) == name)

    def post(self, op: str, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes) -> Any:
        def dram(rows: np.ndarray) -> Any:
            with_dev = np.concatenate([rows, np.zeros((len(rows), 1), rows.dtype)], axis=1)
            return self.agent.get_xfer_descs(with_dev.astype(np.uint64), "DRAM")

        handle = self.agent.initialize_xfer(op, dram(local), dram(remote), peer, notif)
        if self.agent.transfer(handle) == "ERR":
            self.release(handle)
            raise RuntimeError(f"NIXL refused to post the {op}")
        return handle

    def state(self, handle: Any) -> str:
        return str(self.agent.check_xfer_state(handle))

    def release(self, handle: Any) -> None:
        self.agent.release_xfer_handle(handle)

    def notify(self, peer: str, message: bytes) -> None:
        self.agent.send_notif(peer, message)

    def notifications(self) -> list[tuple[str, bytes]]:
        got = self.agent.get_new_notifs()
        return [
            (who.decode() if isinstance(who, bytes) else str(who), bytes(note))
            for who, notes in got.items()
            for note in notes
        ]


class NixlPath(OneSidedPath):
    """The pull or write path of one rank through NIXL."""

    engine_class = NixlEngine
