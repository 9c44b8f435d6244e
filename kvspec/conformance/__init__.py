"""The conformance suite: check any implementation of the spec through a small adapter.

    from kvspec.conformance import Adapter, run_suite

Subclass :class:`Adapter`, override the capabilities your implementation has, and
run ``kvspec conform MODULE:ATTR`` or ``pytest -p kvspec.conformance --kvspec-impl
MODULE:ATTR``. This module is also that pytest plugin.
"""

from kvspec.conformance.adapter import (
    CAPABILITIES,
    Adapter,
    AdapterError,
    NotProvided,
    load_adapter,
    provided_capabilities,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.plugin import (
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_report_header,
    pytest_terminal_summary,
)
from kvspec.conformance.runner import Report, get_check, render, run_check, run_suite

__all__ = [
    "CAPABILITIES",
    "Adapter",
    "AdapterError",
    "Domain",
    "NotProvided",
    "Report",
    "get_check",
    "load_adapter",
    "provided_capabilities",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_report_header",
    "pytest_terminal_summary",
    "render",
    "run_check",
    "run_suite",
]
