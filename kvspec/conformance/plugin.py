"""The pytest plugin: ``pytest -p kvspec.conformance --kvspec-impl IMPL``.

Every conformance check becomes one test item (``kvspec::PLAN-2/exact-cover``). A
check whose capability the adapter lacks is skipped as "not provided"; entries of the
implementation's skips file (``--kvspec-skips``) are skipped with their reason, and
entries matching no check are reported at the end.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from kvspec.conformance.adapter import AdapterError, load_adapter, provided_capabilities
from kvspec.conformance.checks import Check, all_checks
from kvspec.conformance.runner import (
    FAILED,
    NOT_PROVIDED,
    CheckResult,
    reproduction,
    run_check,
    select_checks,
)
from kvspec.conformance.skips import SkipEntry, read_skips, resolve_skips
from kvspec.profiles import load_profile

_STATE = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance")
    group.addoption(
        "--kvspec-impl",
        help="adapter under test: `reference` or MODULE:ATTR (default: $KVSPEC_IMPL)",
    )
    group.addoption("--kvspec-skips", help="the implementation's skips file ($KVSPEC_SKIPS)")
    group.addoption("--kvspec-device", default="cpu", help="tensor device (cpu)")
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
    if not config.getoption("hypothesis_profile", None):
        load_profile()
    skips_path = config.getoption("kvspec_skips", None) or os.environ.get("KVSPEC_SKIPS")
    skips: dict[str, str] = {}
    unused: list[SkipEntry] = []
    if skips_path:
        skips, unused = resolve_skips(read_skips(skips_path), all_checks())
    config.stash[_STATE] = {
        "impl": impl,
        "adapter": adapter,
        "skips": skips,
        "skips_path": skips_path,
        "unused": unused,
        "device": config.getoption("kvspec_device"),
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE, None)
    if state is None:
        return []
    adapter = state["adapter"]
    from hypothesis import settings

    return [
        f"kvspec conformance: {state['impl']} ({adapter.name} {adapter.version})".rstrip()
        + f", capabilities: {', '.join(sorted(provided_capabilities(adapter)))}",
        f"kvspec: hypothesis profile {settings._current_profile}, device {state['device']}, "
        f"skips file {state['skips_path'] or 'none'}",
    ]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for check in select_checks(config.getoption("kvspec_clause")):
        items.append(ConformanceItem.from_parent(session, name=f"kvspec::{check.id}", check=check))


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


class ConformanceFailure(Exception):
    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.reason)
        self.result = result


class ConformanceItem(pytest.Item):
    """One conformance check as a pytest test."""

    def __init__(self, *, check: Check, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        state = self.config.stash[_STATE]
        if self.check.id in state["skips"]:
            pytest.skip(f"skips file: {state['skips'][self.check.id]}")
        result = run_check(self.check, state["adapter"], device=state["device"])
        if result.verdict == NOT_PROVIDED:
            pytest.skip(f"not provided: {result.reason}")
        if result.verdict == FAILED:
            raise ConformanceFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            result = excinfo.value.result
            impl = self.config.stash[_STATE]["impl"]
            return "\n".join(
                [
                    f"{result.check.id} failed: {result.check.title}",
                    f"counterexample: {json.dumps(result.counterexample)}",
                    f"what happened: {result.reason}",
                    f"reproduce: {reproduction(impl, result)}",
                ]
            )
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "kvspec", None, self.check.id
