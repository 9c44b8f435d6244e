"""The data paths of a hybrid model's layer groups (``groups`` content, :mod:`sim.run.content`):
``--transfer push`` (:class:`GroupPush`) and ``--transfer pull`` (:class:`GroupPull`)
[GROUP-3, STATE-2, WINDOW-1, STREAM-1].

Both move, per keyed message, the pieces the group plan's edges between one (source,
receiver) pair carry (:meth:`sim.run.workload.PlanBook.pair_keys`), framed by
:mod:`sim.paths.pieces` and sent through :meth:`sim.rank.sender.Sender.put_ranges`: the
run's wire faults strike them and are booked as for any data message, and the receiver
admits them through the one admission (:meth:`sim.rank.receiver.Receiver.admit`). This
path's part of it is the ranges' CRC [WIRE-6, WIRE-7] and the pieces' description read
against the model; each piece then lands at the coordinates it names in the receiver's
group regions (:mod:`sim.cache.groups`), a piece naming what the receiver does not hold
failing the request, and once every key has landed every region is verified against
the oracles.

A push sender sends each pair's message once the request is in its cache; streamed, it
computes each stream layer group and sends the pieces of those layers at once. A pull
receiver asks for each of its keys on its source's verified connection — a read names
one key and nothing else — and the source answers it with exactly the pieces the plan
gives that pair, once the request is in its cache.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any

import zmq

from kvspec.transport.checksums import fastest
from kvspec.transport.streaming import group_layers
from sim.net import messages
from sim.paths.datapath import Checked, Incoming, PathPorts
from sim.paths.pieces import in_layers, pieces_frames, read_pieces
from sim.paths.regions import ranges_intact, read_head


class GroupPath:
    """What the group paths share: the keys owed, the pieces of one key, and the
    receiving side of the admission (:class:`sim.paths.datapath.DataPath`)."""

    def __init__(self, ep: PathPorts) -> None:
        self.ep = ep
        self.algorithm = fastest()  # of the frames' CRC [WIRE-6, WIRE-7]
        self.keys_of: dict[str, tuple[str, int, int | None]] = {}  # key -> (request, dst, stream)
        self.by_request: dict[str, list[str]] = defaultdict(list)
        view = ep.view
        if view.out_plan is not None:
            for request in view.workload.requests:
                for pk in view.out_plan.pair_keys(request):
                    if pk.src == view.who.rank:
                        self.keys_of[pk.key] = (request.request_id, pk.dst, pk.stream)
                        self.by_request[request.request_id].append(pk.key)

    def prepare(self) -> None:
        return

    def start(self) -> None:
        return

    def progress(self) -> None:
        return

    def on_read(self, frames: list[bytes]) -> None:
        self.ep.view.strangers["kv messages"] += 1  # only a pull sender takes reads

    def served(self) -> bool:
        return True

    # -- sending -------------------------------------------------------------------------
    def send(self, key: str, started: float | None = None) -> None:
        """Send the pieces of ``key`` to its receiver, through the run's faults; ``started``
        when the request's compute began (streamed runs)."""
        ep = self.ep
        request_id, dst, stream = self.keys_of[key]
        assert ep.view.out_plan is not None and ep.view.memory.groups is not None
        request = ep.view.requests[request_id]
        pieces = ep.view.memory.groups.pieces(ep.view.out_plan, request, dst)
        if stream is not None:
            span = ep.view.layer_groups[stream]
            pieces = [p for p in (in_layers(p, span) for p in pieces) if p is not None]
        ep.out.mark_sent(dst, key)
        ep.view.strike(True)
        ep.out.put_ranges(dst, key, pieces_frames(pieces), None, self.algorithm, started)

    # -- receiving: this path's part of the admission ------------------------------------
    def complete(self, src: int, frames: list[Any], received_at: float) -> None:
        self.ep.inbound.admit(src, frames, received_at, self)

    def second_copy(self, key: str, head: dict[str, Any], frames: list[Any]) -> None:
        return  # the regions are held from the start: a copy is only booked

    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """The frames' CRC [WIRE-6, WIRE-7], then the pieces read against the model."""
        view = self.ep.view
        body = [f.buffer for f in frames[1:]]
        if not ranges_intact(head, body, required=view.config.checksum):
            return Checked(refusal=f"the pieces of {key} from source rank {src} fail their CRC")
        try:
            pieces = read_pieces(body, model=view.config.model, src=src, dst=view.who.rank)
        except messages.MessageError as error:
            return Checked(refusal=f"the pieces of {key} from source rank {src}: {error}")
        return Checked(pieces)

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """Land every piece where it names; the bytes of their elements."""
        groups = self.ep.view.memory.groups
        assert groups is not None
        nbytes = 0
        for piece in data:
            try:
                groups.place(state.request.request_id, piece)
            except ValueError as error:
                self.ep.inbound.fail(state, f"from source rank {src}: {error}")
                return None
            landed = piece.data.numel() * piece.data.element_size()
            state.group_bytes[piece.group] += landed
            nbytes += landed
        return nbytes

    def finish(self, state: Incoming, received_at: float) -> None:
        self.ep.inbound.landed(state, received_at)  # every piece is in its region already


class GroupPush(GroupPath):
    """``--transfer push`` of a hybrid: each pair's pieces sent as the request is posted."""

    def post(self, request_id: str) -> None:
        """Send every key of ``request_id``: whole, after computing every layer this rank
        holds, or streamed, each stream layer group's pieces once its layers are computed
        [STREAM-1]."""
        view = self.ep.view
        keys = self.by_request.get(request_id, [])
        layers = view.memory.owner.layers
        started = time.time() if view.config.stream != "off" else None
        if not view.layer_groups:
            view.compute(len(layers))
            for key in keys:
                self.send(key, started)
            return
        done = layers.start
        for g, span in enumerate(view.layer_groups):
            mine = group_layers(layers, span)
            if len(mine):
                view.compute(mine.stop - done)
                done = mine.stop
            for key in keys:
                if self.keys_of[key][2] == g:
                    self.send(key, started)


class GroupPull(GroupPath):
    """``--transfer pull`` of a hybrid: each receiver reads its keys from its sources."""

    def __init__(self, ep: PathPorts) -> None:
        super().__init__(ep)
        self.pending: dict[int, deque[str]] = defaultdict(deque)
        self.read_seq: dict[int, int] = defaultdict(int)
        self.started = False
        self.ready: set[str] = set()
        self.waiting: dict[str, list[str]] = defaultdict(list)  # request -> keys read
        self.answered: set[str] = set()

    def start(self) -> None:
        for key, (_, _, src) in self.ep.inbound.owners():
            self.pending[src].append(key)
        self.started = True

    def progress(self) -> None:
        """Post every awaited key's read on its source's connection, as far as the pipe
        takes them: its high-water mark is the window (a read is a hundred bytes; what
        answers carry is bounded by the pipes the other way), so an answer a fault drops
        never holds back the reads behind it."""
        ep = self.ep
        if not self.started:
            return
        for src, queue in self.pending.items():
            if ep.inbound.is_dead(src) or ep.inbound.has_ended(src):
                continue
            while queue:
                key = queue.popleft()
                if ep.inbound.awaited(ep.inbound.owner(key)[0]).done:
                    continue
                seq = self.read_seq[src]
                self.read_seq[src] += 1
                head = {"read": key, "seq": seq, "n": 0}
                try:  # a DEALER whose source is gone would block: never wait for it
                    ep.inbound.dealer_of(src).send_multipart(
                        [messages.dump(head), b""], flags=zmq.NOBLOCK
                    )
                except zmq.Again:
                    self.read_seq[src] -= 1
                    queue.appendleft(key)
                    break
                ep.view.stats["reads_posted"] += 1

    def post(self, request_id: str) -> None:
        """``request_id`` is in this rank's cache: answer the reads waiting for it."""
        self.ready.add(request_id)
        for key in self.waiting.pop(request_id, []):
            self._answer(key)

    def on_read(self, frames: list[bytes]) -> None:
        """A read from a verified receiver naming one of its keys, and nothing else; any
        other is refused and counted."""
        ep = self.ep
        read = read_head(ep, frames)
        if read is None:
            return
        (dst, head), body = read, frames[2]
        key = head.get("read")
        known = self.keys_of.get(key) if isinstance(key, str) else None
        if known is None or known[1] != dst or head.get("n") != 0 or body:
            ep.view.stats["reads_refused"] += 1
            return
        assert isinstance(key, str)
        if key in self.answered or ep.out.is_skipped(dst, key):
            return  # answered once; or its request failed here (the end-of-stream says)
        if known[0] not in self.ready:
            self.waiting[known[0]].append(key)
            return
        self._answer(key)

    def _answer(self, key: str) -> None:
        self.answered.add(key)
        self.send(key)

    def served(self) -> bool:
        """Whether every key of every receiver was answered (or skipped)."""
        return all(
            key in self.answered or self.ep.out.is_skipped(dst, key)
            for key, (_, dst, _) in self.keys_of.items()
        )
