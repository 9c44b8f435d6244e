"""Fixtures of the suite's self-tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ci_profile() -> Iterator[None]:
    """The suite's checks run under ``ci`` in the module, whatever profile the session uses."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSPEC_PROFILE", "ci")
        yield
