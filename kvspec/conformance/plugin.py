"""The pytest plugin: ``pytest --kvspec-impl IMPL`` (or ``KVSPEC_IMPL=IMPL pytest``).

Installed with kvspec as a ``pytest11`` entry point, it does nothing at all unless an
implementation is named. Then every conformance check becomes one test item,
``test_kvspec_conformance.py::test_check[PLAN-2/exact-cover]``, marked ``kvspec`` and
``kvspec_family(FAMILY)``, so ``-k``, ``-m`` and the usual counts work. With no test
paths on the command line the run is the conformance suite alone; with paths, the
suite runs beside those tests.

A check whose capability the adapter lacks is skipped as "not provided"; entries of
the implementation's skips file (``--kvspec-skips``) are skipped with their reason,
and entries matching no check are reported at the end. The checks run under the
kvspec profile chosen by ``--kvspec-profile`` (or ``KVSPEC_PROFILE``/``CI``), applied
to each check alone: a Hypothesis profile the user loaded stays in force for the
user's own tests.

The verdicts are ``kvspec conform``'s (issue 43): ``--kvspec-fail-on TIERS`` takes the
CLI's ``--fail-on`` with its default (every tier for ``reference``, ``corrupts,breaks``
for any other adapter). A failure in one of those tiers that serving may reach fails
its test, its message led by its tier; any other failure is an expected failure
(``xfail``, with its tier and why it does not fail the run), as the CLI reports it
without failing the exit status. The terminal summary groups the failures into the
CLI's causes (:func:`kvspec.conformance.causes.group`) and ends with the CLI's last line;
a run whose only fault is an inconclusive check exits 3, as the CLI does. Each item's
result travels in its report (``user_properties``), so the summary is whole under
pytest-xdist too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.adapter import AdapterError, load_adapter, provided_capabilities
from kvspec.conformance.checks import Check, all_checks
from kvspec.conformance.reproduction import reproduction
from kvspec.conformance.runner import (
    FAILED,
    INCONCLUSIVE,
    NOT_PROVIDED,
    CheckResult,
    Report,
    adapter_label,
    get_check,
    run_check,
    select_checks,
)
from kvspec.conformance.skips import SkipEntry, read_skips, resolve_skips
from kvspec.core.tier_names import default_fail_on, parse_tiers
from kvspec.testing.profiles import PROFILES, default_profile

_STATE = pytest.StashKey[dict[str, Any]]()
SUITE_DIR = Path(__file__).resolve().parent / "pytest_suite"
"""The package folder holding the suite's one test module."""
RESULT_PROPERTY = "kvspec_result"
"""The ``user_properties`` name under which an item's report carries its check result."""
EXIT_INCONCLUSIVE = 3
"""``kvspec conform``'s exit status when nothing failed but a check was inconclusive."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance")
    group.addoption(
        "--kvspec-impl",
        help="adapter under test: `reference` or MODULE:ATTR (default: $KVSPEC_IMPL); "
        "without it this plugin does nothing",
    )
    group.addoption("--kvspec-skips", help="the implementation's skips file ($KVSPEC_SKIPS)")
    group.addoption("--kvspec-device", default="cpu", help="tensor device (cpu)")
    group.addoption(
        "--kvspec-profile",
        choices=PROFILES,
        help="kvspec Hypothesis profile for the checks ($KVSPEC_PROFILE; ci if $CI; else dev)",
    )
    group.addoption(
        "--kvspec-clause",
        action="append",
        default=[],
        help="run only checks matching this pattern (repeatable)",
    )
    group.addoption(
        "--kvspec-fail-on",
        metavar="TIERS",
        help="tiers whose failures fail the run, as kvspec conform --fail-on: a comma list "
        "of corrupts, breaks, accepts-invalid, differs, or all (default: all for reference, "
        "corrupts,breaks for any other adapter; $KVSPEC_FAIL_ON); other failures are xfail",
    )


def pytest_configure(config: pytest.Config) -> None:
    impl = config.getoption("kvspec_impl", None) or os.environ.get("KVSPEC_IMPL")
    if not impl:
        return
    try:
        adapter = load_adapter(impl)
    except AdapterError as error:
        raise pytest.UsageError(f"kvspec: cannot use {impl}: {error}") from error
    try:
        checks = select_checks(config.getoption("kvspec_clause"))
        profile = config.getoption("kvspec_profile", None) or default_profile()
    except ValueError as error:
        raise pytest.UsageError(f"kvspec: {error}") from error
    fail_on_text = config.getoption("kvspec_fail_on", None) or os.environ.get("KVSPEC_FAIL_ON")
    try:
        fail_on = default_fail_on(impl) if not fail_on_text else parse_tiers(fail_on_text)
    except ValueError as error:
        raise pytest.UsageError(f"kvspec: --kvspec-fail-on: {error}") from error
    skips_path = config.getoption("kvspec_skips", None) or os.environ.get("KVSPEC_SKIPS")
    skips: dict[str, str] = {}
    unused: list[SkipEntry] = []
    if skips_path:
        try:
            # Against the whole suite: an entry for a check --kvspec-clause left out is
            # still a good entry, and the skips of checks not run do not matter.
            skips, unused = resolve_skips(read_skips(skips_path), all_checks())
        except (OSError, ValueError) as error:
            raise pytest.UsageError(f"kvspec: skips file: {error}") from error
    _COLLECTED.clear()  # a session's own results only (pytester runs several in one process)
    config.stash[_STATE] = {
        "impl": impl,
        "adapter": adapter,
        "checks": checks,
        "profile": profile,
        "skips": skips,
        "skips_path": skips_path,
        "unused": unused,
        "device": config.getoption("kvspec_device"),
        "fail_on": fail_on,
    }
    config.addinivalue_line("markers", "kvspec: a kvspec conformance check")
    config.addinivalue_line("markers", "kvspec_family(name): the clause family a check verifies")
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(str(SUITE_DIR))
    else:  # no paths given: the run is the conformance suite
        config.args[:] = [str(SUITE_DIR)]


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE, None)
    if state is None:
        return []
    adapter = state["adapter"]
    return [
        f"kvspec conformance: {state['impl']} ({adapter_label(adapter)}), capabilities: "
        + ", ".join(sorted(provided_capabilities(adapter))),
        f"kvspec: profile {state['profile']}, device {state['device']}, "
        f"fail on {','.join(state['fail_on'])}, skips file {state['skips_path'] or 'none'}",
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kvspec_check" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(_STATE, None)
    checks: list[Check] = [] if state is None else state["checks"]
    metafunc.parametrize(
        "kvspec_check",
        [
            pytest.param(
                c,
                id=c.id,
                marks=[pytest.mark.kvspec, pytest.mark.kvspec_family(c.clause.split("-")[0])],
            )
            for c in checks
        ],
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect each check's result from its report (in the controller, under xdist)."""
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == RESULT_PROPERTY and isinstance(value, dict):
            _COLLECTED[str(value["check"])] = value


_COLLECTED: dict[str, dict[str, Any]] = {}
"""Check id -> its result's plain data, from the reports of this session."""


def _report(state: dict[str, Any]) -> Report:
    """The session's results as the CLI's report, in the checks' order."""
    results = []
    for check in state["checks"]:
        data = _COLLECTED.get(check.id)
        if data is not None:
            fields = {k: v for k, v in data.items() if k != "check"}
            results.append(CheckResult(get_check(check.id), **fields))
    return Report(
        state["impl"],
        state["adapter"],
        state["profile"],
        state["device"],
        results,
        fail_on=state["fail_on"],
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Exit 3 when the suite's only fault is an inconclusive check, as the CLI does."""
    state = session.config.stash.get(_STATE, None)
    if state is None or exitstatus != pytest.ExitCode.OK:
        return
    if _report(state).exit_code == EXIT_INCONCLUSIVE:
        session.exitstatus = EXIT_INCONCLUSIVE


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for entry in state["unused"]:
        terminalreporter.write_line(
            f"kvspec: warning: {state['skips_path']}:{entry.line}: skip entry "
            f"{entry.pattern!r} matches no check",
            yellow=True,
        )
    report = _report(state)
    if not report.results:
        return
    from kvspec.conformance.brief import exit_line, summary_line

    terminalreporter.section("kvspec conformance")
    terminalreporter.write_line(summary_line(report))
    if report.failed:
        from kvspec.conformance.causes import group, violated

        causes = group(report.results)
        for n, cause in enumerate(causes, 1):
            head = cause.headline
            also = f", {len(cause.consequences)} consequence(s)" if cause.consequences else ""
            terminalreporter.write_line(
                f"cause {n} of {len(causes)}: {cause.tier}  {head.check.id}  "
                f"[{violated(head) or '?'}]  reachable in serving: "
                f"{cause.reachable_in_serving or 'not judged'}{also}"
            )
    terminalreporter.write_line(exit_line(report))


def run_item(config: pytest.Config, check: Check, item: pytest.Item | None = None) -> None:
    """One check as a pytest test: skipped, passed, failed with its tier and counterexample,
    or an expected failure when its tier does not fail the run (``--kvspec-fail-on``) or
    serving never reaches it."""
    state = config.stash.get(_STATE, None)
    if state is None:
        pytest.skip("no implementation named: give --kvspec-impl or KVSPEC_IMPL")
    if check.id in state["skips"]:
        pytest.skip(f"skips file: {state['skips'][check.id]}")
    result = run_check(check, state["adapter"], device=state["device"], profile=state["profile"])
    if item is not None:
        data = {k: v for k, v in vars(result).items() if k != "check"}  # plain data, for xdist
        plain = json.loads(json.dumps(data, default=repr))
        item.user_properties.append((RESULT_PROPERTY, {"check": check.id, **plain}))
    if result.verdict == NOT_PROVIDED:
        pytest.skip(f"not provided: {result.reason}")
    if result.verdict == INCONCLUSIVE:  # too few examples inside the domain to be a pass
        pytest.skip(f"inconclusive: {result.reason}")
    if result.verdict != FAILED:
        return
    tier = result.tier or "breaks"
    message = "\n".join(
        [
            f"{tier}: {check.id} failed [{result.obligation or '?'}]: {check.title}; "
            f"reachable in serving: {result.reachable_in_serving or 'not judged'}",
            f"counterexample: {json.dumps(result.counterexample)}",
            f"what happened: {result.reason}",
            f"reproduce: {reproduction(state['impl'], result)}",
        ]
    )
    if tier not in state["fail_on"]:
        pytest.xfail(f"{tier}, not in --kvspec-fail-on {','.join(state['fail_on'])}: {message}")
    if result.reachable_in_serving == "no":
        pytest.xfail(
            f"{tier}, never reached in serving ({result.reachability_evidence}): {message}"
        )
    pytest.fail(message, pytrace=False)
