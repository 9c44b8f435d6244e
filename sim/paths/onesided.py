"""The one-sided data paths: every request's bytes move by an engine's READ or WRITE of
a descriptor list, between the ranks' registered DRAM caches (``--transport nixl``,
:mod:`sim.paths.nixl`; ``--transport mooncake``, :mod:`sim.paths.mooncake`).

The same descriptor lists as ``--transfer pull|write`` over ZMQ [DESC-1..3]
(:func:`kvspec.memory.descriptors.plan_runs`, both sides computing them alike from the
configuration and the workload, :class:`sim.paths.regions.RegionPath`), handed to an
:class:`Engine` instead of framed for a socket:

- **set-up** (:meth:`OneSidedPath.prepare`, before the ready barrier): each rank
  process starts one engine, registers its cache regions as DRAM, and sends its
  engine's metadata with its regions' addresses over the run's authenticated
  connections (:mod:`sim.net.auth`): a sender to each verified receiver, a receiver to
  each welcomed source. Metadata is taken only from such a peer, under the agent name
  that peer must have, with one region per region its registration has [DESC-2]; the
  engine reads it with its own strict reader (nothing is unpickled).
- **pull** (``--transfer pull``): the receiver posts each key's list as ONE READ (its
  own regions local, the source's remote), at most :data:`READ_WINDOW` per source,
  and completes the key when the READ is done, in posting order per source (so no
  false ``reorder`` is booked), through the one admission
  (:meth:`sim.rank.receiver.Receiver.admit`) under an envelope it makes itself. The source
  takes no part in the read; a notification ``{"read": key}`` (riding with the READ
  where the engine carries one, else sent over the verified connection once it is
  done) is how it learns a key was served: its end-of-stream waits for every one.
- **write** (``--transfer write``): the sender posts each key's list as ONE WRITE
  whose notification is the key's envelope (:func:`sim.net.messages.envelope`: key,
  ``seq``, time and, with checksums, ``ranges_crc``/``ranges_alg`` — the sender's CRC
  of the source ranges in list order, CRC-32C [WIRE-7] where compiled code computes
  it, else CRC-32 [WIRE-6]), riding with the WRITE or sent over the verified
  connection once it is done. One WRITE is in flight per receiver, so an edge's
  notifications arrive in ``seq`` order. The receiver parses each strictly
  (:func:`sim.net.messages.read_envelope`; a malformed one is refused and counted, booked
  ``garbage``), then admits it; its integrity check is the CRC of the bytes now in its
  own cache at the list's target ranges (:func:`sim.paths.regions.ranges_intact`), and
  ``land`` copies nothing.

**What is verified.** Every element of every request against the oracle [ORACLE-5],
as on every path; a write's CRC besides. A pull carries no sender CRC (the sender
computes nothing for a one-sided read): the oracle alone judges what was read.

**Completion before end-of-stream.** A sender ends a receiver's stream (over ZMQ) only
once every WRITE to it is done, and a receiver drains the engine's notifications before
it reads an end-of-stream (:mod:`sim.rank.loop` calls :meth:`OneSidedPath.progress` first),
so a key is never declared lost while its notification is still queued.

**Faults.** ``write``: ``drop=P`` (the WRITE lands, its notification is not sent: the
receiver fails the request when the end-of-stream lists the key), ``dup=P`` (the
notification is sent again right after the WRITE completes: booked ``dup``, never
landed twice; both booked once the WRITE is done), ``garbage=P`` (a malformed
notification first), ``delay=T``; both: ``kill``/``hang`` of a rank, which its peers
learn of as on every path (a READ or WRITE to a dead peer fails, or never completes:
its request fails with the reason). Other faults are refused
(:func:`sim.paths.onesided_checks.check_onesided`). A notification through an engine is not
authenticated by it: a forged one can fail a request (its CRC or the oracle refuses
it), never make it wrong.

**Library errors.** A READ or WRITE the library refuses or fails is no fault: it is
booked as the library's error, in its words (:mod:`sim.books.accounting`), its request fails
with them, and the key is skipped, never listed as sent (so no ``drop`` is observed).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import zmq

from kvspec.memory.descriptors import Runs, plan_runs
from kvspec.transport.checksums import checksum_of
from sim.net import messages
from sim.net.endpoints import RankId
from sim.paths.datapath import Checked, Incoming, PathPorts
from sim.paths.regions import RegionPath, ranges_intact

READ_WINDOW = 8
"""READs a receiver keeps outstanding per source."""
DRAIN_TURNS = 64
"""At most this many calls to drain an engine's notifications at once."""


class Engine(Protocol):
    """What a one-sided transfer library gives a rank (one per rank process)."""

    label: ClassVar[str]
    """Its name in reasons and reports: ``NIXL``, ``Mooncake``."""
    notifies: ClassVar[bool]
    """Whether a transfer carries its own notification to the peer."""

    def open(self, name: str, regions: list[tuple[int, int]]) -> bytes:
        """Start under agent ``name``, register ``regions`` (address, length) as DRAM;
        this rank's metadata for its peers."""
        ...

    def add_peer(self, name: str, metadata: bytes) -> bool:
        """Add a peer from its metadata, which must name ``name``; False if it does not."""
        ...

    def post(self, op: str, local: np.ndarray, remote: np.ndarray, peer: str, notif: bytes) -> Any:
        """Post one ``READ`` or ``WRITE`` of (address, length) rows; a handle. Raises when
        the engine refuses it."""
        ...

    def state(self, handle: Any) -> str:
        """``PROC``, ``DONE`` or ``ERR ...``."""
        ...

    def release(self, handle: Any) -> None: ...

    def notify(self, peer: str, message: bytes) -> None:
        """A notification not bound to a transfer (only where :attr:`notifies`)."""

    def notifications(self) -> list[tuple[str, bytes]]:
        """The notifications that arrived since the last call: (agent name, message)."""
        ...


@dataclass
class Notice:
    """A notification in the shape the admission reads a message's first frame."""

    buffer: bytes


@dataclass
class Peer:
    """A remote agent: its name and its regions' base addresses, in registration order."""

    name: str
    bases: np.ndarray


@dataclass
class InFlight:
    """A posted transfer: its handle, the key, and what to do when it is done."""

    handle: Any
    key: str
    seq: int
    posted: float
    runs: Runs | None = None
    notif: bytes = b""
    dup: bool = False
    send: bool = True
    """A write's notification is to be sent (not dropped)."""


@dataclass
class _Queues:
    writes: dict[int, deque[tuple[str, str, int]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    inflight: dict[int, InFlight] = field(default_factory=dict)
    reads: dict[int, deque[tuple[str, str, int]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    outstanding: dict[int, deque[InFlight]] = field(default_factory=lambda: defaultdict(deque))


class OneSidedPath(RegionPath):
    """The pull or write data path of one rank over a one-sided engine (see the module);
    a transport names its :class:`Engine` in :attr:`engine_class`."""

    engine_class: type[Engine]

    @property
    def label(self) -> str:
        return self.engine_class.label

    @property
    def notifies(self) -> bool:
        return self.engine_class.notifies

    poll_ms = 2
    """How long the rank's loop may sleep: an engine progressed by it (UCX over TCP needs
    both sides progressed) completes no sooner."""

    def __init__(self, ep: PathPorts) -> None:
        super().__init__(ep)
        self.engine: Engine | None = None
        self.name = agent_name(ep.view.who.tag)
        self.sources_of: dict[str, int] = {}  # remote agent name -> source rank
        self.targets_of: dict[str, int] = {}  # remote agent name -> receiver rank
        self.remote_src: dict[int, Peer] = {}
        self.remote_dst: dict[int, Peer] = {}
        self.q = _Queues()
        self.seq: dict[int, int] = defaultdict(int)
        self.keys_by_request: dict[str, list[str]] = defaultdict(list)
        self.broken: dict[int, str] = {}  # a peer whose transfer failed -> why
        self.early: list[tuple[bytes, bytes, int, bool]] = []  # metadata before prepare
        self.pending_runs: dict[str, Runs | None] = {}  # a pull's READs done, being admitted

    # -- set-up ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Start the engine, register the cache regions (DRAM), send the metadata."""
        ep = self.ep
        self.register()
        tensors = [self.buffers[n] for n in self.names]
        self.bases = np.array([t.data_ptr() for t in tensors], dtype=np.int64)
        engine = self.engine = self.engine_class()
        metadata = engine.open(self.name, [(t.data_ptr(), t.numel()) for t in tensors])
        head = messages.dump(
            {"agent": self.name, "regions": [[int(t.data_ptr()), t.numel()] for t in tensors]}
        )
        for dst in ep.out.receivers():
            self.targets_of[
                agent_name(RankId(ep.view.who.replica, ep.view.who.stage + 1, dst).tag)
            ] = dst
            ep.out.put(dst, [head, metadata])
        for src in ep.view.sources:
            self.sources_of[
                agent_name(RankId(ep.view.who.replica, ep.view.who.stage - 1, src).tag)
            ] = src
            ep.inbound.dealer_of(src).send_multipart([head, metadata])
        for early_head, early_metadata, rank, source in self.early:
            self._on_metadata(early_head, early_metadata, rank=rank, source=source)
        self.early.clear()
        for key, (request_id, _, _) in self.keys_of.items():
            self.keys_by_request[request_id].append(key)
        if ep.view.config.transfer == "pull":
            for key, (request_id, chunk, src) in ep.inbound.owners():
                self.q.reads[src].append((key, request_id, chunk))

    def start(self) -> None:
        return  # everything was registered before the barrier

    def _on_metadata(self, head_frame: Any, metadata: Any, *, rank: int, source: bool) -> bool:
        """A peer's metadata from its verified connection (``source``: a source of this
        rank's, else a receiver), parsed strictly, then added; False when the message is
        not metadata at all."""
        try:
            head = messages.load(head_frame, limit=messages.MAX_ENVELOPE * 16)
        except messages.MessageError:
            return False
        if "agent" not in head:
            return False
        if self.engine is None:  # a peer that prepared first: taken once this rank has
            self.early.append((bytes(head_frame), bytes(metadata), rank, source))
            return True
        names = self.sources_of if source else self.targets_of
        expected = next((n for n, r in names.items() if r == rank), None)
        registered = self.sources[rank] if source else self._peer(self.ep.view.who.stage + 1, rank)
        name, regions = head.get("agent"), head.get("regions")
        added = False
        assert self.engine is not None
        if (
            isinstance(name, str)
            and name == expected
            and isinstance(regions, list)
            and len(regions) == len(list(registered.regions()))
            and all(isinstance(r, list) and len(r) == 2 and all(map(_is_count, r)) for r in regions)
        ):
            try:  # the engine's own reader, which checks it names ``name``
                added = self.engine.add_peer(name, bytes(metadata))
            except Exception:
                added = False
        if not added or not isinstance(name, str) or not isinstance(regions, list):
            self.ep.view.strangers["one-sided metadata refused"] += 1
            return True
        peer = Peer(name, np.array([r[0] for r in regions], dtype=np.int64))
        (self.remote_src if source else self.remote_dst)[rank] = peer
        return True

    def _xfer(self, runs: Runs, local_side: str, remote: Peer, op: str, notif: bytes) -> Any:
        """One transfer of a whole descriptor list [DESC-1]: (address, length) rows here
        and at the peer."""
        assert self.engine is not None
        lengths = runs.length.numpy().astype(np.int64)
        own = runs.dst_region if local_side == "dst" else runs.src_region
        own_at = runs.dst_offset if local_side == "dst" else runs.src_offset
        other = runs.src_region if local_side == "dst" else runs.dst_region
        other_at = runs.src_offset if local_side == "dst" else runs.dst_offset
        local = np.stack([self.bases[own.numpy()] + own_at.numpy(), lengths], axis=1)
        far = np.stack([remote.bases[other.numpy()] + other_at.numpy(), lengths], axis=1)
        handle = self.engine.post(op, local, far, remote.name, notif)
        self.ep.view.stats["onesided_transfers"] += 1
        self.ep.view.stats["onesided_descriptors"] += len(lengths)
        return handle

    def _views(self, runs: Runs, side: str) -> list[Any]:
        """The bytes of each run on one side of this rank's cache, in list order."""
        region = (runs.src_region if side == "src" else runs.dst_region).tolist()
        offset = (runs.src_offset if side == "src" else runs.dst_offset).tolist()
        arrays = [self.buffers[n].numpy() for n in self.names]
        return [
            arrays[r][o : o + n].data
            for r, o, n in zip(region, offset, runs.length.tolist(), strict=True)
        ]

    # -- the loop ------------------------------------------------------------------
    def progress(self) -> None:
        """Each turn: drain notifications, move transfers on, post what may go."""
        if self.engine is None:
            return
        self._drain()
        self._writes_on()
        self._reads_on()

    def _drain(self) -> None:
        """Take every notification the engine holds (twice empty in a row: drained)."""
        assert self.engine is not None
        empty = 0
        for _ in range(DRAIN_TURNS):
            got = self.engine.notifications()
            if not got:
                empty += 1
                if empty >= 2:
                    return
                continue
            empty = 0
            received_at = time.time()
            for name, note in got:
                self._on_notification(name, note, received_at)

    def _on_notification(self, name: str, note: bytes, received_at: float) -> None:
        ep = self.ep
        ep.view.stats["onesided_notifications"] += 1  # through the engine or beside it
        if name in self.sources_of and ep.view.config.transfer == "write":
            src = self.sources_of[name]
            try:
                messages.read_envelope(note)
            except messages.MessageError:
                ep.view.stats["onesided_refused"] += 1  # malformed: refused, booked by its edge
                ep.view.book.observe(
                    "garbage", _edge(ep, src, ep.view.who.rank, ep.view.who.stage - 1)
                )
                return
            ep.inbound.admit(src, [Notice(note)], received_at, self)
        elif name in self.targets_of and ep.view.config.transfer == "pull":
            dst = self.targets_of[name]
            try:
                key = messages.load(note, limit=messages.MAX_ENVELOPE).get("read")
            except messages.MessageError:
                key = None
            known = self.keys_of.get(key) if isinstance(key, str) else None
            if not isinstance(key, str) or known is None or known[2] != dst or key in self.answered:
                ep.view.stats["onesided_refused"] += 1
                return
            ep.out.mark_sent(dst, key)
            self.answered.add(key)
            ep.view.strike(True)
        else:
            ep.view.strangers["nixl notifications refused"] += 1

    # -- sender: write ---------------------------------------------------------------
    def post(self, request_id: str) -> None:
        """``request_id`` is in this rank's cache: queue its WRITEs (a pull's source is
        read without it)."""
        self.ready_requests.add(request_id)
        if self.ep.view.config.transfer != "write":
            return
        for key in self.keys_by_request.get(request_id, []):
            _, chunk, dst = self.keys_of[key]
            if not self.ep.out.is_skipped(dst, key):
                self.q.writes[dst].append((key, request_id, chunk))
        self._writes_on()

    def _writes_on(self) -> None:
        for dst in list(self.q.inflight):
            flight = self.q.inflight[dst]
            state = self._state(flight.handle)
            if state == "PROC":
                continue
            self._release(flight.handle)
            del self.q.inflight[dst]
            if state != "DONE":
                self._write_failed(dst, flight.key, f"its {self.label} WRITE failed ({state})")
                continue
            # a WRITE's faults are booked once it is done: one the library failed is not
            # dropped or duplicated, only failed
            if not flight.send:
                self.ep.view.book.inject("drop", flight.key)
            elif not self.notifies:  # now, over ZMQ
                self.ep.out.put(dst, [flight.notif, b""])
            if flight.dup and self._notify_write(dst, flight.notif, flight.key):
                self.ep.view.book.inject("dup", flight.key)  # right behind its original
        for dst, queue in self.q.writes.items():
            while queue and dst in self.broken:  # its receiver is gone: say why, send nothing
                self._broken(dst, self.broken[dst], queue.popleft()[0])
            if dst in self.q.inflight or dst not in self.remote_dst or not queue:
                continue
            self._write(dst, *queue.popleft())

    def _write_failed(self, dst: int, key: str, why: str) -> None:
        """The library failed the WRITE of ``key`` to ``dst``: booked as its error, never
        as a fault, the key no longer listed as sent (its end-of-stream lists it skipped,
        with ``why``, so no ``drop`` is observed), and the receiver broken."""
        ep = self.ep
        self._library_error(_edge(ep, ep.view.who.rank, dst, ep.view.who.stage), key, why)
        with suppress(ValueError):
            ep.out.unmark_sent(dst, key)
        self._broken(dst, why, key)

    def _library_error(self, edge: str, key: str, why: str) -> None:
        """A transfer the library refused or failed, in its words [sim.books.accounting]."""
        self.ep.view.book.error(self.label, f"{edge} {key}: {why}")

    def _broken(self, dst: int, why: str, key: str) -> None:
        """A WRITE to ``dst`` failed: this key and every later one are skipped, with why."""
        self.ep.view.stats["onesided_errors"] += 1
        self.broken.setdefault(dst, why)
        self.ep.out.skip_key(dst, key, why)

    def _write(self, dst: int, key: str, request_id: str, chunk: int) -> None:
        """One key's runs as ONE WRITE, its envelope the notification [sim.run.faults]."""
        ep = self.ep
        ep.out.mark_sent(dst, key)
        self.answered.add(key)
        ep.view.strike(True)
        runs = plan_runs(*self.share(request_id, chunk, ep.view.who.rank, dst, as_sender=True))
        seq = self.seq[dst]
        self.seq[dst] += 1
        checksum = ep.view.config.checksum
        note = messages.envelope(
            key,
            seq,
            time.time(),
            checksum=checksum,
            ranges_crc=checksum_of(self.algorithm, self._views(runs, "src")) if checksum else None,
            ranges_alg=self.algorithm if checksum else None,
        )
        peer = self.remote_dst[dst]
        faults, send_note, dup = ep.view.faults, note, False
        # the wire faults in the order every path strikes them [sim.run.faults]
        # garbage: booked where it is refused, here or by the receiver, once it is sent
        if faults.hit("garbage") and self._notify_write(dst, faults.garbage(), key):
            ep.view.book.inject("garbage", _edge(ep, ep.view.who.rank, dst, ep.view.who.stage))
        if faults.hit("drop"):  # booked once the WRITE is done
            send_note = b""  # the bytes land; nobody is told
        if ep.view.config.faults.delay_s:
            time.sleep(ep.view.config.faults.delay_s)
        if send_note and faults.hit("dup"):
            dup = True
        riding = send_note if self.notifies else b""
        handle, state = self._post(runs, "src", peer, "WRITE", riding)
        if state.startswith("ERR"):
            self._write_failed(dst, key, f"its {self.label} WRITE could not be posted ({state})")
            return
        self.q.inflight[dst] = InFlight(
            handle, key, seq, time.time(), notif=note, dup=dup, send=bool(send_note)
        )

    # -- receiver: pull --------------------------------------------------------------
    def _reads_on(self) -> None:
        ep = self.ep
        if ep.view.config.transfer != "pull" or ep.view.in_plan is None:
            return
        for src, outstanding in self.q.outstanding.items():
            while outstanding:  # in posting order: an edge's seq never goes back
                flight = outstanding[0]
                state = self._state(flight.handle)
                if state == "PROC":
                    break
                outstanding.popleft()
                self._release(flight.handle)
                if state != "DONE":
                    self._read_failed(src, flight.key, f"failed ({state})", library=True)
                    continue
                if not self.notifies:  # the source learns of the read over ZMQ
                    with suppress(zmq.ZMQError):
                        ep.inbound.dealer_of(src).send_multipart(
                            [messages.dump({"read": flight.key}), b""], flags=zmq.NOBLOCK
                        )
                head = messages.envelope(flight.key, flight.seq, flight.posted)
                self.pending_runs[flight.key] = flight.runs
                ep.inbound.admit(src, [Notice(head)], time.time(), self)
        for src, queue in self.q.reads.items():
            if ep.inbound.is_dead(src) or src not in self.remote_src:
                continue
            while queue and len(self.q.outstanding[src]) < READ_WINDOW:
                key, request_id, chunk = queue.popleft()
                if ep.inbound.awaited(request_id).done:
                    continue
                if src in self.broken:  # its source is gone: every later read fails so
                    self._read_failed(src, key, self.broken[src])
                    continue
                self._read(src, key, request_id, chunk)

    def _read_failed(self, src: int, key: str, why: str, *, library: bool = False) -> None:
        """A READ from ``src`` failed: its request fails with why; no more are posted. The
        library's own failure (``library``) is booked as its error, not a fault."""
        ep = self.ep
        if library:
            self._library_error(_edge(ep, src, ep.view.who.rank, ep.view.who.stage - 1), key, why)
        ep.view.stats["onesided_errors"] += 1
        self.broken.setdefault(src, why)
        ep.inbound.fail(
            ep.inbound.awaited(ep.inbound.owner(key)[0]),
            f"the {self.label} READ of shard {key} from source rank {src} {why}",
        )

    def _read(self, src: int, key: str, request_id: str, chunk: int) -> None:
        """One key's runs as ONE READ, with a notification to its source."""
        ep = self.ep
        runs = plan_runs(*self.share(request_id, chunk, src, ep.view.who.rank, as_sender=False))
        notif = messages.dump({"read": key}) if self.notifies else b""
        handle, state = self._post(runs, "dst", self.remote_src[src], "READ", notif)
        if state.startswith("ERR"):
            self._read_failed(src, key, f"could not be posted ({state})", library=True)
            return
        seq = self.seq[src]
        self.seq[src] += 1
        ep.view.stats["reads_posted"] += 1
        self.q.outstanding[src].append(InFlight(handle, key, seq, time.time(), runs=runs))

    # -- the engine's calls: a peer that died answers with an error, never an exception --
    def _post(self, runs: Runs, side: str, peer: Peer, op: str, notif: bytes) -> tuple[Any, str]:
        """Create and post one transfer; (handle, its state), the state ``ERR ...`` when
        the engine refused it (the handle released)."""
        assert self.engine is not None
        handle = None
        try:
            handle = self._xfer(runs, side, peer, op, notif)
            state = self.engine.state(handle)
        except Exception as error:  # a peer gone: NIXL_ERR_REMOTE_DISCONNECT, say
            state = _error(error)
        if state.startswith("ERR") and handle is not None:
            self._release(handle)
        return handle, state

    def _state(self, handle: Any) -> str:
        assert self.engine is not None
        try:
            return self.engine.state(handle)
        except Exception as error:
            return _error(error)

    def _release(self, handle: Any) -> None:
        assert self.engine is not None
        with suppress(Exception):  # a handle of a dead peer's may not release cleanly
            self.engine.release(handle)

    def _notify_write(self, dst: int, message: bytes, key: str) -> bool:
        """A notification to receiver ``dst`` beside the WRITE of ``key``: through the
        engine, or over the verified connection (one frame of garbage is refused there by
        the receiver itself; an envelope travels as ``[envelope, b""]``). False when the
        engine refused it (booked as its error: the fault it carried never struck)."""
        assert self.engine is not None
        if not self.notifies:
            self.ep.out.put(dst, [message] if message[:1] != b"{" else [message, b""])
            return True
        try:
            self.engine.notify(self.remote_dst[dst].name, message)
        except Exception as error:
            self.ep.view.stats["onesided_errors"] += 1
            edge = _edge(self.ep, self.ep.view.who.rank, dst, self.ep.view.who.stage)
            self._library_error(edge, key, f"its notification was refused ({_error(error)})")
            return False
        return True

    # -- the admission ---------------------------------------------------------------
    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """A write: the CRC of the bytes now in this cache at the list's targets, against
        the sender's [WIRE-6, WIRE-7]; a pull: nothing but the oracle, later."""
        ep = self.ep
        if ep.view.config.transfer == "pull":
            return Checked(self.pending_runs.pop(key, None))
        request_id, chunk, _ = ep.inbound.owner(key)
        runs = plan_runs(*self.share(request_id, chunk, src, ep.view.who.rank, as_sender=False))
        if not ranges_intact(head, self._views(runs, "dst"), required=ep.view.config.checksum):
            return Checked(refusal=f"the ranges of {key} from source rank {src} fail their CRC")
        return Checked(runs)

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """Nothing to copy: the engine put the bytes where the list said [DESC-1]."""
        if data is None:
            self.ep.inbound.fail(
                state, f"the {self.label} transfer of {key} from source rank {src} is unknown"
            )
            return None
        nbytes = int(data.length.sum())
        self.ep.view.stats["descriptors"] += len(data.length)
        self.ep.view.stats["descriptor_bytes"] += nbytes
        return nbytes

    def complete(self, src: int, frames: list[Any], received_at: float) -> None:
        """A message from a source over ZMQ: its metadata or, for an engine that carries
        no notification, a WRITE's (``[envelope, b""]``)."""
        if len(frames) == 2 and self._on_metadata(
            frames[0].buffer, frames[1].buffer, rank=src, source=True
        ):
            return
        if len(frames) == 2 and not self.notifies and not len(frames[1].buffer):
            name = next(n for n, r in self.sources_of.items() if r == src)
            self._on_notification(name, bytes(frames[0].buffer), received_at)
            return
        self.ep.view.stats["onesided_refused"] += 1

    def on_read(self, frames: list[bytes]) -> None:
        """On the sender's socket: a verified receiver's metadata, nothing else."""
        peer, head, body = frames
        dst = self.ep.out.receiver_of(peer)
        if dst is None:
            self.ep.view.strangers["kv messages"] += 1
            return
        if self._on_metadata(head, body, rank=dst, source=False):
            return
        if not self.notifies and not len(body):  # a read done, told over ZMQ
            name = next(n for n, r in self.targets_of.items() if r == dst)
            self._on_notification(name, bytes(head), time.time())
            return
        self.ep.view.stats["reads_refused"] += 1

    def served(self) -> bool:
        """Every key answered (a pull: notified as read; a write: done) or skipped."""
        if self.q.inflight or any(self.q.writes.values()):
            return False
        return super().served()

    def finish(self, state: Incoming, received_at: float) -> None:
        super().finish(state, time.time())  # the bytes are in place now


def agent_name(tag: str) -> str:
    """The engine's agent name of the rank tagged ``tag``."""
    return f"kvspec-{tag}"


def _error(error: Exception) -> str:
    return f"ERR {type(error).__name__}: {error}"[:200]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _edge(ep: PathPorts, src: int, dst: int, stage: int) -> str:
    return f"replica {ep.view.who.replica} stage {stage}->{stage + 1} {src}->{dst}"
