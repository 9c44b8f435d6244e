"""Fault books: every injected fault is written down where it is injected and again where
it is observed, and a run's books balance only when the two counts agree.

Message faults, per data message, are counted by the sender that injects them and by
the receiver that sees them:

===========  ======================================  =======================================
fault        injected (sender)                        observed (receiver)
===========  ======================================  =======================================
drop         the message is not sent                  a key its end-of-stream lists never came
dup          the message is sent twice                a key arriving again, not below the
                                                      edge's highest ``seq``
reorder      the message is overtaken by the next     a message's ``seq`` is below one already
             one on the same edge                     seen on its edge
corrupt      a bit of a payload frame flips           the codec (push) or the ranges' CRC
                                                      (pull, write) refuses the message
garbage      a frame of random bytes goes first       a one-frame message that is not valid
late         a copy lands after the sender's next     a key arriving again, below the edge's
             message on the edge                      highest ``seq``
abort        a receiver asks a sender to stop a       the sender receives the request
             request (for any failure, ``abort=P``
             included)
fail-nth     the sender's N-th send fails             the sender's notice that it failed
restart      the sender announces its new epoch       the receiver sees the announcement
===========  ======================================  =======================================

``reuse`` strikes blocks, not messages, and is counted by request id: a request whose
blocks a first-stage rank handed to another request early is one injection however many
ranks did so, and one observation however many receivers' oracle refused it
(:data:`BY_REQUEST`); the books balance when every struck request was refused.

A receiver observes the message faults in one admission, the same on every data path
(:meth:`sim.rank.receiver.Receiver.admit`): a second copy is ``late`` or ``dup`` by its
``seq`` alone, whichever path carried it.

A transfer library's own error is no fault: when NIXL or Mooncake refuses or fails a
transfer (:mod:`sim.paths.onesided`), the rank that posted it books it under ``errors``, by
library, with the library's words, and its key is skipped with that reason; it is never
counted as a fault observed (a key listed as sent and never seen would otherwise be
booked a ``drop`` nobody injected), and the run's report names it apart
(:attr:`sim.books.report.SimReport.library_errors`).

Rank faults (``kill``, ``hang``) are announced by the rank to the parent just before
they strike, and observed by the parent (a death, or no answer by the deadline).
``delay`` is a condition of every message, not an event, and is not counted. The
receiver's observations are complete only once it has read every source's
end-of-stream, which the parent waits for before it closes the books
(:mod:`sim.harness.cluster`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sim.net.endpoints import RankId

MESSAGE_FAULTS: tuple[str, ...] = (
    "drop",
    "dup",
    "reorder",
    "corrupt",
    "garbage",
    "late",
    "abort",
    "fail-nth",
    "restart",
)
RANK_FAULTS: tuple[str, ...] = ("kill", "hang")
BY_REQUEST: tuple[str, ...] = ("reuse",)
"""Faults booked by request id on both sides and counted once per request."""


def count(kind: str, booked: list[str]) -> int:
    """How many ``kind`` faults ``booked`` holds: its entries, or for a fault counted by
    request (:data:`BY_REQUEST`) its distinct request ids."""
    return len(set(booked)) if kind in BY_REQUEST else len(booked)


@dataclass
class FaultBook:
    """One rank's books: what it injected and what it observed, by fault, as keys; and
    the transfers a library failed, by library (not faults)."""

    injected: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def inject(self, kind: str, what: str) -> None:
        self.injected[kind].append(what)

    def observe(self, kind: str, what: str) -> None:
        self.observed[kind].append(what)

    def error(self, library: str, what: str) -> None:
        """A transfer ``library`` failed: ``what`` says which, in the library's words."""
        self.errors[library].append(what)

    def to_dict(self) -> dict[str, Any]:
        return {
            "injected": dict(self.injected),
            "observed": dict(self.observed),
            "errors": dict(self.errors),
        }


@dataclass
class Ledger:
    """The run's books: every rank's latest :class:`FaultBook`, summed, and the parent's
    own observations of rank faults."""

    books: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each rank's latest books (a rank reports again when asked: the last word wins)."""
    own: FaultBook = field(default_factory=FaultBook)
    """What the parent itself saw: rank faults announced and observed."""
    closed: set[str] = field(default_factory=set)
    """Ranks whose final books arrived."""

    def add(self, rank: str, book: dict[str, Any]) -> None:
        self.books[rank] = book
        self.closed.add(rank)

    def _sum(self, side: str) -> dict[str, list[str]]:
        total: dict[str, list[str]] = defaultdict(list)
        for book in [*self.books.values(), self.own.to_dict()]:
            for kind, items in book.get(side, {}).items():
                total[kind].extend(items)
        return total

    @property
    def injected(self) -> dict[str, list[str]]:
        return self._sum("injected")

    @property
    def observed(self) -> dict[str, list[str]]:
        return self._sum("observed")

    @property
    def errors(self) -> dict[str, list[str]]:
        """The transfers each library failed, every rank's together."""
        return self._sum("errors")

    def counts(self) -> dict[str, dict[str, int]]:
        """fault -> {"injected": n, "observed": m}, for every fault either side saw."""
        kinds = sorted(set(self.injected) | set(self.observed))
        return {
            k: {
                "injected": count(k, self.injected.get(k, [])),
                "observed": count(k, self.observed.get(k, [])),
            }
            for k in kinds
        }

    def unbalanced(self, kinds: tuple[str, ...]) -> dict[str, dict[str, int]]:
        """The faults among ``kinds`` whose injected and observed counts differ."""
        return {
            k: c for k, c in self.counts().items() if k in kinds and c["injected"] != c["observed"]
        }


def lifecycle_summary(
    by_rank: dict[str, dict[str, Any]], ranks: dict[str, RankId]
) -> dict[str, Any]:
    """Every rank's lifecycle report in one: corruption found in held blocks, trace
    violations, traces checked, blocks poisoned, stale writes that landed; ``ranks``: each
    rank's id by its tag."""
    summary: dict[str, Any] = {
        "corrupted": [],
        "violations": [],
        "traces": 0,
        "events": 0,
        "poisoned": 0,
        "clobbers": 0,
        "reused": 0,
    }
    for tag, report in sorted(by_rank.items()):
        name = ranks[tag].name
        summary["corrupted"] += [{"rank": name, **c} for c in report.get("corrupted", [])]
        for trace in report.get("traces", []):
            summary["traces"] += 1
            summary["events"] += trace.get("events", 0)
            if not trace.get("ok", True):
                summary["violations"].append({"rank": name, **trace})
        summary["poisoned"] += report.get("poisoned", 0)
        summary["clobbers"] += report.get("clobbers", 0)
        summary["reused"] += report.get("reused", 0)
    return summary
