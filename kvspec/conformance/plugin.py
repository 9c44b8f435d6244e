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
    adapter_label,
    run_check,
    select_checks,
)
from kvspec.conformance.skips import SkipEntry, read_skips, resolve_skips
from kvspec.profiles import PROFILES, default_profile

_STATE = pytest.StashKey[dict[str, Any]]()
SUITE_DIR = Path(__file__).resolve().parent / "pytest_suite"
"""The package folder holding the suite's one test module."""


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
    config.stash[_STATE] = {
        "impl": impl,
        "adapter": adapter,
        "checks": checks,
        "profile": profile,
        "skips": skips,
        "skips_path": skips_path,
        "unused": unused,
        "device": config.getoption("kvspec_device"),
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
        f"skips file {state['skips_path'] or 'none'}",
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


def run_item(config: pytest.Config, check: Check) -> None:
    """One check as a pytest test: skipped, passed, or failed with its counterexample."""
    state = config.stash.get(_STATE, None)
    if state is None:
        pytest.skip("no implementation named: give --kvspec-impl or KVSPEC_IMPL")
    if check.id in state["skips"]:
        pytest.skip(f"skips file: {state['skips'][check.id]}")
    result = run_check(check, state["adapter"], device=state["device"], profile=state["profile"])
    if result.verdict == NOT_PROVIDED:
        pytest.skip(f"not provided: {result.reason}")
    if result.verdict == INCONCLUSIVE:  # too few examples inside the domain to be a pass
        pytest.skip(f"inconclusive: {result.reason}")
    if result.verdict == FAILED:
        pytest.fail(
            "\n".join(
                [
                    f"{check.id} failed: {check.title}",
                    f"counterexample: {json.dumps(result.counterexample)}",
                    f"what happened: {result.reason}",
                    f"reproduce: {reproduction(state['impl'], result)}",
                ]
            ),
            pytrace=False,
        )
