"""tools/gpu_check.sh on a machine without a GPU: it says so and stops (the GPU phases
themselves run only where torch finds one; docs/gpu.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.paths import ROOT as REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make test-gpu")
def test_without_a_gpu_it_names_what_is_missing_and_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        [str(REPO / "tools" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert f"torch {torch.__version__}" in summary and "finds none" in summary, summary
    assert "finds none" in done.stdout
    assert not (tmp_path / "pytest.log").exists()  # no phase ran
