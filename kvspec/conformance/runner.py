"""Running the checks against an adapter and collecting one result per check.

Each check runs as a Hypothesis property under the chosen profile; the pinned
examples run first. On failure the shrunk counterexample (plain data) is kept with
the violation message and a command that replays exactly that example.
"""

from __future__ import annotations

import fnmatch
import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import example as pinned

from kvspec.clauses import get_clause
from kvspec.conformance.adapter import Adapter, NotProvided, provided_capabilities
from kvspec.conformance.checks import Check, Context, Example, OutsideDomain, Violation, all_checks
from kvspec.profiles import default_profile, profile_settings

PASSED, FAILED, NOT_PROVIDED, SKIPPED = "passed", "FAILED", "not provided", "skipped"


@dataclass
class CheckResult:
    """The verdict of one check: passed, FAILED, not provided or skipped."""

    check: Check
    verdict: str
    tried: int = 0
    outside_domain: int = 0
    reason: str = ""
    counterexample: Example | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check.id,
            "clause": self.check.clause,
            "title": self.check.title,
            "verdict": self.verdict,
            "examples_tried": self.tried,
            "outside_declared_domain": self.outside_domain,
            "reason": self.reason,
            "counterexample": self.counterexample,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Report:
    """All results of one run, and what was run."""

    impl: str
    adapter: Adapter
    profile: str
    device: str
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.results)

    @property
    def failed(self) -> bool:
        return self.count(FAILED) > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "adapter": {"name": self.adapter.name, "version": self.adapter.version},
            "capabilities": sorted(provided_capabilities(self.adapter)),
            "profile": self.profile,
            "device": self.device,
            "seconds": round(self.seconds, 2),
            "summary": {v: self.count(v) for v in (PASSED, FAILED, NOT_PROVIDED, SKIPPED)},
            "results": [r.to_dict() for r in self.results],
        }


def get_check(check_id: str) -> Check:
    """The check with id ``CLAUSE/slug``; unknown ids are refused with the known ones."""
    checks = {c.id: c for c in all_checks()}
    if check_id not in checks:
        raise KeyError(f"no check {check_id!r}; see `kvspec conform --list`")
    return checks[check_id]


def select_checks(patterns: Sequence[str] = ()) -> list[Check]:
    """Checks whose id (``CLAUSE/slug``) matches any glob in ``patterns`` (all if none).

    A bare clause id or family prefix matches too: ``PLAN-2``, ``PLAN``, ``PLAN-*``.
    """
    checks = all_checks()
    if not patterns:
        return checks
    chosen = [c for c in checks if any(_matches(c, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"no check matches {list(patterns)}; see `kvspec conform --list`")
    return chosen


def _matches(check: Check, pattern: str) -> bool:
    pattern = pattern.upper() if "/" not in pattern else pattern
    return (
        fnmatch.fnmatchcase(check.id, pattern)
        or check.clause == pattern
        or check.clause.split("-")[0] == pattern
        or fnmatch.fnmatchcase(check.clause, pattern)
    )


def run_check(
    check: Check,
    adapter: Adapter,
    *,
    device: str = "cpu",
    max_examples: int | None = None,
    replay: Example | None = None,
    profile: str | None = None,
) -> CheckResult:
    """Run one check under ``profile`` (default: :func:`~kvspec.profiles.default_profile`),
    applied to this check alone; ``replay`` runs exactly that example instead of generating."""
    started = time.perf_counter()
    result = CheckResult(check, PASSED)
    missing = sorted(set(check.needs) - provided_capabilities(adapter))
    reason = None if not check.missing else check.missing(adapter)
    if missing or reason:
        result.verdict = NOT_PROVIDED
        result.reason = reason or f"the adapter does not provide {', '.join(missing)}"
        return result
    ctx = Context(adapter, device)
    failures: list[tuple[Example, BaseException]] = []

    def body(example: Example) -> None:
        result.tried += 1
        try:
            check.run(ctx, example)
        except OutsideDomain:
            result.outside_domain += 1
        except NotProvided as error:
            raise _Unprovided(str(error) or "the adapter raised NotProvided") from error
        except BaseException as error:
            failures.append((example, error))
            raise

    try:
        if replay is not None:
            body(replay)
        else:
            _hypothesis_test(check, adapter, body, max_examples, profile)()
    except _Unprovided as error:
        result.verdict, result.reason = NOT_PROVIDED, str(error)
    except BaseException:
        result.verdict = FAILED
        example, error = failures[-1]  # Hypothesis replays the shrunk example last
        result.counterexample = example
        result.reason = describe_failure(error)
    if result.verdict == PASSED and result.tried and result.outside_domain == result.tried:
        result.verdict = NOT_PROVIDED
        result.reason = "every example was outside the adapter's declared domain (supports())"
    result.seconds = time.perf_counter() - started
    return result


class _Unprovided(Exception):
    pass


def _hypothesis_test(
    check: Check,
    adapter: Adapter,
    body: Callable[[Example], None],
    max_examples: int | None,
    profile: str | None,
) -> Callable[[], None]:
    base = profile_settings(profile)  # applied here only; the global profile is untouched
    count = max_examples if max_examples is not None else base.max_examples
    test = given(check.strategy(adapter))(body)
    for ex in reversed(check.examples):
        test = pinned(ex)(test)
    return settings(
        base,
        max_examples=max(1, round(count * check.weight)),
        database=None,
        report_multiple_bugs=False,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )(test)


def describe_failure(error: BaseException) -> str:
    """The violation message, or the exception with its innermost frame."""
    if isinstance(error, Violation):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"the implementation raised {type(error).__name__}: {error}{where}"


def run_suite(
    adapter: Adapter,
    *,
    impl: str = "",
    profile: str | None = None,
    patterns: Sequence[str] = (),
    device: str = "cpu",
    skips: dict[str, str] | None = None,
    progress: Callable[[int, int, CheckResult], None] | None = None,
) -> Report:
    """Run every selected check; skipped checks (id -> reason) are reported, not run."""
    chosen_profile = profile or default_profile()
    report = Report(impl or adapter.name, adapter, chosen_profile, device)
    started = time.perf_counter()
    checks = select_checks(patterns)
    for i, check in enumerate(checks, 1):
        if skips and check.id in skips:
            result = CheckResult(check, SKIPPED, reason=skips[check.id])
        else:
            result = run_check(check, adapter, device=device, profile=chosen_profile)
        report.results.append(result)
        if progress:
            progress(i, len(checks), result)
    report.seconds = time.perf_counter() - started
    return report


def reproduction(impl: str, result: CheckResult) -> str:
    """A command that replays the counterexample of a failed result."""
    example = json.dumps(result.counterexample, separators=(",", ":"))
    return f"kvspec conform {impl} --check {result.check.id} --replay '{example}'"


def _adapter_label(adapter: Adapter) -> str:
    return f"{adapter.name} {adapter.version}".strip()


def render(report: Report) -> str:
    """The per-check table, then each failure with its counterexample and reproduction."""
    lines = [
        f"kvspec conform: {report.impl} ({_adapter_label(report.adapter)}), "
        f"profile {report.profile}, device {report.device}",
        f"capabilities: {', '.join(sorted(provided_capabilities(report.adapter))) or 'none'}",
        "",
        f"{'check':<38} {'verdict':<13} {'examples':>8}  rule",
    ]
    for r in report.results:
        tried = str(r.tried) if r.verdict in (PASSED, FAILED) else ""
        lines.append(f"{r.check.id:<38} {r.verdict:<13} {tried:>8}  {r.check.title}")
    failures = [r for r in report.results if r.verdict == FAILED]
    if failures:
        lines += ["", "failures:"]
    for r in failures:
        clause = get_clause(r.check.clause)
        lines += [
            "",
            f"{r.check.id}: {clause.title}",
            f"  rule: {clause.text}",
            f"  counterexample: {json.dumps(r.counterexample)}",
            f"  what happened: {r.reason}",
            f"  reproduce: {reproduction(report.impl, r)}",
            f"  or in Python: run_check(get_check({r.check.id!r}), adapter, "
            f"replay={json.dumps(r.counterexample)})",
        ]
    others = [r for r in report.results if r.verdict in (NOT_PROVIDED, SKIPPED) and r.reason]
    if others:
        lines += ["", "not run:"]
        lines += [f"  {r.check.id}: {r.verdict}: {r.reason}" for r in others]
    lines += [
        "",
        f"{report.count(PASSED)} passed, {report.count(FAILED)} failed, "
        f"{report.count(NOT_PROVIDED)} not provided, {report.count(SKIPPED)} skipped "
        f"in {report.seconds:.1f} s",
    ]
    return "\n".join(lines)
