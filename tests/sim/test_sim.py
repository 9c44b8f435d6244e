"""The simulated cluster: real ranks, real sockets, every element verified, every fault accounted.

Many small configurations run in-process (threads over inproc://) through the same
rank code; a smaller set runs as separate OS processes over TCP on loopback.
"""

from __future__ import annotations

import json
import os
import random
import shlex
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

from kvspec.memory.cache_layout import PRESETS
from kvspec.naming.keys import parse_key
from kvspec.naming.ports import port
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.cli import main as sim_main
from sim.harness.cluster import Cluster, run_simulation
from sim.net.endpoints import all_ranks, find_free_base
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from tests.paths import ROOT
from tests.sim.runs import (
    FAULT_SPECS,
    MHA,
    assert_all_verified,
    domain_runs,
    faulted_run,
    small_run,
)


def run_on_spec_ports(config: SimConfig, attempts: int = 5) -> SimReport:
    """Run ``config`` on the spec's ports from a free base; another program may take a
    port between the probe and the bind, so a refused bind is retried on another base."""
    for _ in range(attempts):
        start = 21000 + random.randrange(0, 40) * 256
        spec = replace(config, ports="spec", base_port=find_free_base(config, start=start))
        report = run_simulation(spec)
        if not (report.setup_error and "cannot bind" in report.setup_error):
            return report
    raise AssertionError(f"no free base port in {attempts} attempts: {report.setup_error}")


def _no_children_left() -> None:
    deadline = time.time() + 60  # returns as soon as they are gone; generous for busy hosts
    while multiprocess.active_children() and time.time() < deadline:
        time.sleep(0.05)
    assert not multiprocess.active_children()


def sim_configs() -> st.SearchStrategy[SimConfig]:
    """Runs over the whole domain, replicas and both slicing modes too."""
    return domain_runs(replicas=st.integers(1, 2), slicing=st.sampled_from(["sender", "receiver"]))


@given(sim_configs())
@settings(max_examples=60)
def test_in_process_runs_verify_every_element(config: SimConfig) -> None:
    """Many configurations through the same rank code: all verified, bytes equal the plan."""
    assert_all_verified(run_simulation(config))


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
        src_layout=PRESETS["mla"],
        dst_layout=PRESETS["token_major"],
        dst_block_size=1,
    ),
    "PP on both sides, uneven": dict(
        stages=(StageLayout(2, 2), StageLayout(2, 3)), model=ModelShape(5, 4, 8)
    ),
    "layouts and block sizes, fp8": dict(
        stages=(StageLayout(2), StageLayout(4)),
        model=ModelShape(2, 4, 8, dtype="float8_e5m2"),
        src_layout=PRESETS["flashinfer_hnd"],
        src_block_size=16,
        dst_layout=PRESETS["kv_tuple"],
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
    # The second release's layouts [PLAN-1, PLAN-6, CP-1..3, DP-1]:
    "TP4 CP2 interleave:4 -> TP6, 12 heads by range": dict(
        stages=(StageLayout(4, cp=2, cp_rule="interleave:4"), StageLayout(6)),
        model=ModelShape(2, 12, 8),
        chunks=2,
    ),
    "DCP on the source, MLA TP8 DCP8 -> TP2": dict(
        stages=(StageLayout(8, dcp=8, cp_rule="interleave:1"), StageLayout(2)),
        model=ModelShape.mla(2, 16),
        src_layout=PRESETS["mla"],
        dst_layout=PRESETS["mla"],
        ranks_per_process=4,
    ),
    "DCP on the target, TP2 -> TP8 DCP2, receiver-side": dict(
        stages=(StageLayout(2), StageLayout(8, dcp=2, cp_rule="round_robin_blocks:4")),
        model=MHA,
        dst_block_size=4,
        slicing="receiver",
        ranks_per_process=3,
    ),
    "PCP zigzag -> DCP interleave": dict(
        stages=(
            StageLayout(4, cp=2, cp_rule="zigzag"),
            StageLayout(8, dcp=2, cp_rule="interleave:2"),
        ),
        model=MHA,
        seq_len=(8, 24),
        ranks_per_process=3,
    ),
    "DP2 attention groups on both sides": dict(
        stages=(StageLayout(4, dp=2), StageLayout(8, dp=2)),
        model=ModelShape(2, 2, 8),
        requests=6,
        ranks_per_process=3,
    ),
    "PP on both sides, uneven, with CP": dict(
        stages=(StageLayout(2, 2, (1, 4)), StageLayout(4, 3, cp=2, cp_rule="contiguous")),
        model=ModelShape(5, 4, 8),
        chunks=2,
        ranks_per_process=3,
    ),
}


@pytest.mark.parametrize("name", list(PROCESS_RUNS))
def test_multi_process_runs(name: str) -> None:
    report = run_simulation(small_run(**PROCESS_RUNS[name]))
    assert_all_verified(report)
    assert report.processes >= 1
    # start-up (bind, connect, handshake) is part of the run, before any KV moves
    assert 0 < report.startup_s < report.wall_s
    assert report.to_dict()["startup_seconds"] == report.startup_s
    _no_children_left()


def _faulted(faults: str, **overrides) -> SimReport:
    config = small_run(
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


def assert_books_balance(report: SimReport, *kinds: str) -> None:
    """Every fault of ``kinds`` was injected at least once and observed exactly as often,
    message by message (the same keys on both sides)."""
    assert report.books_closed == len(all_ranks(report.config)) - len(report.dead)
    assert not report.unbalanced_faults(), report.fault_counts()
    for kind in kinds:
        injected = sorted(report.fault_keys["injected"].get(kind, []))
        assert injected, f"no {kind} fault was injected"
        assert sorted(report.fault_keys["observed"].get(kind, [])) == injected


def test_dropped_shards_fail_exactly_their_requests() -> None:
    report = _faulted("drop=0.1")
    assert_books_balance(report, "drop")
    assert set(_failed(report)) == _requests_of(report.faulted_keys("drop"))
    assert all("never arrived intact" in why for why in _failed(report).values())
    assert report.verified + report.failed == 24


def test_duplicates_and_reorders_are_seen_and_harmless() -> None:
    report = _faulted("dup=0.3,reorder=0.3,delay=1ms")
    assert_all_verified(report)
    assert_books_balance(report, "dup", "reorder")


def test_corrupted_frames_are_refused_by_the_codec() -> None:
    report = _faulted("corrupt=0.15")
    assert_books_balance(report, "corrupt")
    assert set(_failed(report)) == _requests_of(report.faulted_keys("corrupt"))
    assert all("refused by the codec" in why for why in _failed(report).values())


def test_without_checksums_corruption_is_caught_by_the_oracle() -> None:
    report = _faulted("corrupt=0.15", checksum=False)
    failed = _failed(report)
    assert set(failed) <= _requests_of(report.faulted_keys("corrupt"))
    assert any("[ORACLE-5]" in why for why in failed.values())


def test_garbage_frames_are_refused_and_the_receivers_survive() -> None:
    report = _faulted("garbage=0.3")
    assert_all_verified(report)
    assert_books_balance(report, "garbage")


def test_a_killed_sender_is_detected_and_every_request_accounted() -> None:
    report = _faulted("kill=sender:1@0.5")
    assert any("stage 0 rank 1" in d and "SIGKILL" in d for d in report.dead)
    assert report.fault_counts()["kill"] == {"injected": 1, "observed": 1}
    failed = _failed(report)
    assert failed and report.verified + report.failed == 24
    assert all("never arrived" in why for why in failed.values())
    assert any("source rank 1 died" in why for why in failed.values())
    _no_children_left()


def test_a_hung_rank_ends_at_the_deadline_with_its_stack() -> None:
    report = _faulted("hang=sender:2@0.3", timeout=4.0)  # a run that never ended hangs here
    assert report.timed_out and not report.ok  # ended by its deadline, not by the work
    assert report.fault_counts()["hang"] == {"injected": 1, "observed": 1}
    assert "_maybe_die" in report.stack_dumps  # where the hung sender sleeps
    assert any(
        "waiting for shard(s)" in why and "(from source rank 2)" in why
        for why in _failed(report).values()
    )
    _no_children_left()


@pytest.mark.parametrize("kind", list(FAULT_SPECS))
def test_the_books_balance_for_fifty_seeds(kind: str) -> None:
    """Each fault, alone, over 50 seeds: injected == observed, key by key [sim.books.accounting]."""
    hang = kind == "hang"
    for seed in range(50):
        report = faulted_run(kind, seed, timeout=0.3 if hang else 30.0)
        counts = report.fault_counts().get(kind, {"injected": 0})
        if kind in ("kill", "hang", "fail-nth", "restart"):
            assert counts["injected"] == 1, (seed, counts)
        assert not report.violations and not report.corrupted, seed  # the rules held
        assert report.verified + report.failed == 4


def test_strangers_neither_read_the_kv_nor_stop_the_run() -> None:
    """A local stranger grabs receiver identities before the run, sprays the control
    port with garbage and forged events, sends a forged hello and an oversized message to
    a sender: every request still verifies, nothing reaches the stranger, and the report
    counts the strangers [sim.net.auth]."""
    config = small_run(
        (StageLayout(2), StageLayout(2)), MHA, requests=30, faults=parse_faults("delay=5ms")
    )
    config = replace(config, ports="spec", base_port=find_free_base(config, start=30000))
    context = zmq.Context.instance()
    grabbers = []
    for rank in range(2):  # connect early, with the identities of the real receivers
        grab = context.socket(zmq.DEALER)
        grab.setsockopt(zmq.LINGER, 0)
        grab.setsockopt(zmq.IDENTITY, str(rank).encode())
        grab.connect(f"tcp://127.0.0.1:{port('kv', config.base_port, 0, rank)}")
        grab.send(json.dumps({"hello": rank, "nonce": "00", "mac": "forged"}).encode())
        grabbers.append(grab)
    cluster = Cluster(config)
    result: list[SimReport] = []
    runner = threading.Thread(target=lambda: result.append(cluster.run()))
    runner.start()
    deadline = time.time() + 30
    while cluster.control_endpoint is None and time.time() < deadline:
        time.sleep(0.01)
    control = context.socket(zmq.DEALER)
    control.setsockopt(zmq.LINGER, 0)
    control.connect(cluster.control_endpoint)
    forged = [
        b"\x80\x04not json",
        b'{"ev": "hi", "rank": "r0s0k0", "mac": "0000"}',
        b'{"ev": "result", "request": "req-0-0000", "ok": false, "reason": "forged"}',
        b'{"ev": "error", "traceback": "forged"}',
    ]
    for frame in forged:
        control.send(frame)
    big = context.socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(f"tcp://127.0.0.1:{port('kv', config.base_port, 0, 0)}")
    big.send(b"x" * (64 << 20))
    runner.join(120)
    stolen = sum(g.poll(0) for g in grabbers)
    for sock in (*grabbers, control, big):
        sock.close()
    report = result[0]
    assert report.setup_error is None or "cannot bind" not in report.setup_error
    assert_all_verified(report)
    assert stolen == 0, "a stranger received something"
    assert report.strangers.get("control messages", 0) == len(forged)
    assert report.strangers.get("kv hellos refused", 0) >= 1
    assert report.strangers.get("kv connections", 0) >= 3  # two grabbers and the big one
    assert "strangers:" in report.render()


def test_garbage_sent_to_a_live_sender_port_is_survived() -> None:
    """A stranger connects to a sender's KV port and sprays junk mid-run."""
    config = small_run(
        (StageLayout(2), StageLayout(2)), MHA, requests=30, faults=parse_faults("delay=5ms")
    )
    cluster = Cluster(config)
    result: list[SimReport] = []
    runner = threading.Thread(target=lambda: result.append(cluster.run()))
    runner.start()
    deadline = time.time() + 30
    while not cluster.endpoints.get("r0s0k0") and time.time() < deadline:
        time.sleep(0.01)
    context = zmq.Context.instance()
    stranger = context.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(cluster.endpoints["r0s0k0"])
    for junk in (b"", b"\x80\x04garbage", b'{"hello": 0}', b'{"key": 1}', os.urandom(100)):
        for _ in range(20):
            stranger.send_multipart([junk, junk])
        time.sleep(0.05)
    runner.join(60)
    stranger.close()
    assert_all_verified(result[0])
    assert result[0].strangers.get("kv messages", 0) > 0


def test_the_spec_ports_are_used_and_released_after_a_run() -> None:
    config = small_run((StageLayout(2), StageLayout(2)), MHA)
    report = run_on_spec_ports(config)
    assert_all_verified(report)
    for rank in range(2):
        with socket.socket() as probe:  # SO_REUSEADDR: only a live listener blocks the bind
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port("kv", report.config.base_port, 0, rank)))
            probe.listen()


def test_a_port_taken_by_another_program_is_named_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = small_run((StageLayout(2), StageLayout(2)), MHA)
    base = find_free_base(replace(config, ports="spec"), start=25000)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port("kv", base, 0, 1)))
        holder.listen()
        argv = (
            f"run --source-tp 2 --target-tp 2 --kv-heads 4 --base-port {base} --quiet --requests 2"
        )
        code = sim_main(shlex.split(argv))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "stage 0 rank 1 failed during start-up" in out
    assert "cannot bind its KV endpoint" in out and "--ports os" in out


def test_cli_runs_the_default_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = sim_main(
        [
            *shlex.split("run --source-tp 4 --target-tp 2 --kv-heads 2 --quiet --ports os --json"),
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "ALL VERIFIED" in text and "every edge equals the plan" in text
    data = json.loads(out.read_text())
    assert data["ok"] and data["requests"] == {"total": 8, "verified": 8, "failed": 0}
    assert all(e["bytes"] == e["planned_bytes"] for e in data["edges"])


def test_cli_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--kv-heads", "2", "--quiet", "--ports", "os", "--requests", "2"]
    assert sim_main([*argv, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["books_closed"] == 6


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (
            ["--source-tp", "4", "--target-tp", "6", "--kv-heads", "8"],
            "target TP6: 8 KV heads cannot be split over TP 6",
        ),
        (
            ["--source-tp=4", "--source-cp=2", "--cp-rule=interleave:24", "--kv-heads=8"],
            "needs a cache block size that is a multiple of 24",
        ),
        (
            ["--target-tp=4", "--target-cp=2", "--cp-rule=zigzag", "--kv-heads=4", "--seq-len=3"],
            "at least 4 tokens",
        ),
        (["--source-tp", "2", "--target-tp", "2"], "--kv-heads is required"),
        (["--kv-heads", "2", "--faults", "drop=2"], "a probability must be in 0..1"),
        (["--kv-heads", "2", "--dst-layout", "mla"], "cannot hold an mha cache"),
        (["--chain", "TP8,TP8,TP8,TP8,TP8", "--kv-heads", "8"], "colliding pair"),
    ],
)
def test_cli_refuses_with_the_reason(argv, reason, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["run", *argv, "--quiet"]) == 2
    assert reason in capsys.readouterr().err


def _as_a_terminal_starts_it() -> None:
    """Give the run SIGINT's default action, as a terminal's foreground job has.

    A shell without job control starts a background job (``make stress &``, ``nohup``) with
    SIGINT ignored, and an ignored signal stays ignored across exec; a run started that way
    rightly ignores Ctrl-C, which is not what these tests are about.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sim(*argv: str) -> subprocess.Popen[str]:
    python = [sys.executable, "-X", "faulthandler"]  # a hung run dumps its stacks on SIGABRT
    return subprocess.Popen(
        [*python, "-m", "sim", "run", "--quiet", "--ports", "os", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # our SIGINT reaches only the run, as a terminal's would
        preexec_fn=_as_a_terminal_starts_it,  # one signal call between fork and exec
    )


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("phase", "argv", "wait_for"),
    [
        # long requests on many layers: the ranks are still filling their caches
        ("cache fill", ["--requests", "400", "--layers", "8", "--seq-len", "256"], 2.0),
        ("transfer", ["--requests", "500", "--faults", "delay=20ms"], 5.0),
    ],
)
def test_ctrl_c_stops_every_rank_mid_work(phase: str, argv, wait_for: float) -> None:
    """Ctrl-C ends the run where it is: exit 130, a partial report that says so, and no
    rank left. How fast it stops is not asserted: a busy machine stretches any wall-clock
    bound, and a run that ignored Ctrl-C shows as one that ended its work."""
    requests = int(argv[argv.index("--requests") + 1])
    proc = _sim("--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--json", "-", *argv)
    deadline = time.time() + 60
    while len(_children_of(proc.pid)) < 6 and time.time() < deadline:
        time.sleep(0.05)  # every rank process has started
    time.sleep(wait_for)
    ranks = _children_of(proc.pid)
    assert ranks and proc.poll() is None, f"the run ended before Ctrl-C in the {phase} phase"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)  # show where it hangs, then fail
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{phase}: the run ignored Ctrl-C for 30 s; its stacks:\n{err[-6000:]}")
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err, err[-3000:]
    report = json.loads(out)
    verified, reasons = report["requests"]["verified"], report["failures"]
    assert report["interrupted"] and verified < requests, f"{phase}: {verified} verified"
    assert len(reasons) == requests - verified  # every other request says why it ended
    assert all("interrupted (Ctrl-C)" in " ".join(f["reasons"]) for f in reasons)
    assert not [p for p in ranks if Path(f"/proc/{p}").exists()], "no orphan rank process"


def test_ctrl_c_while_starting_exits_130_without_a_traceback() -> None:
    """Ctrl-C while torch is still loading (its library mapped, its import not done)
    ends the command as Ctrl-C mid-run does: exit 130 and one line, no traceback. Should
    the import win the race, the signal lands in the run, with the same outcome."""
    proc = _sim("--kv-heads", "2", "--requests", "2")
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline:
        try:
            if "libtorch" in maps.read_text():
                break
        except OSError:
            pass
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err, err[-3000:]


def test_a_port_another_program_holds_is_a_refusal_with_the_way_out() -> None:
    """A bind the host refuses is the user's to fix: exit 2, one line on stderr naming the
    port and --base-port auto, and no traceback anywhere (issue 30.7)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    base = probe.getsockname()[1]
    probe.close()
    held = []
    try:
        for port in range(base, min(base + 400, 65536)):  # every port the run could use
            holder = socket.socket()
            try:
                holder.bind(("127.0.0.1", port))
                holder.listen()
                held.append(holder)
            except OSError:
                holder.close()  # someone else's: the run cannot have it either
        argv = ["run", "--quiet", "--kv-heads", "4", "--requests", "1", "--base-port", str(base)]
        done = subprocess.run(
            [sys.executable, "-m", "sim", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for holder in held:
            holder.close()
    first = done.stderr.splitlines()[0] if done.stderr else ""
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert first.startswith("python -m sim run: refused: the run could not start"), first
    assert "Address already in use" in first and "--base-port auto" in first, first
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-3000:]


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "--kv-heads",
            "2",
            "--quiet",
            "--ports",
            "os",
            "--requests",
            "2",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert list(tmp_path.iterdir()) == []


def test_runs_on_every_device(device: str) -> None:
    """--device cuda places each rank's cache on cuda:(rank % device_count) and stages
    sends through pinned host memory; on CPU the same run stays in host memory."""
    config = small_run(
        (StageLayout(2), StageLayout(4)),
        ModelShape(2, 4, 8, dtype="float8_e4m3fn"),
        device=device,
        chunks=2,
        slicing="receiver",
    )
    assert_all_verified(run_simulation(config))


@pytest.mark.parametrize(
    "spec",
    [
        "delay=1000ms",
        "delay=0.001s",
        "delay=10s",
        "delay=7us",
        "drop=0.1,delay=1e-3s",
        "kill=sender:1@0.5+receiver:0@0.25,hang=stage1:2@1",
    ],
)
def test_a_fault_spec_round_trips_through_its_description(spec: str) -> None:
    """Ranks get the spec as its description: it must parse back to the same faults."""
    parsed = parse_faults(spec)
    assert parse_faults(parsed.describe()) == parsed
