"""Every conformance check as one pytest item; collected when ``--kvspec-impl`` is given.

The plugin (:mod:`kvspec.conformance.plugin`) parametrizes ``kvspec_check`` with the
selected checks and runs each through :func:`kvspec.conformance.plugin.run_item`.
"""

import pytest

from kvspec.conformance.checks import Check
from kvspec.conformance.plugin import run_item


def test_check(kvspec_check: Check, request: pytest.FixtureRequest) -> None:
    run_item(request.config, kvspec_check, request.node)
