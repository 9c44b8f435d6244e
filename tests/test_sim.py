"""The simulated cluster: real ranks, real sockets, every element verified, every fault accounted.

Many small configurations run in-process (threads over inproc://) through the same
rank code; a smaller set runs as separate OS processes over TCP on loopback.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import multiprocess
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.cache_layout import get_layout, layouts_for
from kvspec.keys import parse_key
from kvspec.model import ModelShape
from kvspec.ports import port
from kvspec.stage import StageLayout
from kvspec.strategies import transfer_cases
from sim.cli import main as sim_main
from sim.cluster import Cluster, run_simulation
from sim.config import SimConfig
from sim.endpoints import find_free_base
from sim.faults import parse_faults
from sim.report import SimReport

ROOT = Path(__file__).resolve().parent.parent
_next_base = itertools.count(21000, 768)


def free_base(config: SimConfig) -> int:
    """A base port whose KV ports are free now, so concurrent runs do not collide."""
    return find_free_base(config, start=next(_next_base) % 10000 + 21000)


def make(stages: tuple[StageLayout, ...], model: ModelShape, **overrides) -> SimConfig:
    settings_ = {"requests": 3, "seq_len": (3, 24), "timeout": 60.0, **overrides}
    config = SimConfig(stages=stages, model=model, **settings_)
    if config.transport == "inproc" or "base_port" in overrides:
        return config
    return replace(config, base_port=free_base(config))


def assert_all_verified(report: SimReport) -> None:
    assert report.ok, report.render()
    assert (
        report.verified == len(report.outcomes) == report.config.requests * report.config.replicas
    )
    assert report.edge_bytes == report.planned_bytes, "bytes per edge equal the plan [PLAN-5]"


def _no_children_left() -> None:
    deadline = time.time() + 5
    while multiprocess.active_children() and time.time() < deadline:
        time.sleep(0.05)
    assert not multiprocess.active_children()


@st.composite
def sim_configs(draw: st.DrawFn) -> SimConfig:
    case = draw(transfer_cases(sizes=(1, 2, 3, 4, 6, 8), max_pp=2, max_layers=3, max_head_dim=4))
    attention = case.model.attention

    def side() -> tuple[str, int]:
        layout = draw(st.sampled_from(layouts_for(attention)))
        return layout, draw(st.integers(1, 5)) if get_layout(layout).paged else 1

    (src_layout, src_bs), (dst_layout, dst_bs) = side(), side()
    return make(
        (case.source, case.target),
        case.model,
        policy=case.policy,
        src_layout=src_layout,
        src_block_size=src_bs,
        dst_layout=dst_layout,
        dst_block_size=dst_bs,
        requests=2,
        seq_len=(3, 12),
        chunks=draw(st.integers(1, 3)),
        replicas=draw(st.integers(1, 2)),
        slicing=draw(st.sampled_from(["sender", "receiver"])),
        seed=draw(st.integers(0, 1000)),
        transport="inproc",
    )


@given(sim_configs())
@settings(max_examples=60)
def test_in_process_runs_verify_every_element(config: SimConfig) -> None:
    """Many configurations through the same rank code: all verified, bytes equal the plan."""
    assert_all_verified(run_simulation(config))


MHA = ModelShape(2, 4, 8)
PROCESS_RUNS = {
    "fan-in TP4->TP2": dict(stages=(StageLayout(4), StageLayout(2)), model=MHA),
    "fan-out TP2->TP8, replicated target heads": dict(
        stages=(StageLayout(2), StageLayout(8)), model=MHA, slicing="receiver"
    ),
    "replicated source heads TP8->TP2, balanced": dict(
        stages=(StageLayout(8), StageLayout(2)), model=MHA, policy="balanced"
    ),
    "MLA TP4->TP8": dict(
        stages=(StageLayout(4), StageLayout(8)),
        model=ModelShape.mla(3, 16),
        src_layout="mla",
        dst_layout="token_major",
        dst_block_size=1,
    ),
    "PP on both sides, uneven": dict(
        stages=(StageLayout(2, 2), StageLayout(2, 3)), model=ModelShape(5, 4, 8)
    ),
    "layouts and block sizes, fp8": dict(
        stages=(StageLayout(2), StageLayout(4)),
        model=ModelShape(2, 4, 8, dtype="float8_e5m2"),
        src_layout="flashinfer_hnd",
        src_block_size=16,
        dst_layout="kv_tuple",
        dst_block_size=3,
    ),
    "two replica groups, chunked": dict(
        stages=(StageLayout(2), StageLayout(1)), model=MHA, replicas=2, chunks=3
    ),
    "a chain TP4 -> TP2 -> TP1": dict(
        stages=(StageLayout(4), StageLayout(2), StageLayout(1)), model=MHA, chunks=2
    ),
    "several ranks per process": dict(
        stages=(StageLayout(4), StageLayout(4)), model=MHA, ranks_per_process=3
    ),
}


@pytest.mark.parametrize("name", list(PROCESS_RUNS))
def test_multi_process_runs(name: str) -> None:
    report = run_simulation(make(**PROCESS_RUNS[name]))
    assert_all_verified(report)
    assert report.processes >= 1
    _no_children_left()


def _faulted(faults: str, **overrides) -> SimReport:
    config = make(
        (StageLayout(4), StageLayout(2)),
        MHA,
        requests=24,
        faults=parse_faults(faults),
        **overrides,
    )
    return run_simulation(config)


def _requests_of(keys: set[str]) -> set[str]:
    return {parse_key(k).request_id for k in keys}


def _failed(report: SimReport) -> dict[str, str]:
    return {o.request_id: o.reasons[0] for o in report.outcomes if not o.ok}


def test_dropped_shards_fail_exactly_their_requests() -> None:
    report = _faulted("drop=0.1")
    dropped = report.faulted_keys("drop")
    assert dropped, "the fault was injected"
    assert set(_failed(report)) == _requests_of(dropped)
    assert all("never arrived intact" in why for why in _failed(report).values())
    assert report.verified + report.failed == 24


def test_duplicates_are_ignored() -> None:
    report = _faulted("dup=0.3,reorder=0.3,delay=1ms")
    assert_all_verified(report)
    assert report.receiver_stats["duplicates_ignored"] == len(report.faulted_keys("dup")) > 0


def test_corrupted_frames_are_refused_by_the_codec() -> None:
    report = _faulted("corrupt=0.15")
    corrupted = report.faulted_keys("corrupt")
    assert corrupted
    assert set(_failed(report)) == _requests_of(corrupted)
    refused = report.receiver_stats["codec_refusals"] + report.receiver_stats["garbage_refused"]
    assert refused == len(corrupted)  # the envelope or a wire frame: refused either way
    assert not any("differ from the oracle" in why for why in _failed(report).values())


def test_without_checksums_corruption_is_caught_by_the_oracle() -> None:
    report = _faulted("corrupt=0.15", checksum=False)
    failed = _failed(report)
    assert set(failed) <= _requests_of(report.faulted_keys("corrupt"))
    assert any("[ORACLE-5]" in why for why in failed.values())


def test_garbage_frames_are_refused_and_the_receivers_survive() -> None:
    report = _faulted("garbage=0.3")
    assert_all_verified(report)
    assert report.receiver_stats["garbage_refused"] == len(report.faulted_keys("garbage")) > 0


def test_a_killed_sender_is_detected_and_every_request_accounted() -> None:
    report = _faulted("kill=sender:1@0.5")
    assert any("stage 0 rank 1" in d and "SIGKILL" in d for d in report.dead)
    failed = _failed(report)
    assert failed and report.verified + report.failed == 24
    assert all("never arrived" in why for why in failed.values())
    assert any("source rank 1 died" in why for why in failed.values())
    _no_children_left()


def test_a_hung_rank_ends_at_the_deadline_with_its_stack() -> None:
    started = time.time()
    report = _faulted("hang=sender:2@0.3", timeout=4.0)
    assert time.time() - started < 30
    assert report.timed_out and not report.ok
    assert "_maybe_die" in report.stack_dumps  # where the hung sender sleeps
    assert any(
        "waiting for shard(s)" in why and "(from source rank 2)" in why
        for why in _failed(report).values()
    )
    _no_children_left()


def test_garbage_sent_to_a_live_sender_port_is_survived() -> None:
    """A stranger connects to a sender's KV port and sprays junk mid-run."""
    config = make(
        (StageLayout(2), StageLayout(2)), MHA, requests=30, faults=parse_faults("delay=5ms")
    )
    cluster = Cluster(config)
    result: list[SimReport] = []
    runner = threading.Thread(target=lambda: result.append(cluster.run()))
    runner.start()
    context = zmq.Context.instance()
    stranger = context.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(f"tcp://127.0.0.1:{port('kv', config.base_port, 0, 0)}")
    for junk in (b"", b"\x80\x04garbage", b'{"hello": 0}', b'{"key": 1}', os.urandom(100)):
        for _ in range(20):
            stranger.send_multipart([junk, junk])
        time.sleep(0.05)
    runner.join(60)
    stranger.close()
    assert_all_verified(result[0])


def test_ports_are_released_after_a_run() -> None:
    config = make((StageLayout(2), StageLayout(2)), MHA)
    assert_all_verified(run_simulation(config))
    for rank in range(2):
        with socket.socket() as probe:  # SO_REUSEADDR: only a live listener blocks the bind
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port("kv", config.base_port, 0, rank)))
            probe.listen()


def test_cli_runs_the_default_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = sim_main(
        [
            "run",
            "--source-tp",
            "4",
            "--target-tp",
            "2",
            "--kv-heads",
            "2",
            "--quiet",
            "--base-port",
            "auto",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "ALL VERIFIED" in text and "every edge equals the plan" in text
    data = json.loads(out.read_text())
    assert data["ok"] and data["requests"] == {"total": 8, "verified": 8, "failed": 0}
    assert all(e["bytes"] == e["planned_bytes"] for e in data["edges"])


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--source-tp", "3", "--target-tp", "2", "--kv-heads", "6"], "do not divide one another"),
        (["--source-tp", "2", "--target-tp", "2"], "--kv-heads is required"),
        (["--kv-heads", "2", "--faults", "drop=2"], "a probability must be in 0..1"),
        (["--kv-heads", "2", "--dst-layout", "mla"], "cannot hold an mha cache"),
        (["--chain", "TP8,TP8,TP8,TP8,TP8", "--kv-heads", "8"], "colliding pair"),
    ],
)
def test_cli_refuses_with_the_reason(argv, reason, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["run", *argv, "--quiet"]) == 2
    assert reason in capsys.readouterr().err


def test_ctrl_c_stops_every_rank() -> None:
    base = free_base(make((StageLayout(4), StageLayout(2)), MHA))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "--source-tp",
            "4",
            "--target-tp",
            "2",
            "--kv-heads",
            "4",
            "--requests",
            "500",
            "--faults",
            "delay=20ms",
            "--quiet",
            "--base-port",
            str(base),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted (Ctrl-C)" in out
    time.sleep(0.5)
    marker = f"--base-port\0{base}".encode()
    left = [
        p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).find(marker) >= 0
    ]
    assert not left, "no orphan rank process"


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


def test_runs_on_every_device(device: str) -> None:
    """--device cuda places each rank's cache on cuda:(rank % device_count) and stages
    sends through pinned host memory; on CPU the same run stays in host memory."""
    config = make(
        (StageLayout(2), StageLayout(4)),
        ModelShape(2, 4, 8, dtype="float8_e4m3fn"),
        device=device,
        chunks=2,
        slicing="receiver",
    )
    assert_all_verified(run_simulation(config))
