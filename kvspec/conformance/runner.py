"""Running the checks against an adapter and collecting one result per check.

Each check runs as a Hypothesis property under the chosen profile; the pinned
examples run first. On failure the shrunk counterexample (plain data) is kept with
the violation message and a command that replays exactly that example.

Every result counts its *effective* examples: those inside the adapter's domain
(:meth:`~kvspec.conformance.adapter.Adapter.supports`) that gave the check something to
test. A check that passed on fewer than :data:`MIN_EFFECTIVE_EXAMPLES` of them (or
fewer than the profile asks for, when that is smaller) is **inconclusive**, not
passed — unless Hypothesis ran out of distinct examples first, in which case the
whole domain was covered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any, cast

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import example as pinned

from kvspec.conformance.adapter import (
    DECLARED,
    Adapter,
    FullAdapter,
    NotProvided,
    load_adapter,
    provided_capabilities,
)
from kvspec.conformance.checks import (
    Check,
    Context,
    Example,
    OutsideDomain,
    Vacuous,
    all_checks,
)
from kvspec.conformance.checks.expectations import crash_report, judging, noting
from kvspec.conformance.pins import pins_for
from kvspec.conformance.result import (
    FAILED,
    INCONCLUSIVE,
    NOT_PROVIDED,
    PASSED,
    SKIPPED,
    VERDICTS,
    CheckResult,
)
from kvspec.conformance.tiers import TIERS, default_fail_on, tier_of
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.conformance.violation import Violation
from kvspec.core.clauses import all_obligations
from kvspec.testing.profiles import default_profile, profile_settings

MIN_EFFECTIVE_EXAMPLES = 20
"""Below this many effective examples a passing check is inconclusive (or below the
number the profile asks for, when that is smaller)."""


@dataclass
class Report:
    """All results of one run, and what was run."""

    impl: str
    adapter: Adapter
    profile: str
    device: str
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    fail_on: tuple[str, ...] | None = None
    """The tiers whose failures fail the exit status (None: :func:`default_fail_on`)."""

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.results)

    @property
    def failing_tiers(self) -> tuple[str, ...]:
        return self.fail_on if self.fail_on is not None else default_fail_on(self.impl)

    def summary_by_tier(self) -> dict[str, int]:
        """FAILED results by tier, every tier present (most severe first)."""
        return {t: sum(r.verdict == FAILED and r.tier == t for r in self.results) for t in TIERS}

    def failing(self) -> list[CheckResult]:
        """The FAILED results that fail the exit status: tier in :attr:`failing_tiers` and
        not known to be unreachable in serving."""
        return [
            r
            for r in self.results
            if r.verdict == FAILED
            and (r.tier or "breaks") in self.failing_tiers
            and r.reachable_in_serving != "no"
        ]

    @property
    def failed(self) -> bool:
        return self.count(FAILED) > 0

    @property
    def inconclusive(self) -> bool:
        return self.count(INCONCLUSIVE) > 0

    @property
    def exit_code(self) -> int:
        """1 iff a FAILED result's tier is in :attr:`failing_tiers` and serving may reach
        it (``reachable_in_serving`` not ``no``); else 3 when a check was inconclusive;
        else 0 (failures of other tiers are reported, not failing)."""
        return 1 if self.failing() else 3 if self.inconclusive else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "adapter": {"name": self.adapter.name, "version": self.adapter.version},
            "capabilities": sorted(provided_capabilities(self.adapter)),
            "domain": self.adapter.domain.describe(),
            "profile": self.profile,
            "device": self.device,
            "seconds": round(self.seconds, 2),
            "summary": {v: self.count(v) for v in VERDICTS},
            "summary_by_tier": self.summary_by_tier(),
            "fail_on": list(self.failing_tiers),
            "causes": [c.to_dict() for c in _causes(self)],
            "results": [
                {**r.to_dict(), "pytest": _pytest(self.impl, r, self.device)} for r in self.results
            ],
        }


def _causes(report: Report) -> list[Any]:
    """The report's failures grouped by cause (:func:`kvspec.conformance.causes.group`),
    most severe first; none without a failure."""
    failures = [r for r in report.results if r.verdict == FAILED]
    if not failures:
        return []
    from kvspec.conformance.causes import group  # imported only when something failed

    return group(report.results)


def _pytest(impl: str, result: CheckResult, device: str) -> str | None:
    """The paste-ready pytest test reproducing a FAILED result, or None."""
    if result.verdict != FAILED:
        return None
    from kvspec.conformance.causes import pytest_test

    return pytest_test(impl, result, device=device)


def get_check(check_id: str) -> Check:
    """The check with id ``CLAUSE/slug``; unknown ids are refused with the known ones."""
    checks = {c.id: c for c in all_checks()}
    if check_id not in checks:
        raise KeyError(f"no check {check_id!r}; see `kvspec conform --list`")
    return checks[check_id]


def select_checks(patterns: Sequence[str] = ()) -> list[Check]:
    """Checks whose id (``CLAUSE/slug``) matches any glob in ``patterns`` (all if none).

    A bare clause id or family prefix matches too: ``PLAN-2``, ``PLAN``, ``PLAN-*``; so
    does an obligation id (``PAYLOAD-3.4``): the checks that cover it
    (:meth:`Check.matches`). A pattern that matches no check is refused, naming it, even
    beside others that match: a typo never narrows a run in silence.
    """
    checks = all_checks()
    if not patterns:
        return checks
    unmatched = [p for p in patterns if not any(c.matches(p) for c in checks)]
    if unmatched:
        which = ", ".join(map(repr, unmatched))
        raise ValueError(
            f"no check matches {which}"
            + (f" (of {list(patterns)})" if len(unmatched) < len(patterns) else "")
            + "; see `kvspec conform --list`"
        )
    return [c for c in checks if any(c.matches(p) for p in patterns)]


def checks_covering(obligations: Sequence[str]) -> list[Check]:
    """The checks that exercise any of ``obligations``, in table order."""
    wanted = set(obligations)
    return [c for c in all_checks() if wanted & set(c.covers)]


def run_check(
    check: Check,
    adapter: Adapter,
    *,
    device: str = "cpu",
    max_examples: int | None = None,
    replay: Example | None = None,
    shrink: bool = True,
    profile: str | None = None,
) -> CheckResult:
    """Run one check under ``profile`` (default: :func:`~kvspec.testing.profiles.default_profile`),
    applied to this check alone; ``replay`` runs exactly that example instead of generating.

    ``shrink=False`` reports the first failing example as found (faster, for counting
    kills rather than reading counterexamples).
    """
    started = time.perf_counter()
    result = CheckResult(check, PASSED)
    missing = sorted(set(check.needs) - provided_capabilities(adapter))
    # A check's own ``missing`` may call the methods of the capabilities it needs: ask it
    # only of an adapter that implements them (a capability its domain declares has none).
    unimplemented = set(missing) - set(DECLARED)
    reason = None if unimplemented or not check.missing else check.missing(adapter)
    if missing or reason:
        result.verdict = NOT_PROVIDED
        result.reason = reason or f"the adapter does not provide {', '.join(missing)}"
        return result
    ctx = Context(cast(FullAdapter, adapter), device)  # it implements check.needs
    failures: list[tuple[Example, BaseException]] = []
    outside_why = ""  # why the last example was outside the domain, if told

    def body(example: Example) -> None:
        nonlocal outside_why
        result.tried += 1
        try:
            check.run(ctx, example)
        except OutsideDomain as outside:
            result.outside_domain += 1
            outside_why = str(outside)
        except Vacuous:
            result.vacuous += 1
        except NotProvided as error:
            raise _Unprovided(str(error) or "the adapter raised NotProvided") from error
        except BaseException as error:
            failures.append((example, error))
            raise

    result.requested = requested_examples(check, profile, max_examples)
    notes: dict[str, str] = {}
    try:
        with judging(adapter), noting() as notes:
            if replay is not None:
                body(replay)
            else:
                hypothesis_test(check, adapter, body, result.requested, shrink, profile)()
    except _Unprovided as error:
        result.verdict, result.reason = NOT_PROVIDED, str(error)
    except BaseException:
        if not failures:  # not the implementation's: an interrupt, a timeout, a Hypothesis error
            raise
        result.verdict = FAILED
        example, failure = failures[-1]  # Hypothesis replays the shrunk example last
        result.counterexample = example
        result.reason = describe_failure(failure)
        judge_failure(result, failure, adapter)
    if result.verdict == PASSED and replay is not None and not result.effective:
        result.verdict = NOT_PROVIDED  # nothing was checked: not a pass
        result.reason = (
            "the replayed example lies outside the adapter's declared domain"
            + (f": {outside_why}" if outside_why else "")
            if result.outside_domain
            else "the replayed example has nothing to test"
        )
    if result.verdict == PASSED and replay is None:
        _judge_sample(result)
    found = list(notes.values())
    result.notes = tuple(found[:MAX_NOTES]) + (
        (f"... and {len(found) - MAX_NOTES} more message(s) as unclear",)
        if len(found) > MAX_NOTES
        else ()
    )
    result.seconds = time.perf_counter() - started
    return result


MAX_NOTES = 3
"""The distinct notes a check's result keeps (the rest counted)."""


def _judge_sample(result: CheckResult) -> None:
    """Turn a pass on too few effective examples into not provided or inconclusive."""
    if result.tried and result.outside_domain == result.tried:
        result.verdict = NOT_PROVIDED
        result.reason = "every example was outside the adapter's declared domain (supports())"
        return
    generated = result.tried - len(result.check.examples)
    exhausted = generated < result.requested  # Hypothesis ran out of distinct examples
    floor = min(MIN_EFFECTIVE_EXAMPLES, result.requested)
    if result.effective < floor and not exhausted:
        result.verdict = INCONCLUSIVE
        result.reason = (
            f"passed on only {result.effective} effective example(s) of {result.tried} "
            f"({result.outside_domain} outside the adapter's domain by supports(), "
            f"{result.vacuous} with nothing to test); at least {floor} are needed: declare "
            "the domain as data (Adapter.domain) so examples are drawn inside it"
        )


class _Unprovided(Exception):
    pass


def requested_examples(check: Check, profile: str | None, max_examples: int | None = None) -> int:
    """How many generated examples ``check`` asks for under ``profile`` (or of
    ``max_examples``): the profile's count scaled by the check's weight, at least one."""
    count = max_examples if max_examples is not None else profile_settings(profile).max_examples
    return max(1, round(count * check.weight))


def hypothesis_test(
    check: Check,
    adapter: Adapter,
    body: Callable[[Example], None],
    max_examples: int,
    shrink: bool,
    profile: str | None,
) -> Callable[[], None]:
    """The Hypothesis test that hands ``body`` the check's pinned examples (as the
    adapter's engine would run them) and then its drawn ones, under ``profile``."""
    base = profile_settings(profile)  # applied here only; the global profile is untouched
    test = given(check.strategy(adapter))(body)
    for ex in reversed(pins_for(adapter, check.examples)):  # as the engine would run them
        test = pinned(ex)(test)
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(
        base,
        max_examples=max_examples,
        database=None,
        report_multiple_bugs=False,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )(test)


def describe_failure(error: BaseException) -> str:
    """The violation message, or the exception with its innermost frame."""
    if isinstance(error, Violation):
        return str(error)
    return f"the implementation raised {crash_report(error)}"


def judge_failure(result: CheckResult, error: BaseException, adapter: Adapter) -> None:
    """Fill a FAILED result's tier and violated obligation (:func:`~kvspec.conformance.
    tiers.tier_of`) and whether serving can reach its counterexample."""
    result.tier, result.obligation = tier_of(error, all_obligations(), result.check.covers)
    result.accepted_input = error.input if isinstance(error, Violation) else None
    where = result.counterexample
    if deployment_of(result.accepted_input) is not None:
        where = result.accepted_input  # the deployment the implementation was handed
    result.reachable_in_serving, result.reachability_evidence = serving_reachability(
        adapter, [result.obligation] if result.obligation else [], where
    )


_DEPLOYMENT_KEYS = ("source", "target", "model")
_PREFERRED = ("bad", "case", "config", "good")
"""Where an example keeps its deployment, first first: the wrongly accepted input of a
refusal probe (``bad``) before the valid one it was made from (``good``)."""


def deployment_of(example: object) -> TransferConfig | None:
    """The deployment ``{source, target, model}`` a counterexample runs on, whatever the
    check's example shape: the example itself when it is a transfer configuration, else
    the first one found inside it (``bad`` before ``case`` before ``good``, then the
    rest in order, breadth first); None when it has none (a layout, a key, a port)."""
    queue: list[object] = [example]
    while queue:
        item = queue.pop(0)
        if isinstance(item, dict):
            if (
                all(k in item for k in _DEPLOYMENT_KEYS)
                and all(isinstance(item[k], dict) for k in _DEPLOYMENT_KEYS)
                and "tp" in item["source"]
                and "tp" in item["target"]
            ):
                # TransferConfig(mapping) is dict(mapping): its required keys, checked above
                return cast(
                    TransferConfig, {k: json.loads(json.dumps(item[k])) for k in _DEPLOYMENT_KEYS}
                )
            ordered = [item[k] for k in _PREFERRED if k in item]
            ordered += [v for k, v in item.items() if k not in _PREFERRED]
            queue += [v for v in ordered if isinstance(v, (dict, list, tuple))]
        elif isinstance(item, (list, tuple)):
            queue += [v for v in item if isinstance(v, (dict, list, tuple))]
    return None


def serving_reachability(
    adapter: Adapter, obligations: Sequence[str], counterexample: object
) -> tuple[str, str]:
    """(``yes`` | ``no`` | ``unknown``, evidence): whether serving can reach a failure
    of ``obligations`` on ``counterexample``.

    ``no`` when every violated obligation is one the adapter says serving never produces
    (``serving_never_produces``: evidence, its reason) or the engine's own start-up
    validation refuses the counterexample's deployment (``serving_accepts`` returns
    ``accepted=False``: its evidence); ``yes`` when that validation accepts it; else
    ``unknown`` (no deployment in the example, or the adapter cannot tell)."""
    never = adapter.serving_never_produces
    if obligations and all(o in never for o in obligations):
        return "no", "; ".join(f"{o}: {never[o]}" for o in obligations)
    config = deployment_of(counterexample)
    if config is None:
        return "unknown", "the counterexample names no deployment (source, target, model)"
    try:
        verdict = adapter.serving_accepts(config)
    except Exception as error:
        return "unknown", f"serving_accepts raised {crash_report(error)}"
    if verdict is None:
        return "unknown", "the adapter cannot tell (serving_accepts returned None)"
    return ("yes" if verdict.accepted else "no"), verdict.evidence


def run_suite(
    adapter: Adapter,
    *,
    impl: str = "",
    profile: str | None = None,
    patterns: Sequence[str] = (),
    checks: Sequence[Check] | None = None,
    device: str = "cpu",
    skips: dict[str, str] | None = None,
    progress: Callable[[int, int, CheckResult], None] | None = None,
    stop_at_first_failure: bool = False,
    shrink: bool = True,
    jobs: int = 1,
) -> Report:
    """Run every selected check (``checks``, or those matching ``patterns``); skipped
    checks (id -> reason) are reported, not run.

    ``jobs`` > 1 runs the checks in that many worker processes (spawned, one torch thread
    each), every worker loading the adapter itself from ``impl`` (``reference`` or
    ``MODULE:ATTR``, as :func:`~kvspec.conformance.adapter.load_adapter` takes it); the
    results come back in the order of the checks, as with one process.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    if jobs > 1 and not impl:
        raise ValueError("jobs > 1 needs impl, the name each worker loads the adapter by")
    chosen_profile = profile or default_profile()
    report = Report(impl or adapter.name, adapter, chosen_profile, device)
    started = time.perf_counter()
    selected = list(checks) if checks is not None else select_checks(patterns)

    pool, pending = None, {}
    if jobs > 1:
        pool = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=worker_start)
        pending = {
            c.id: pool.submit(_run_in_worker, impl, c.id, device, shrink, chosen_profile)
            for c in selected
            if not (skips and c.id in skips)
        }
    try:
        for i, check in enumerate(selected, 1):
            if skips and check.id in skips:
                result = CheckResult(check, SKIPPED, reason=skips[check.id])
            elif pool is not None:
                result = CheckResult(check, **pending[check.id].result())
            else:
                result = run_check(
                    check, adapter, device=device, shrink=shrink, profile=chosen_profile
                )
            report.results.append(result)
            if progress:
                progress(i, len(selected), result)
            if stop_at_first_failure and result.verdict == FAILED:
                break
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    report.seconds = time.perf_counter() - started
    return report


def worker_start() -> None:
    """A worker process of a parallel run: one torch thread, as the workers share the CPUs."""
    import torch

    torch.set_num_threads(1)


_WORKER_ADAPTERS: dict[str, Adapter] = {}
"""The adapter a worker process loaded, by the name it was loaded from."""


def _run_in_worker(
    impl: str, check_id: str, device: str, shrink: bool, profile: str
) -> dict[str, Any]:
    """One check in a worker process; the result's fields other than the check (plain
    data, so they cross the process boundary)."""
    adapter = _WORKER_ADAPTERS.get(impl)
    if adapter is None:
        adapter = _WORKER_ADAPTERS[impl] = load_adapter(impl)
    result = run_check(get_check(check_id), adapter, device=device, shrink=shrink, profile=profile)
    return {name: value for name, value in vars(result).items() if name != "check"}


def adapter_label(adapter: Adapter) -> str:
    """The adapter's name and version, as reports show them."""
    return f"{adapter.name} {adapter.version}".strip()


def render(report: Report) -> str:
    """The per-check table, then each failure with its counterexample and reproduction.

    The examples column is the effective count: examples inside the adapter's domain
    that gave the check something to test.
    """
    lines = [
        f"kvspec conform: {report.impl} ({adapter_label(report.adapter)}), "
        f"profile {report.profile}, device {report.device}",
        f"capabilities: {', '.join(sorted(provided_capabilities(report.adapter))) or 'none'}",
        f"domain: {report.adapter.domain.describe()}",
        "",
        f"{'check':<42} {'verdict':<13} {'examples':>8}  rule",
    ]
    for r in report.results:
        shown = str(r.effective) if r.verdict in (PASSED, FAILED, INCONCLUSIVE) else ""
        lines.append(f"{r.check.id:<42} {r.verdict:<13} {shown:>8}  {r.check.title}")
    failures = [r for r in report.results if r.verdict == FAILED]
    if failures:
        from kvspec.conformance.causes import render_causes

        causes = _causes(report)
        lines += ["", f"failures, by cause ({len(failures)} failed, {len(causes)} cause(s)):"]
        lines += render_causes(report.impl, causes)
    unsure = [r for r in report.results if r.verdict == INCONCLUSIVE]
    if unsure:
        lines += ["", "inconclusive:"]
        lines += [f"  {r.check.id}: {r.reason}" for r in unsure]
    noted = [r for r in report.results if r.notes]
    if noted:
        lines += ["", "unclear refusals (refused, naming none of the offending values):"]
        lines += [f"  {r.check.id}: {note}" for r in noted for note in r.notes]
    others = [r for r in report.results if r.verdict in (NOT_PROVIDED, SKIPPED) and r.reason]
    if others:
        lines += ["", "not run:"]
        lines += [f"  {r.check.id}: {r.verdict}: {r.reason}" for r in others]
    lines += [
        "",
        f"{report.count(PASSED)} passed, {report.count(FAILED)} failed, "
        f"{report.count(INCONCLUSIVE)} inconclusive, {report.count(NOT_PROVIDED)} not provided, "
        f"{report.count(SKIPPED)} skipped in {report.seconds:.1f} s",
    ]
    if failures:
        lines.append(summary_by_tier_line(report))
    return "\n".join(lines)


def summary_by_tier_line(report: Report) -> str:
    """``by tier: corrupts 1, breaks 0, ...; failing the exit status: corrupts, breaks``,
    with how many of the failing tiers' failures serving cannot reach."""
    counts = report.summary_by_tier()
    fails = report.failing()
    unreachable = sum(
        r.verdict == FAILED and r.tier in report.failing_tiers and r.reachable_in_serving == "no"
        for r in report.results
    )
    return (
        "by tier: "
        + ", ".join(f"{t} {n}" for t, n in counts.items())
        + f"; --fail-on {','.join(report.failing_tiers)}: {len(fails)} failing the exit status"
        + (f" ({unreachable} more not reachable in serving)" if unreachable else "")
    )
