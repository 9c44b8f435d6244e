"""The conformance suite: check any implementation of the spec through a small adapter.

    from kvspec.conformance import Adapter, run_suite

Subclass :class:`Adapter` and the capability protocols your implementation answers
(``class Mine(Adapter, RoutingProtocol)``, from :mod:`kvspec.conformance.adapter.protocols`;
:class:`FullAdapter` has them all), override their methods, and run
``kvspec conform MODULE:ATTR`` or ``pytest --kvspec-impl MODULE:ATTR`` (the pytest plugin,
:mod:`kvspec.conformance.plugin`, is installed with kvspec and idle unless an
implementation is named). Nothing here imports pytest.
"""

from kvspec.conformance.adapter import (
    CAPABILITIES,
    Acceptance,
    Adapter,
    AdapterError,
    FullAdapter,
    NotProvided,
    load_adapter,
    provided_capabilities,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.runner import Report, get_check, render, run_check, run_suite

__all__ = [
    "CAPABILITIES",
    "Acceptance",
    "Adapter",
    "AdapterError",
    "Domain",
    "FullAdapter",
    "NotProvided",
    "Report",
    "get_check",
    "load_adapter",
    "provided_capabilities",
    "render",
    "run_check",
    "run_suite",
]
