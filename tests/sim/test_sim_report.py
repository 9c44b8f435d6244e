"""What the sim's report claims: only what the run checked, counted from the run; timings
labelled as the simulator's, in units that read; a wall time that is the command's."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import time

import pytest

from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout
from sim.books.accounting import FaultBook, Ledger
from sim.books.report import SimReport, human_rate
from sim.harness.clock import process_age, process_start
from sim.harness.cluster import run_simulation
from sim.harness.progress import ProgressBar
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from sim.run.workload import Workload
from tests.paths import ROOT
from tests.sim.runs import MHA

IMPORTED = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock process_age counts by


def _run(source: int, target: int, **overrides) -> SimReport:
    settings = {"requests": 3, "seq_len": (3, 24), "timeout": 60.0, "transport": "inproc"}
    config = SimConfig(
        stages=(StageLayout(source), StageLayout(target)), model=MHA, **{**settings, **overrides}
    )
    return run_simulation(config)


def _elements_held(config: SimConfig) -> int:
    """Every element the receiving ranks hold of every request, from kvspec's ownership."""
    target = config.stages[1]
    total = 0
    for request in Workload(config, 0).requests:
        for rank in target.ranks():
            owner = rank_ownership(target, config.model, rank, seq_len=request.seq_len)
            total += (
                owner.token_count(request.seq_len)
                * len(owner.layers)
                * config.model.kv_tensors
                * len(owner.heads)
                * config.model.head_dim
            )
    return total


def _line(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


@pytest.mark.parametrize(("source", "target"), [(4, 2), (2, 8)], ids=["fan-in", "replicated"])
def test_the_verified_line_counts_what_the_receivers_compared(source: int, target: int) -> None:
    report = _run(source, target)
    assert report.ok, report.render()
    held = _elements_held(report.config)
    assert report.elements_verified == held  # each receiving rank, replicas of heads too
    assert report.bytes_verified == held * MHA.itemsize
    text = report.render()
    verdict = _line(text, "verified:")
    assert text.splitlines().index(verdict) == text.splitlines().index(_line(text, "requests:")) + 1
    total = len(report.outcomes)
    assert f"{total} of {total} request(s)" in verdict
    assert f"{held:,} elements" in verdict and f"the {target} receiving rank(s)" in verdict
    edges = len(report.planned_bytes)
    assert f"{edges} of {edges} edge(s) moved exactly the plan's bytes" in text
    data = report.to_dict()["verified"]
    assert data == {
        "requests": total,
        "of": total,
        "elements": held,
        "bytes": held * MHA.itemsize,
        "receiving_ranks": target,
        "edges": edges,
        "edges_off_plan": 0,
    }


def test_a_failed_run_claims_only_the_requests_it_verified() -> None:
    report = _run(4, 2, requests=24, faults=parse_faults("drop=0.1"))
    assert report.failed and report.verified, report.render()
    verdict = _line(report.render(), "verified:")
    assert verdict.startswith(f"verified:   {report.verified} of {len(report.outcomes)} ")
    assert f"; {report.failed} failed" in verdict
    assert all(o.elements == 0 for o in report.outcomes if not o.ok)
    assert report.elements_verified == sum(o.elements for o in report.outcomes)
    off = sum(report.edge_bytes.get(k, 0) != n for k, n in report.planned_bytes.items())
    assert off and report.edges_off_plan() == off
    assert f"; {off} differ (marked below)" in report.render()


def test_a_library_error_is_its_own_verdict_never_a_fault() -> None:
    """A transfer a library failed is booked by the rank that posted it under the
    library's name with its words, summed over ranks apart from the faults
    [sim.books.accounting], and fails the run on a line of its own (issue 46)."""
    ledger = Ledger()
    for rank in ("sender-0", "sender-1"):
        book = FaultBook()
        book.error("Mooncake", f"{rank} k: the Mooncake batch WRITE returned -1")
        ledger.add(rank, book.to_dict())
    assert ledger.errors == {
        "Mooncake": [
            f"{r} k: the Mooncake batch WRITE returned -1" for r in ("sender-0", "sender-1")
        ]
    }
    assert ledger.counts() == {} and ledger.unbalanced(("drop",)) == {}
    clean = _run(4, 2)
    assert clean.ok and clean.library_errors == {}, clean.render()
    report = dataclasses.replace(clean, library_errors=dict(ledger.errors))
    assert not report.ok
    text = report.render()
    assert "library:    Mooncake failed 2 transfer(s)" in text, text
    assert "sender-1 k: the Mooncake batch WRITE returned -1" in text
    assert "— FAILED" in _line(text, "requests:")
    assert not any(line.startswith("faults:") for line in text.splitlines()), text
    assert report.to_dict()["library_errors"] == dict(ledger.errors)


def test_rates_read_in_the_unit_that_fits() -> None:
    assert human_rate(12) == "12 B/s"
    assert human_rate(3 * 2**10) == "3.0 KiB/s"
    assert human_rate(12.5 * 2**20) == "12.5 MiB/s"
    stream = io.StringIO()
    ProgressBar(8, stream=stream).update(1, 0, 8, 1000.0)  # a slow start: far below 1 GB/s
    rate = stream.getvalue().rstrip().rsplit(", ", 1)[1]
    assert re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB|GiB)/s", rate), stream.getvalue()


def test_the_throughput_is_labelled_as_the_simulators() -> None:
    text = _run(4, 2).render()
    measured = text.splitlines()[text.splitlines().index(_line(text, "throughput:")) + 1]
    assert "threads of one Python process" in measured and "caches on cpu" in measured
    assert "not a performance figure" in measured
    assert "GB/s" not in text


def test_the_process_start_is_before_anything_it_ran() -> None:
    """The process has lived at least since this module was imported (compared on one
    clock: the wall clock may be stepped between the two readings on a busy VM)."""
    age = process_age()
    if age is None:
        pytest.skip("no /proc here: python -m sim times from its own entry instead")
    assert age >= time.clock_gettime(time.CLOCK_BOOTTIME) - IMPORTED
    assert process_start() is not None


def test_a_command_times_itself_from_the_process_start() -> None:
    before = time.clock_gettime(time.CLOCK_BOOTTIME)  # process_age's clock
    argv = ["run", "--kv-heads", "2", "--requests", "2", "--quiet", "--ports", "os", "--json", "-"]
    done = subprocess.run(
        [sys.executable, "-m", "sim", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    wall = data["command_wall"]
    if process_start() is not None:
        assert wall["since"] == "the process's start"
    parts = wall["startup_seconds"] + wall["transfer_seconds"] + wall["shutdown_seconds"]
    assert parts == pytest.approx(wall["total_seconds"])
    assert wall["before_ranks_seconds"] + wall["ranks_startup_seconds"] == pytest.approx(
        wall["startup_seconds"]
    )
    # more than the run's own clock (the interpreter and imports count), less than the
    # command took from here (a clock tick of slack: /proc counts in ticks)
    assert data["wall_seconds"] < wall["total_seconds"] <= after - before + 0.02
    assert wall["before_ranks_seconds"] > 0
    for kept in ("wall_seconds", "startup_seconds", "throughput_gbps", "transfer_seconds"):
        assert kept in data, f"--json keeps {kept}"


def test_a_library_run_says_its_wall_time_is_the_runs() -> None:
    text = _run(4, 2).render()
    assert "from starting the ranks to stopping them" in _line(text, "wall time:")
