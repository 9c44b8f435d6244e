"""Running the mutant corpus through the suite: the suite's kill rate.

Each mutant (:mod:`kvspec.conformance.mutants`) runs through the checks that cover the
obligations it breaks first, then through the rest of the suite, and is *killed* at the
first check that fails; one that passes every check *survives*. A survivor is a missing
check. A mutant whose bug is a refusal's message (registered ``unclear``) is killed at
the first check that fails or carries an ``unclear`` note: its refusals are refusals, so
no verdict fails, but the report names the message that names none of the offending
values. Counterexamples are not shrunk here: the question is whether, not how small.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from kvspec.conformance.checks import all_checks
from kvspec.conformance.mutants import Mutant, all_mutants, get_mutant
from kvspec.conformance.runner import FAILED, checks_covering, run_check, worker_start
from kvspec.testing.profiles import default_profile


@dataclass
class MutantResult:
    """What the suite did to one mutant."""

    name: str
    obligations: tuple[str, ...]
    bug: str
    killed_by: str | None = None
    reason: str = ""
    checks_run: int = 0
    seconds: float = 0.0

    @property
    def killed(self) -> bool:
        return self.killed_by is not None

    @property
    def by_own_check(self) -> bool:
        """Whether a check covering one of its obligations killed it."""
        return self.killed_by in {c.id for c in checks_covering(self.obligations)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "mutant": self.name,
            "obligations": list(self.obligations),
            "bug": self.bug,
            "killed": self.killed,
            "killed_by": self.killed_by,
            "reason": self.reason,
            "checks_run": self.checks_run,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class MutationReport:
    """The corpus run: one result per mutant."""

    profile: str
    device: str
    results: list[MutantResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def killed(self) -> int:
        return sum(r.killed for r in self.results)

    @property
    def survivors(self) -> list[MutantResult]:
        return [r for r in self.results if not r.killed]

    @property
    def kill_rate(self) -> float:
        return self.killed / len(self.results) if self.results else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "device": self.device,
            "mutants": len(self.results),
            "killed": self.killed,
            "kill_rate": round(self.kill_rate, 4),
            "seconds": round(self.seconds, 2),
            "results": [r.to_dict() for r in self.results],
        }


def run_mutant(mutant: Mutant, *, device: str = "cpu", profile: str | None = None) -> MutantResult:
    """The mutant through its obligations' checks, then the rest, until one fails, under
    ``profile`` (default: :func:`~kvspec.testing.profiles.default_profile`)."""
    started = time.perf_counter()
    result = MutantResult(mutant.name, mutant.obligations, mutant.bug)
    adapter = mutant.cls()
    own = checks_covering(mutant.obligations)
    rest = [c for c in all_checks() if c not in own]
    for check in [*own, *rest]:
        outcome = run_check(check, adapter, device=device, shrink=False, profile=profile)
        result.checks_run += 1
        if outcome.verdict == FAILED:
            result.killed_by, result.reason = check.id, outcome.reason
            break
        if mutant.unclear and outcome.notes:
            result.killed_by, result.reason = check.id, outcome.notes[0]
            break
    result.seconds = time.perf_counter() - started
    return result


def _run_named(name: str, device: str, profile: str) -> MutantResult:
    return run_mutant(get_mutant(name), device=device, profile=profile)


def run_corpus(
    mutants: Sequence[Mutant] | None = None,
    *,
    profile: str | None = None,
    device: str = "cpu",
    jobs: int = 1,
    progress: Callable[[int, int, MutantResult], None] | None = None,
) -> MutationReport:
    """Run every mutant (or ``mutants``) through the suite under ``profile``.

    ``jobs`` > 1 runs mutants in that many worker processes (spawned, one torch thread
    each); the results come back in corpus order.
    """
    chosen_profile = profile or default_profile()
    chosen = list(all_mutants() if mutants is None else mutants)
    report = MutationReport(chosen_profile, device)
    started = time.perf_counter()
    if jobs <= 1:
        for i, mutant in enumerate(chosen, 1):
            report.results.append(run_mutant(mutant, device=device, profile=chosen_profile))
            if progress:
                progress(i, len(chosen), report.results[-1])
    else:
        with ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=get_context("spawn"),
            initializer=worker_start,
        ) as pool:
            futures = [pool.submit(_run_named, m.name, device, chosen_profile) for m in chosen]
            for i, future in enumerate(futures, 1):
                report.results.append(future.result())
                if progress:
                    progress(i, len(chosen), report.results[-1])
    report.seconds = time.perf_counter() - started
    return report


def render_mutation(report: MutationReport) -> str:
    """One line per mutant, the survivors, and the kill rate."""
    lines = [
        f"kvspec conform --mutants: {len(report.results)} mutants of the reference, profile "
        f"{report.profile}, device {report.device}",
        "",
        f"{'mutant':<36} {'obligations':<24} {'verdict':<8} killed by",
    ]
    for r in report.results:
        verdict = "killed" if r.killed else "SURVIVED"
        lines.append(f"{r.name:<36} {','.join(r.obligations):<24} {verdict:<8} {r.killed_by or ''}")
    if report.survivors:
        lines += ["", "survivors (each is a missing check):"]
        lines += [f"  {r.name} [{', '.join(r.obligations)}]: {r.bug}" for r in report.survivors]
    elsewhere = [r for r in report.results if r.killed and not r.by_own_check]
    if elsewhere:
        lines += ["", "killed only by a check that does not cover their obligations:"]
        lines += [f"  {r.name} [{', '.join(r.obligations)}]: {r.killed_by}" for r in elsewhere]
    lines += [
        "",
        f"kill rate: {report.killed}/{len(report.results)} = {100 * report.kill_rate:.1f}% "
        f"in {report.seconds:.1f} s",
    ]
    return "\n".join(lines)
