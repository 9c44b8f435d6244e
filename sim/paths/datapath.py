"""The one data-path interface: how a transfer moves a request's bytes between ranks.

A data path (``--transfer push|pull|write``: :mod:`sim.paths.push`, :mod:`sim.paths.pull`,
:mod:`sim.paths.write`) does three things, and a rank's loop asks nothing else of it:

- **post** a transfer: the sending side holds a request in its cache
  (:meth:`DataPath.post`: push sends its payloads, write its byte runs, pull answers
  the reads waiting for it), or the receiving side asks for ranges
  (:meth:`DataPath.progress`: pull posts its reads; :meth:`DataPath.on_read` serves
  one at the source);
- learn of a transfer's **completion**: a data message from a source
  (:meth:`DataPath.complete`), the bytes themselves or, for a one-sided transport, the
  notice that they landed;
- **admit** what arrived, through the one admission every path calls
  (:meth:`sim.rank.receiver.Receiver.admit`): the envelope and key checked, a second copy
  booked (``dup``, or ``late`` below the edge's highest ``seq``) and a reordered one,
  the path's integrity check (the codec, or the ranges' CRC) with a refusal booked as
  ``corrupt``, a request already ended ignored, then the path lands the bytes
  (:meth:`Landing.land`) and the admission keeps the request's accounts and completes
  it once nothing is awaited.

A path is given :class:`PathPorts`, never the rank: a read-only :class:`RankView` of it,
the :class:`Outbound` port its sender implements and the :class:`Inbound` port its
receiver implements. A one-sided transport (NIXL, Mooncake) fits
the same shape: ``post`` a descriptor list, ``complete`` on its notification, and
``land`` with nothing to copy (the bytes are already in place), after the same
admission.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvspec.transport.payload import Payload
from sim.books.accounting import FaultBook
from sim.cache.memory import RankMemory
from sim.cache.staging import Slot
from sim.net.endpoints import RankId
from sim.run.config import SimConfig
from sim.run.faults import FaultInjector
from sim.run.workload import PlanBook, Request, Workload


@dataclass
class Incoming:
    """What a receiver holds of one request until it is complete or failed."""

    request: Request
    waiting: set[str]
    chunks: dict[int, list[tuple[int, Payload]]] = field(default_factory=lambda: defaultdict(list))
    first_sent: float = float("inf")
    edge_bytes: Counter[int] = field(default_factory=Counter)
    received_at: float | None = None
    done: bool = False
    keys: dict[str, int] = field(default_factory=dict)  # every key of it -> its source
    arrived: int = 0
    abort_after: int | None = None  # abort=P: abort once this many shards arrived
    groups: dict[int, list[tuple[int, Payload]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # streamed [STREAM-1]: each layer group's parts until every source's has arrived
    group_bytes: Counter[int] = field(default_factory=Counter)  # a hybrid's, per layer group
    started: float = float("inf")  # when the earliest source began computing it
    ready_at: float | None = None  # every layer in the cache


@dataclass
class Checked:
    """What a path's integrity check made of a data message: the checked data to land,
    or the reason it is refused (booked ``corrupt``); ``lands`` False when the rules
    refuse the write itself (a closed handle, a stale epoch [LIFE-4])."""

    data: Any = None
    refusal: str | None = None
    lands: bool = True


class Landing(Protocol):
    """A path's part of the admission (:meth:`sim.rank.receiver.Receiver.admit`)."""

    def second_copy(self, key: str, head: dict[str, Any], frames: list[Any]) -> None:
        """A copy of a key already admitted arrived (booked by the admission)."""

    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """The message's integrity: the codec, or the CRC of its ranges [WIRE-6, WIRE-7]."""
        ...

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """Put the checked data where it belongs; the bytes of the edge it carried, or
        None when it was refused on landing (the request has failed)."""
        ...

    def finish(self, state: Incoming, received_at: float) -> None:
        """Nothing more of the request is awaited: assemble if need be, then verify."""


class DataPath(Landing, Protocol):
    """The one interface of a transfer (see the module)."""

    def prepare(self) -> None:
        """Before the ready barrier: register memory, prepare descriptor lists."""

    def start(self) -> None:
        """At go."""

    def post(self, request_id: str) -> None:
        """This rank's cache holds ``request_id``: move what it owes of it."""

    def progress(self) -> None:
        """Each turn of the loop: post what the receiving side asks for (reads)."""

    def on_read(self, frames: list[bytes]) -> None:
        """A read ``[route, header, descriptors]`` on the sender's KV socket."""

    def complete(self, src: int, frames: list[Any], received_at: float) -> None:
        """A data message from source ``src``: admit it (and land it)."""

    def served(self) -> bool:
        """Whether every key owed to a receiver was sent or skipped: the streams may end."""
        ...


@dataclass(frozen=True)
class RankView:
    """What a data path reads of its rank: the run, who the rank is, its plans and cache,
    and the books and hooks it counts in. Neither role's own state is here."""

    config: SimConfig
    who: RankId
    workload: Workload
    requests: Mapping[str, Request]
    in_plan: PlanBook | None
    out_plan: PlanBook | None
    sources: tuple[int, ...]
    memory: RankMemory
    layer_groups: tuple[range, ...]
    faults: FaultInjector
    stats: Counter[str]
    """The rank's counters, which a path adds to."""
    strangers: Counter[str]
    """Messages from strangers, refused, by kind."""
    book: FaultBook
    compute: Callable[[int], None]
    """The loop's stand-in for computing one layer group (streamed runs)."""
    strike: Callable[[bool], None]
    """The rank's own kill and hang faults, struck on a send (True) or a receive."""


class Outbound(Protocol):
    """The port a data path sends through, implemented by the rank's sender
    (:class:`sim.rank.sender.Sender`): its connections, the keys it sent or skipped, and
    the sends themselves, each through the run's faults."""

    def receivers(self) -> list[int]:
        """The receiver ranks with a verified connection."""
        ...

    def receiver_of(self, peer: bytes) -> int | None:
        """The receiver whose verified connection ``peer`` is, or None (a stranger)."""
        ...

    def is_skipped(self, dst: int, key: str) -> bool:
        """Whether ``key`` was skipped for receiver ``dst`` (its end-of-stream says so)."""
        ...

    def skip_key(self, dst: int, key: str, why: str) -> None:
        """Not send ``key`` to ``dst``, for the reason the end-of-stream gives."""

    def mark_sent(self, dst: int, key: str) -> None:
        """``key`` went to ``dst`` (the end-of-stream lists it)."""

    def unmark_sent(self, dst: int, key: str) -> None:
        """``key`` did not go to ``dst`` after all (its transfer failed)."""

    def aborted(self, request_id: str, dst: int) -> bool:
        """Whether receiver ``dst`` told this sender to stop sending ``request_id``."""
        ...

    def out_keys(self, request: Request) -> list[tuple[str, int, int]]:
        """Every (key, receiver, chunk) this rank owes of ``request``."""
        ...

    def transmit(
        self,
        dst: int,
        key: str,
        payload: Payload,
        started: float | None = None,
        gathered: Slot | None = None,
    ) -> None:
        """Send one payload as a data message, through the run's faults."""

    def put_ranges(
        self,
        dst: int,
        key: str,
        frames: list[Any],
        slot: Slot | None,
        algorithm: str,
        started: float | None = None,
    ) -> None:
        """Send byte ranges as one data message, through the run's faults."""

    def put(self, dst: int, frames: list[Any], *, slot: Slot | None = None) -> None:
        """Frames to a receiver's verified connection, as they are (a one-sided path's
        set-up: its agent metadata, :mod:`sim.paths.nixl`)."""


class Inbound(Protocol):
    """The port a data path receives through, implemented by the rank's receiver
    (:class:`sim.rank.receiver.Receiver`): what it awaits, from whom, and the one
    admission every path calls."""

    def awaited(self, request_id: str) -> Incoming:
        """What the receiver holds of ``request_id`` until it is complete or failed."""
        ...

    def owners(self) -> list[tuple[str, tuple[str, int, int]]]:
        """Every awaited key with its (request, chunk, source), in the order expected."""
        ...

    def owner(self, key: str) -> tuple[str, int, int]:
        """The (request, chunk, source) of an awaited key."""
        ...

    def group_of(self, key: str) -> int:
        """The layer group a streamed key carries [STREAM-1]."""
        ...

    def is_dead(self, src: int) -> bool:
        """Whether source ``src`` is known dead."""
        ...

    def has_ended(self, src: int) -> bool:
        """Whether source ``src`` sent its end-of-stream."""
        ...

    def dealer_of(self, src: int) -> Any:
        """The connection to source ``src``."""

    def admit(self, src: int, frames: list[Any], received_at: float, landing: Landing) -> None:
        """The one admission of a data message (see the module)."""

    def fail(self, state: Incoming, reason: str) -> None:
        """Fail a request, with the reason."""

    def landed(self, state: Incoming, received_at: float) -> None:
        """Every byte of a request is in the cache: verify it."""


@dataclass(frozen=True)
class PathPorts:
    """What a data path is given instead of the rank: a read-only view of it, the port it
    sends through and the port it receives through. A path touches neither role's state
    but through these."""

    view: RankView
    out: Outbound
    inbound: Inbound
