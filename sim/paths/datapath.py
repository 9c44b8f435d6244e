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

A path is given a :class:`PathEndpoint`, never the rank: what it reads of the rank and
the handful of things it may ask of it. A one-sided transport (NIXL, Mooncake) fits
the same shape: ``post`` a descriptor list, ``complete`` on its notification, and
``land`` with nothing to copy (the bytes are already in place), after the same
admission.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
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


@dataclass
class PathEndpoint:
    """What a data path may read of its rank and ask of it: the narrow endpoint a path
    is given instead of the rank."""

    config: SimConfig
    who: RankId
    workload: Workload
    requests: dict[str, Request]
    in_plan: PlanBook | None
    out_plan: PlanBook | None
    sources: tuple[int, ...]
    memory: RankMemory
    stats: Counter[str]
    strangers: Counter[str]
    book: FaultBook
    layer_groups: tuple[range, ...]
    # the sending side
    peers: dict[int, bytes]
    """Receiver rank -> its verified connection."""
    skipped: dict[int, dict[str, str]]
    """Receiver rank -> its keys not sent, and why (the end-of-stream says)."""
    sent_keys: dict[int, list[str]]
    aborted_out: set[tuple[str, int]]
    out_keys: Callable[[Request], list[tuple[str, int, int]]]
    put_ranges: Callable[[int, str, list[Any], Slot | None, str], None]
    put: Callable[[int, list[Any]], None]
    """Frames to a receiver's verified connection, as they are (a one-sided path's
    set-up: its agent metadata, :mod:`sim.paths.nixl`)."""
    faults: FaultInjector
    transmit: Callable[[int, str, Payload, float | None, Slot | None], None]
    compute: Callable[[int], None]
    strike: Callable[[bool], None]
    # the receiving side
    incoming: dict[str, Incoming]
    key_owner: dict[str, tuple[str, int, int]]
    key_group: dict[str, int]
    dead_sources: set[int]
    ended_sources: set[int]
    dealer_of: Callable[[int], Any]
    admit: Callable[[int, list[Any], float, Landing], None]
    fail: Callable[[Incoming, str], None]
    landed: Callable[[Incoming, float], None]
