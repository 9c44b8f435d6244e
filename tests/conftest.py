"""Test configuration: the Hypothesis profile and the device every tensor test runs on."""

from __future__ import annotations

import os

import pytest
import torch

from kvspec.testing.profiles import current_profile_name, load_profile

CUDA_REQUIRED = os.environ.get("KVSPEC_REQUIRE_CUDA") == "1"


def pytest_configure(config: pytest.Config) -> None:
    # pytest's own --hypothesis-profile wins; otherwise KVSPEC_PROFILE / CI decide.
    if not config.getoption("hypothesis_profile", default=None):
        load_profile()
    if CUDA_REQUIRED and not torch.cuda.is_available():
        raise pytest.UsageError(
            "KVSPEC_REQUIRE_CUDA=1 but torch.cuda.is_available() is False: "
            f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return [
        f"kvspec: torch {torch.__version__}, cuda device: {cuda}, "
        f"hypothesis profile: {current_profile_name()}"
    ]


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not torch.cuda.is_available(),
                reason="no CUDA device: torch.cuda.is_available() is False",
            ),
        ],
    ),
]


@pytest.fixture(params=DEVICES, scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """``cpu`` always; ``cuda`` when present, else skipped with the reason shown."""
    return request.param
