"""The repository's GitHub Action (action.yml, issue 43 item 5): every input it takes is used,
every flag it passes `kvspec conform` is one the command's own parser knows (read from the
parser, not from a copy of its help), and the project's CI uses it once, on the reference."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import build_parser
from kvspec.core.profile_names import PROFILES
from kvspec.core.tier_names import parse_tiers
from tests.paths import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is a dev dependency (make test installs it)")

ACTION = ROOT / "action.yml"
CI = ROOT / ".github" / "workflows" / "ci.yml"
INPUT_USE = re.compile(r"\$\{\{\s*inputs\.([A-Za-z0-9_-]+)")


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def _conform_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["conform"]


def _conform_step(action: dict[str, Any]) -> dict[str, Any]:
    [step] = [s for s in action["runs"]["steps"] if s.get("id") == "conform"]
    return step


def test_the_action_is_a_composite_whose_inputs_are_all_used() -> None:
    action = _load(ACTION)
    assert action["runs"]["using"] == "composite"
    inputs = action["inputs"]
    assert inputs["adapter"]["required"] is True
    used = set(INPUT_USE.findall(ACTION.read_text()))
    assert used == set(inputs), f"declared, not used: {set(inputs) - used}; used: {used}"
    for step in action["runs"]["steps"]:
        if "run" in step:
            assert step["shell"] == "bash", step["name"]
            # inputs reach scripts through env only: no ${{ }} inside a script (injection)
            assert "${{" not in step["run"], step["name"]


def test_every_flag_the_action_passes_is_one_kvspec_conform_takes() -> None:
    action = _load(ACTION)
    step = _conform_step(action)
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", step["run"]))
    known = {s for a in _conform_parser()._actions for s in a.option_strings}
    assert flags, step["run"]
    assert flags <= known, f"not flags of kvspec conform: {sorted(flags - known)}"
    assert {"--profile", "--fail-on", "--json", "--markdown", "--skips", "--clause"} <= flags


def test_the_inputs_defaults_are_values_the_cli_accepts() -> None:
    inputs = _load(ACTION)["inputs"]
    parser = _conform_parser()
    assert inputs["profile"]["default"] in PROFILES
    [profile] = [a for a in parser._actions if "--profile" in a.option_strings]
    assert tuple(profile.choices or ()) == tuple(PROFILES)
    assert inputs["fail-on"]["default"] == ""  # the CLI's own default, per adapter
    for example in ("corrupts,breaks", "all"):
        parse_tiers(example)
    assert int(inputs["jobs"]["default"]) >= 1
    project = (ROOT / "pyproject.toml").read_text()
    assert f'name = "{inputs["install"]["default"]}"' in project  # pip installs this package


def test_the_conform_script_builds_the_command_the_inputs_say(tmp_path: Path) -> None:
    """The step's script, run by bash with `kvspec` replaced by a recorder, passes each
    input to its flag, and leaves out the empty ones."""
    script = _conform_step(_load(ACTION))["run"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "kvspec").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_FILE"\n')
    (fake / "kvspec").chmod(0o755)
    outputs, summary = tmp_path / "outputs", tmp_path / "summary"
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "ARGS_FILE": str(tmp_path / "args"),
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_OUTPUT": str(outputs),
        "GITHUB_STEP_SUMMARY": str(summary),
        "KVSPEC_ADAPTER": "my_adapter:adapter",
        "KVSPEC_PROFILE": "ci",
        "KVSPEC_FAIL_ON": "corrupts",
        "KVSPEC_SKIPS": "",
        "KVSPEC_CLAUSES": "PLAN SLICE-3",
        "KVSPEC_JOBS": "2",
        "KVSPEC_REPORT": "report.json",
    }
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=tmp_path, check=True)
    words = (tmp_path / "args").read_text().splitlines()
    assert words[:2] == ["conform", "my_adapter:adapter"]
    args = _conform_parser().parse_args(words[1:])
    assert (args.impl, args.profile, args.fail_on, args.jobs) == (
        "my_adapter:adapter",
        "ci",
        "corrupts",
        2,
    )
    assert args.patterns == ["PLAN", "SLICE-3"] and args.skips is None
    assert args.json == "report.json" and args.markdown.endswith("kvspec-conform-summary.md")
    assert "exit-code=0" in outputs.read_text()


def test_the_projects_ci_uses_the_action_once_on_the_reference() -> None:
    jobs = _load(CI)["jobs"]
    uses = [
        (name, step)
        for name, job in jobs.items()
        for step in job.get("steps", [])
        if step.get("uses") == "./"
    ]
    assert len(uses) == 1, uses
    _, step = uses[0]
    assert step["with"]["adapter"] == "reference"
    assert step["with"]["install"] == "."  # this checkout's kvspec, not a released one
    assert set(step["with"]) <= set(_load(ACTION)["inputs"])
    shlex.split(step["with"].get("pip-args", ""))
