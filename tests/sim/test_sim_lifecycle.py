"""The simulated cluster as a real block allocator under the lifecycle rules [LIFE].

Receivers allocate blocks as requests arrive and free them after use, so blocks are
reused all the time; aborts, late writes, restarts and failed sends make the hard cases
happen. With the rules on, nothing is ever corrupted and every rank's trace keeps them;
with ``--unsafe-reuse`` the same faults corrupt reused blocks, and the oracle and the
trace checker both say where.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.cli import main as sim_main
from sim.harness.cluster import run_simulation
from sim.run.config import SimConfig
from sim.run.faults import parse_faults

HAZARDS = "abort=0.1,late=0.1,restart=sender:1@0.5"


def _run(faults: str, **overrides) -> SimReport:
    settings = {
        "requests": 32,
        "seq_len": (16, 96),
        "ports": "os",
        "timeout": 60.0,
        "faults": parse_faults(faults),
        **overrides,
    }
    config = SimConfig(
        stages=(StageLayout(4), StageLayout(2)), model=ModelShape(2, 4, 8), **settings
    )
    return run_simulation(config)


def test_with_the_rules_on_nothing_is_corrupted_and_every_trace_keeps_them() -> None:
    report = _run(HAZARDS, seed=1)
    assert not report.errors and not report.timed_out, report.render()
    assert report.verified + report.failed == 32
    assert report.failed > 0, "the faults struck"
    for outcome in report.outcomes:
        assert outcome.ok or outcome.reasons, outcome  # verified, or failed with its reason
    assert report.corrupted == []
    assert report.violations == []
    assert report.lifecycle["traces"] == 6 and report.lifecycle["events"] > 0
    assert not report.unbalanced_faults(), report.fault_counts()
    assert {"abort", "restart"} <= set(report.fault_counts())


def test_unsafe_reuse_corrupts_reused_blocks_and_the_checks_name_it() -> None:
    report = _run(HAZARDS, seed=1, unsafe_reuse=True)
    assert not report.ok
    assert report.corrupted, "a late write landed in a reused block"
    hit = report.corrupted[0]
    assert "differ from the oracle" in hit["why"] and "[ORACLE-5]" in hit["why"]
    writer = re.search(r"late write of shard \S+ of request (\S+) after", hit["why"])
    assert writer and writer.group(1) != hit["request"], "another request's write hit it"
    assert report.violations, "the trace checker names the broken rule"
    assert all(v["obligation"].startswith("LIFE-") for v in report.violations)
    text = report.render()
    assert "held request(s) corrupted" in text and "[LIFE-" in text


def test_blocks_are_really_reused() -> None:
    """Without reuse the lifecycle rules would have nothing to protect. One source, so
    each request is one shard: it is admitted, verified and (hold=1) released in turn."""
    config = SimConfig(
        stages=(StageLayout(1), StageLayout(1)),
        model=ModelShape(2, 2, 8),
        requests=12,
        seq_len=(16, 48),
        transport="inproc",
        hold=1,
    )
    report = run_simulation(config)
    assert report.ok, report.render()
    assert report.lifecycle["reused"] > 0, "freed blocks were handed to later requests"
    no_hold = run_simulation(replace(config, hold=12))  # nothing released before the end
    assert no_hold.ok and no_hold.lifecycle["reused"] == 0


def test_hold_must_be_in_range() -> None:
    with pytest.raises(ValueError, match="--hold"):
        SimConfig(stages=(StageLayout(1), StageLayout(1)), model=ModelShape(1, 1, 1), hold=-1)


def test_the_cli_done_when(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = [
        *shlex.split(
            "run --source-tp 4 --target-tp 2 --kv-heads 4 --requests 24 --quiet"
            " --ports os --seed 2 --faults"
        ),
        HAZARDS,
        "--json",
        str(out),
    ]
    assert sim_main(argv) == 1  # some requests failed, each with its reason
    data = json.loads(out.read_text())
    life = data["lifecycle"]
    assert life["corrupted"] == [] and life["violations"] == []
    assert all(f["reasons"] for f in data["failures"])
    assert data["requests"]["verified"] + data["requests"]["failed"] == 24
    assert sim_main([*argv, "--unsafe-reuse"]) == 1
    unsafe = json.loads(out.read_text())["lifecycle"]
    assert unsafe["corrupted"] and unsafe["violations"]
    capsys.readouterr()
