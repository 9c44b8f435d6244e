"""Fault books: every injected fault is written down where it is injected and again where
it is observed, and a run's books balance only when the two counts agree.

Message faults, per data message, are counted by the sender that injects them and by
the receiver that sees them:

===========  ======================================  =======================================
fault        injected (sender)                        observed (receiver)
===========  ======================================  =======================================
drop         the message is not sent                  a key its end-of-stream lists never came
dup          the message is sent twice                a key arrives a second time
reorder      the message is overtaken by the next     a message's ``seq`` is below one already
             one on the same edge                     seen on its edge
corrupt      a bit of a payload frame flips           the codec refuses the payload
garbage      a frame of random bytes goes first       a one-frame message that is not valid
===========  ======================================  =======================================

Rank faults (``kill``, ``hang``) are announced by the rank to the parent just before
they strike, and observed by the parent (a death, or no answer by the deadline).
``delay`` is a condition of every message, not an event, and is not counted. The
receiver's observations are complete only once it has read every source's
end-of-stream, which the parent waits for before it closes the books
(:mod:`sim.cluster`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

MESSAGE_FAULTS: tuple[str, ...] = ("drop", "dup", "reorder", "corrupt", "garbage")
RANK_FAULTS: tuple[str, ...] = ("kill", "hang")


@dataclass
class FaultBook:
    """One rank's books: what it injected and what it observed, by fault, as keys."""

    injected: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def inject(self, kind: str, what: str) -> None:
        self.injected[kind].append(what)

    def observe(self, kind: str, what: str) -> None:
        self.observed[kind].append(what)

    def to_dict(self) -> dict[str, Any]:
        return {"injected": dict(self.injected), "observed": dict(self.observed)}


@dataclass
class Ledger:
    """The run's books: every rank's :class:`FaultBook`, summed, and the parent's own
    observations of rank faults."""

    injected: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    observed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    closed: set[str] = field(default_factory=set)
    """Ranks whose final books arrived."""

    def add(self, rank: str, book: dict[str, Any]) -> None:
        for kind, items in book.get("injected", {}).items():
            self.injected[kind].extend(items)
        for kind, items in book.get("observed", {}).items():
            self.observed[kind].extend(items)
        self.closed.add(rank)

    def counts(self) -> dict[str, dict[str, int]]:
        """fault -> {"injected": n, "observed": m}, for every fault either side saw."""
        kinds = sorted(set(self.injected) | set(self.observed))
        return {
            k: {
                "injected": len(self.injected.get(k, ())),
                "observed": len(self.observed.get(k, ())),
            }
            for k in kinds
        }

    def unbalanced(self, kinds: tuple[str, ...]) -> dict[str, dict[str, int]]:
        """The faults among ``kinds`` whose injected and observed counts differ."""
        return {
            k: c for k, c in self.counts().items() if k in kinds and c["injected"] != c["observed"]
        }
