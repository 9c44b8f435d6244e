"""``--transfer write``: senders write each edge's byte runs straight from their cache into
the receivers' caches — the zero-copy data path.

A write connector (NIXL's or Mooncake's WRITE, an RDMA write) moves the bytes the spec's
descriptor list names [DESC-1..3] from the sender's registered memory into the
receiver's, without building tensors on either side. Here both ranks compute the same
runs (:func:`kvspec.memory.descriptors.plan_runs`) from the configuration and the
workload, as a pull run does (:mod:`sim.paths.pull`), so the message carries nothing but an
envelope and the bytes: ``[envelope, frame 0, frame 1, ...]`` framed by
:func:`sim.paths.byteruns.framing` — long runs as views of the sender's cache (nothing is
copied to send them), short runs packed by one vectorised gather — and the receiver
copies each byte once, into its cache (:func:`sim.paths.byteruns.land`). There is no payload
assembly, no merge and no scatter: the bytes are where they belong on arrival.

With checksums on, the envelope carries ``ranges_crc`` and ``ranges_alg``: the CRC of
every frame in order, by the fastest algorithm here (:func:`kvspec.transport.checksums.
fastest`: CRC-32C in hardware when the ``crc32c`` package is installed, else CRC-32)
[WIRE-6, WIRE-7]; a receiver checks it before writing a byte. Faults strike these
messages as they strike pull answers, and are booked the same way.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from kvspec.memory.descriptors import plan_runs
from sim.cache.staging import Slot, StagingRing
from sim.paths.byteruns import Framing, frames_from, framing, land, packed_nbytes
from sim.paths.datapath import Incoming, PathPorts
from sim.paths.regions import RegionPath

STAGING_SLOTS = 4
"""Packed messages a sender has in flight before it waits for zmq to let one go."""

PREPARED = 32
"""Keys per rank and direction whose runs are framed before the run starts."""


class WriteAgent(RegionPath):
    """The write data path of one rank (:class:`sim.paths.datapath.DataPath`): as a sender it
    pushes each key's runs once the request is in its cache; as a receiver it lands them.
    It posts no reads and answers none (a read on its socket is refused and counted)."""

    def __init__(self, ep: PathPorts) -> None:
        super().__init__(ep)
        self.keys_by_request: dict[str, list[str]] = defaultdict(list)
        self.framings: dict[str, Framing] = {}
        self.ring = StagingRing(STAGING_SLOTS, 0, pin=False)

    def prepare(self) -> None:
        """Before the ready barrier, as a connector registers its memory and prepares its
        descriptor lists at allocation, off the data path: the regions, and the first
        :data:`PREPARED` keys each way framed."""
        self.start()

    def start(self) -> None:
        if self.started:
            return
        ep = self.ep
        self.register()
        self.regions = list(self.buffers.values())
        for key, (request_id, _, _) in self.keys_of.items():
            self.keys_by_request[request_id].append(key)
        # As a connector prepares its descriptor lists when blocks are allocated, not on
        # the data path: the first PREPARED keys each way are framed now, the rest when
        # they move (memory stays bounded on long runs).
        me = ep.view.who.rank
        for key, (request_id, chunk, dst) in list(self.keys_of.items())[:PREPARED]:
            self.framings[key] = self._framing(request_id, chunk, me, dst, as_sender=True)
        for key, (request_id, chunk, src) in ep.inbound.owners()[:PREPARED]:
            self.framings[key] = self._framing(request_id, chunk, src, me, as_sender=False)
        # The staging a sender packs short runs into, allocated and touched now, as a
        # connector registers its buffers [sim.cache.staging].
        packed = [packed_nbytes(f) for k, f in self.framings.items() if k in self.keys_of]
        if packed:
            self.ring.reserve(max(packed))

    def _framed(
        self, key: str, request_id: str, chunk: int, src: int, dst: int, *, as_sender: bool
    ) -> Framing:
        """The prepared framing of ``key``, or one made now."""
        made = self.framings.pop(key, None)
        if made is None:
            made = self._framing(request_id, chunk, src, dst, as_sender=as_sender)
        return made

    def _framing(
        self, request_id: str, chunk: int, src: int, dst: int, *, as_sender: bool
    ) -> Framing:
        """The runs of one (request, chunk, edge), framed; both sides compute the same
        [DESC-1..3, CHUNK-1, PLAN-6]."""
        return framing(plan_runs(*self.share(request_id, chunk, src, dst, as_sender=as_sender)))

    # -- sender ------------------------------------------------------------------------------
    def post(self, request_id: str) -> None:
        """``request_id`` is in this rank's cache: write every key of it, chunk by chunk."""
        self.ready_requests.add(request_id)
        for key in self.keys_by_request.get(request_id, []):
            _, chunk, dst = self.keys_of[key]
            if self.ep.out.is_skipped(dst, key):
                continue
            self._write_key(dst, key, request_id, chunk)

    def on_read(self, frames: list[bytes]) -> None:
        self.ep.view.stats["reads_refused"] += 1  # a write run takes no reads

    def _write_key(self, dst: int, key: str, request_id: str, chunk: int) -> None:
        """Send one key's runs, with the run's faults applied and booked [sim.run.faults]."""
        ep = self.ep
        if ep.out.aborted(request_id, dst):
            ep.out.skip_key(dst, key, "a receiver of the request aborted it")
            return
        ep.out.mark_sent(dst, key)
        self.answered.add(key)
        ep.view.strike(True)
        made = self._framed(key, request_id, chunk, ep.view.who.rank, dst, as_sender=True)
        data, slot = self._frames(made)
        ep.out.put_ranges(dst, key, data, slot, self.algorithm)

    def _frames(self, made: Framing) -> tuple[list[Any], Slot | None]:
        """The frames, from cache memory: views of it, or runs packed into a slot of the
        rank's staging ring [sim.cache.staging] — reused memory, not fresh pages that fault on
        first touch — held until zmq lets the frames go."""
        if not made.packed:
            return frames_from(made, self.regions), None
        need = packed_nbytes(made)
        slot = self.ring.acquire(need, wait=self.ep.view.memory.wait)
        return frames_from(made, self.regions, slot.view(need)), slot

    # -- receiver ----------------------------------------------------------------------------
    def progress(self) -> None:
        return  # the senders write

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """A write from ``src``, admitted: land its bytes in the cache [DESC-1].

        How the bytes land, and why not by ``Socket.recv_into``: the frames arrive as
        zero-copy :class:`zmq.Frame` s — views of the message buffers libzmq filled from
        the socket — and the receiver checks the envelope (a key of ``src``'s, not seen
        before: :meth:`sim.rank.receiver.Receiver.admit`), every frame's length against the runs it
        computed itself, and the CRC of the ranges (:func:`sim.paths.pull.ranges_intact`, over
        those buffers in place) before :func:`sim.paths.byteruns.land` copies each byte once
        into the cache. ``recv_into`` (pyzmq >= 26) is ``zmq_recv``, which copies out of
        libzmq's own message too: it saves no copy, only a Python object per frame.
        Straight into the cache it would write before the length and CRC checks (a
        longer frame is truncated silently) and a packed frame scatters to many
        places, so it would need a scratch slot — a second copy. Landing only after
        the checks means a corrupt, short, duplicate or unexpected write changes no
        byte of the cache: what was verified stays verified [WIRE-6, WIRE-7]."""
        ep = self.ep
        made = self._framed(
            key, state.request.request_id, chunk, src, ep.view.who.rank, as_sender=False
        )
        try:
            land(made, data, self.regions)
        except ValueError as error:
            ep.inbound.fail(state, f"the write {key} from source rank {src} does not fit: {error}")
            return None
        ep.view.stats["descriptors"] += len(made.runs.length)
        ep.view.stats["descriptor_bytes"] += made.nbytes
        return int(made.nbytes)

    def finish(self, state: Incoming, received_at: float) -> None:
        super().finish(state, time.time())  # the bytes landed now
