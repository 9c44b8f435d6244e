"""What the roles of one rank share: who it is, the run, its plans and books, its memory,
and the hooks into its event loop.

A rank (:mod:`sim.rank.loop`) is an event loop with two roles, a sender (:mod:`sim.rank.sender`)
and a receiver (:mod:`sim.rank.receiver`), and one data path (:mod:`sim.paths.datapath`). Each
role is given this context, never the rank: what it may read and the few things it may
ask of the loop (serve the sockets, tell the parent, strike a rank fault) are here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvspec.transport.streaming import layer_groups
from sim.books.accounting import FaultBook
from sim.cache.memory import RankMemory
from sim.net.endpoints import RankId
from sim.run.config import SimConfig
from sim.run.faults import FaultInjector
from sim.run.workload import PlanBook, Request, Workload


class Carriage(Protocol):
    """Where a message's tensor frames travel beside ZMQ (``--transport gloo|nccl``,
    :class:`sim.net.p2p.Carrier`): split on the way out, joined on the way in."""

    broken: dict[str, str]

    def split(self, peer: RankId, frames: list[Any]) -> tuple[list[Any], list[Any]] | None: ...

    def send(self, peer: RankId, bulk: list[Any]) -> None: ...

    def join(self, peer: RankId, frames: list[Any]) -> list[Any] | None: ...


@dataclass
class RankContext:
    """One rank's shared state and its loop's hooks (see the module)."""

    config: SimConfig
    who: RankId
    workload: Workload
    faults: FaultInjector
    memory: RankMemory
    pump: Callable[[int], None]
    """Handle whatever arrives within this many milliseconds."""
    event: Callable[[dict[str, Any]], None]
    """Tell the parent."""
    stopping: Callable[[], bool]
    """Whether the parent said stop."""
    strike: Callable[[bool], None]
    """Apply a ``kill``/``hang`` fault if this rank's work (sending: True) has reached it."""
    announce: Callable[[str], None]
    """Tell the parent a rank fault strikes now, and wait until it has heard."""
    stats: Counter[str] = field(default_factory=Counter)
    strangers: Counter[str] = field(default_factory=Counter)
    book: FaultBook = field(default_factory=FaultBook)
    carrier: Carriage | None = None
    """The tensor frames' path over torch.distributed, once the process group is met."""

    def __post_init__(self) -> None:
        config, who = self.config, self.who
        self.model = config.model
        self.requests: dict[str, Request] = {r.request_id: r for r in self.workload.requests}
        # The plans per request: one for all of them unless the stages split requests by
        # tokens or serve them on attention-DP groups [PLAN-6, DP-1].
        self.in_plan: PlanBook | None = self.workload.plans(who.stage - 1) if who.stage else None
        self.out_plan: PlanBook | None = (
            self.workload.plans(who.stage) if who.stage < config.last_stage else None
        )
        self.targets = self.out_plan.targets_of(who.rank) if self.out_plan else ()
        self.sources = self.in_plan.sources_of(who.rank) if self.in_plan else ()
        self.groups = config.stream_groups  # streamed [STREAM-1]: layer groups, or 0
        self.layer_groups = layer_groups(self.model.num_layers, self.groups) if self.groups else ()

    def peer(self, stage: int, rank: int) -> RankId:
        return RankId(self.who.replica, stage, rank)

    def edge_name(self, src: int, dst: int, stage: int) -> str:
        return f"replica {self.who.replica} stage {stage}->{stage + 1} {src}->{dst}"
