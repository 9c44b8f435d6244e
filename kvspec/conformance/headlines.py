"""Headline accuracy: does the report's first cause name the rule a one-bug mutant breaks?

Issue 43 measures :mod:`kvspec.conformance.causes` against the project's own corpus
(:mod:`kvspec.conformance.mutants`): each mutant goes through the whole suite, shrunk as a
user's run is, its failures are grouped into causes, and the first cause's headline is
*right* when its violated obligation is one the mutant is registered as breaking, or of
the same family (a PP remainder bug headlined by ``LAYER-1.1`` or by its family's more
basic ``LAYER-2.1`` names the layer split either way; headlined by ``STAGE-1`` or
``RESHARD-2`` it sends the reader to the wrong rule). :func:`accuracy` is the share of
right headlines; docs/conformance.md states it and ``tests/suite/test_headlines.py`` keeps
it at 95 % or more. A mutant whose bug is a refusal's message (``unclear``) fails no check:
its headline is the first check with an ``unclear`` note and the obligation the note
cites, tier ``unclear``.

**What is run, exactly.** A check can fail a mutant only if it touches what the mutant
changed: the profile is derandomized, so a check that reads none of the mutant's
attributes draws the very examples it drew on the reference, gets the same answers and
passes as the reference does. :func:`trace_reference` runs every check once on the
reference and records which attributes of the adapter each one read (methods and data:
``sources``, ``domain``, a helper such as ``plan``); :func:`changed_attributes` lists what
a mutant's class defines over :class:`~kvspec.conformance.reference.ReferenceAdapter`;
:func:`run_headline` runs, on the mutant, the checks whose trace meets that list, and
counts every other one passed. A mutant that changes what cannot be traced this way (its
``__init__``, another dunder) is run through every check. The result is the whole-suite
run's failures, at a fraction of its cost.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.conformance.checks import Check, all_checks
from kvspec.conformance.checks.expectations import UNCLEAR
from kvspec.conformance.mutants import Mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.result import FAILED, CheckResult
from kvspec.conformance.runner import run_check

_CITED_OBLIGATION = re.compile(r"\[([A-Z]+-[0-9]+\.[0-9]+)\]")
"""The obligation an ``unclear`` note cites, at its end: ``[HEAD-1.2]``."""

_CLASS_BOOKKEEPING = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__firstlineno__",
        "__static_attributes__",
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__orig_bases__",
        "__parameters__",
        "_abc_impl",
        "__abstractmethods__",  # ABCMeta's, on every adapter subclassing a protocol
    }
)
"""What every class body defines: no behaviour a check could read."""


def _recording_reference(seen: set[str]) -> ReferenceAdapter:
    """A reference adapter that adds to ``seen`` the name of every attribute read on it."""

    class Recording(ReferenceAdapter):
        def __getattribute__(self, name: str) -> Any:
            seen.add(name)
            return super().__getattribute__(name)

    Recording.__name__ = Recording.__qualname__ = "ReferenceAdapter"
    return Recording()


def trace_reference(
    checks: Sequence[Check] | None = None, *, profile: str = "quick", device: str = "cpu"
) -> dict[str, frozenset[str]]:
    """Check id -> the names of the adapter attributes the check read, run on the reference
    under ``profile``. A check the reference fails is refused: the trace would not be the
    reference's behaviour."""
    traces: dict[str, frozenset[str]] = {}
    for check in all_checks() if checks is None else checks:
        seen: set[str] = set()
        result = run_check(check, _recording_reference(seen), device=device, profile=profile)
        if result.verdict == FAILED:
            raise RuntimeError(f"the reference fails {check.id}: {result.reason}")
        traces[check.id] = frozenset(seen)
    return traces


def changed_attributes(mutant: Mutant) -> frozenset[str] | None:
    """The attributes ``mutant``'s classes define over the reference's (methods, data, the
    registry's ``name``), or None when one of them cannot be traced (``__init__`` or
    another dunder): the mutant then runs through every check."""
    changed: set[str] = set()
    for cls in mutant.cls.__mro__:
        if cls is ReferenceAdapter:
            break
        names = set(vars(cls)) - _CLASS_BOOKKEEPING
        if any(n.startswith("__") and n.endswith("__") for n in names):
            return None
        changed |= names
    else:
        return None  # not a reference subclass: nothing is known about it
    return frozenset(changed)


@dataclass
class Headline:
    """What the report's first cause says about one mutant."""

    mutant: str
    obligations: tuple[str, ...]
    """What the mutant is registered as breaking."""
    headline: str | None = None
    """The first cause's headline check (None: nothing failed)."""
    obligation: str | None = None
    """The obligation that headline violated."""
    tier: str | None = None
    failures: list[str] = field(default_factory=list)
    checks_run: int = 0
    seconds: float = 0.0

    @property
    def exact(self) -> bool:
        """The headline's obligation is one the mutant breaks."""
        return self.obligation in self.obligations

    @property
    def right(self) -> bool:
        """The headline names the broken rule: its obligation, or one of its family."""
        families = {o.split("-", 1)[0] for o in self.obligations}
        return self.exact or (self.obligation or "").split("-", 1)[0] in families

    def to_dict(self) -> dict[str, Any]:
        return {
            "mutant": self.mutant,
            "obligations": list(self.obligations),
            "headline": self.headline,
            "obligation": self.obligation,
            "tier": self.tier,
            "right": self.right,
            "exact": self.exact,
            "failures": self.failures,
            "checks_run": self.checks_run,
            "seconds": round(self.seconds, 2),
        }


def checks_touching(
    mutant: Mutant, traces: Mapping[str, frozenset[str]], checks: Sequence[Check]
) -> list[Check]:
    """The checks of ``checks`` that read something ``mutant`` changes (all, when its
    changes cannot be traced or a check has no trace)."""
    changed = changed_attributes(mutant)
    if changed is None:
        return list(checks)
    return [c for c in checks if c.id not in traces or traces[c.id] & changed]


def run_headline(
    mutant: Mutant,
    traces: Mapping[str, frozenset[str]],
    *,
    profile: str = "quick",
    device: str = "cpu",
    checks: Sequence[Check] | None = None,
) -> Headline:
    """The first cause's headline when ``mutant`` runs through the suite (shrunk, under
    ``profile``), running only the checks that touch what it changed."""
    from kvspec.conformance.causes import group, violated

    started = time.perf_counter()
    found = Headline(mutant.name, mutant.obligations)
    adapter = mutant.cls()
    results: list[CheckResult] = []
    for check in checks_touching(mutant, traces, all_checks() if checks is None else checks):
        results.append(run_check(check, adapter, device=device, profile=profile))
        found.checks_run += 1
    found.failures = [r.check.id for r in results if r.verdict == FAILED]
    causes = group(results)
    noted = [r for r in results if r.notes]
    if causes:
        head = causes[0].headline
        found.headline, found.obligation, found.tier = head.check.id, violated(head), causes[0].tier
    elif noted:  # nothing failed; the first unclear refusal is what the report leads with
        cited = _CITED_OBLIGATION.findall(noted[0].notes[0])
        found.headline, found.obligation = noted[0].check.id, cited[-1] if cited else None
        found.tier = UNCLEAR
    found.seconds = time.perf_counter() - started
    return found


def accuracy(headlines: Sequence[Headline]) -> float:
    """The share of ``headlines`` that are right (1.0 for none)."""
    return sum(h.right for h in headlines) / len(headlines) if headlines else 1.0


def run_corpus_headlines(
    mutants: Sequence[Mutant],
    *,
    profile: str = "quick",
    device: str = "cpu",
    progress: Callable[[int, int, Headline], None] | None = None,
) -> list[Headline]:
    """:func:`run_headline` over ``mutants``, tracing the reference once."""
    traces = trace_reference(profile=profile, device=device)
    found = []
    for i, mutant in enumerate(mutants, 1):
        found.append(run_headline(mutant, traces, profile=profile, device=device))
        if progress:
            progress(i, len(mutants), found[-1])
    return found
