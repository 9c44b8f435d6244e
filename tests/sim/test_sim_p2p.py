"""``--transport gloo|nccl``: the tensor frames over torch.distributed send/recv [sim.net.p2p].

The same runs go over ZMQ and over gloo and must verify alike: every request, every
element, every edge's bytes equal to the plan and to each other. Every port (the
senders', the process group's store, gloo's own) is assigned by the OS.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import run_simulation, validate
from sim.net.auth import KEY_ENV
from sim.net.endpoints import RankId, all_ranks
from sim.net.p2p import Carrier, Link, Received, plan_groups
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from tests.paths import ROOT

MODEL = ModelShape(num_layers=2, num_kv_heads=4, head_dim=16)


def make(source: int, target: int, **overrides) -> SimConfig:
    settings = {"requests": 3, "seq_len": (3, 40), "timeout": 60.0, "ports": "os", **overrides}
    return SimConfig(stages=(StageLayout(source), StageLayout(target)), model=MODEL, **settings)


def _edges(report: SimReport) -> dict:
    return {(e["src"], e["dst"]): e["bytes"] for e in report.to_dict()["edges"]}


@pytest.mark.parametrize(
    ("source", "target", "per_process"),
    [(4, 2, 1), (1, 2, 1), (4, 2, 2)],
    ids=["TP4-TP2", "TP1-TP2", "TP4-TP2-two-ranks-per-process"],
)
def test_the_same_runs_verify_over_zmq_and_over_gloo(
    source: int, target: int, per_process: int
) -> None:
    """Two ranks per process mixes edges inside one process (whole over ZMQ) with edges
    between processes (frames over gloo)."""
    config = make(source, target, ranks_per_process=per_process)
    zmq_run = run_simulation(config)
    gloo_run = run_simulation(replace(config, transport="gloo"))
    for report in (zmq_run, gloo_run):
        assert report.ok, report.render()
        assert report.verified == config.requests
        assert all(e["bytes"] == e["planned_bytes"] for e in report.to_dict()["edges"])
        assert report.receiver_stats.get("p2p_lost", 0) == 0
    assert _edges(gloo_run) == _edges(zmq_run)
    assert "tensor frames over torch.distributed (gloo)" in gloo_run.render()


def test_messages_larger_than_a_frame_limit_cross_gloo() -> None:
    """16 frames of 128 KiB: a message past the per-frame limit (1 MiB here) in total,
    as every real payload is; the manifest is bounded frame by frame."""
    model = ModelShape(num_layers=8, num_kv_heads=8, head_dim=128)
    config = replace(make(1, 1, transport="gloo", requests=2), model=model, seq_len=(64, 64))
    report = run_simulation(config)
    assert report.ok, report.render()
    assert report.bytes_moved == 2 * 64 * 8 * 8 * 128 * 2 * 2


def test_a_chain_over_gloo_forwards_what_it_verified() -> None:
    """TP4 -> TP2 -> TP1 in chunks: the middle stage receives and sends over gloo."""
    config = SimConfig(
        stages=(StageLayout(4), StageLayout(2), StageLayout(1)),
        model=MODEL,
        requests=3,
        seq_len=(6, 40),
        chunks=3,
        ports="os",
        timeout=60.0,
        transport="gloo",
    )
    report = run_simulation(config)
    assert report.ok, report.render()
    assert all(e["bytes"] == e["planned_bytes"] for e in report.to_dict()["edges"])


def test_faults_over_gloo_end_every_request_with_a_reason_and_balance_the_books() -> None:
    """Faults act above the seam: a corrupted frame crosses gloo corrupted and the codec
    refuses it; dropped, duplicated, reordered and late messages move frames and
    manifest together, so the streams never fall out of step."""
    config = make(
        4,
        2,
        requests=12,
        transport="gloo",
        faults=parse_faults("drop=0.05,dup=0.1,reorder=0.1,corrupt=0.1,garbage=0.05,late=0.05"),
    )
    report = run_simulation(config)
    assert not report.errors and not report.timed_out, report.render()
    assert report.verified + report.failed == 12
    assert report.failed >= 1, "the faults should fail some request"
    assert all(o.reasons for o in report.outcomes if not o.ok)
    assert sum(c["injected"] for c in report.fault_counts().values()) > 0
    assert report.unbalanced_faults() == {}, report.render()
    assert report.receiver_stats.get("p2p_lost", 0) == 0


def test_a_pull_over_gloo_verifies() -> None:
    """Pull answers are data messages too: their byte ranges cross gloo [DESC-1]."""
    report = run_simulation(make(2, 4, transfer="pull", transport="gloo", requests=2))
    assert report.ok, report.render()


# -- refusals ---------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_nccl_without_cuda_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"--transport nccl needs CUDA.*use --transport gloo"):
        validate(make(2, 2, transport="nccl"))
    done = subprocess.run(
        [sys.executable, "-m", "sim", "run", "--kv-heads", "4", "--transport", "nccl", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "refused: --transport nccl needs CUDA" in done.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_needs_a_gpu_per_process() -> None:
    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"{gpus + 1} rank process\(es\) but has {gpus} GPU"):
        validate(make(gpus + 1, 1, transport="nccl"), processes_here=gpus + 1)


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="NCCL needs a GPU per rank process: two GPUs",
)
def test_the_same_run_verifies_over_zmq_and_over_nccl() -> None:
    config = make(2, 2, ranks_per_process=2)  # two processes: one per GPU
    zmq_run = run_simulation(config)
    nccl_run = run_simulation(replace(config, transport="nccl"))
    for report in (zmq_run, nccl_run):
        assert report.ok, report.render()
    assert _edges(nccl_run) == _edges(zmq_run)


def test_an_unknown_transport_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="--transport must be one of tcp, inproc, gloo, nccl"):
        make(2, 2, transport="rdma")


# -- the seam, without a process group ----------------------------------------------------
def _carrier(config: SimConfig, who: RankId, per_process: int = 1) -> Carrier:
    groups = plan_groups([all_ranks(config)], per_process)
    plan = {"store": ["127.0.0.1", 1], "prefix": "t", "groups": groups, "world": 6, "rank": 0}
    return Carrier(Link(config, plan), who)


class _Frame:
    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


def test_plan_groups_number_processes_worker_by_worker() -> None:
    ranks = all_ranks(make(4, 2))
    groups = plan_groups([ranks[:3], ranks[3:]], 2)
    assert list(groups.values()) == [0, 0, 1, 2, 2, 3]
    assert list(groups) == [r.tag for r in ranks]


def test_the_seam_splits_only_multi_frame_messages_between_processes() -> None:
    config = make(4, 2, transport="gloo")
    sender, receiver = RankId(0, 0, 0), RankId(0, 1, 0)
    carrier = _carrier(config, sender)
    frames = [b"envelope", b"header", memoryview(bytearray(10)), b""]
    wire, bulk = carrier.split(receiver, frames)
    assert wire[:2] == frames[:2] and bulk == frames[2:]
    assert bytes(wire[2]) == b'{"p2p":[10,0]}'
    assert carrier.split(receiver, [b"notice"]) == ([b"notice"], [])
    carrier.broken[receiver.tag] = "RuntimeError: connection closed"
    assert carrier.split(receiver, frames) is None, "a failed pair loses the message whole"
    assert carrier.split(receiver, [b"notice"]) == ([b"notice"], [])
    together = _carrier(config, RankId(0, 0, 3), per_process=5)  # s0k3 and s1k0 share one
    assert together.split(RankId(0, 1, 0), frames) == (frames, [])
    assert together.join(RankId(0, 1, 0), frames) is frames


@pytest.mark.parametrize(
    "manifest",
    [b"not json", b'{"p2p": [-1]}', b'{"p2p": [1.5]}', b'{"p2p": "10"}', b'{"other": []}'],
)
def test_an_unreadable_manifest_is_refused_and_the_pair_not_used_again(manifest: bytes) -> None:
    config = make(4, 2, transport="gloo")
    carrier = _carrier(config, RankId(0, 1, 0))
    sender = RankId(0, 0, 0)
    assert carrier.join(sender, [_Frame(b"e"), _Frame(b"h"), _Frame(manifest)]) is None
    assert carrier.broken == {sender.tag: "an unreadable manifest"}
    assert carrier.join(sender, [_Frame(b"e"), _Frame(b"h"), _Frame(b'{"p2p":[]}')]) is None


def test_a_manifest_larger_than_any_message_of_the_run_is_refused() -> None:
    config = make(4, 2, transport="gloo")
    carrier = _carrier(config, RankId(0, 1, 0))
    too_big = f'{{"p2p": [{carrier.limit + 1}]}}'.encode()
    assert carrier._manifest(_Frame(too_big)) is None
    assert carrier._manifest(_Frame(b'{"p2p": [3, 0]}')) == [3, 0]


def test_received_frames_read_like_zmq_frames() -> None:
    assert bytes(Received(memoryview(b"abc")).buffer) == b"abc"


# -- sim.node's own help and its join deadline ---------------------------------------------
def test_sim_node_help_is_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sim.node", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m sim.node")
    assert "torchrun" in done.stdout and "--transport" in done.stdout


def test_the_board_join_follows_timeout() -> None:
    """A worker whose peers never join gives up after ``--timeout`` seconds, naming them
    (torchrun's environment given by hand; the store is ours, on an OS-assigned port)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    env = {
        **os.environ,
        "TORCHELASTIC_RUN_ID": f"t{os.getpid()}",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        KEY_ENV: secrets.token_hex(32),  # the run's key, as a launcher gives it
    }
    flags = ["--source-tp", "1", "--target-tp", "1", "--kv-heads", "4", "--ports", "os", "--quiet"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sim.node", *flags, "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert "workers never joined the board" in done.stderr and "worker/1" in done.stderr
    # the deadline it waited for is --timeout's (the default is 60 s); a lower bound holds
    # on any machine, an upper one would not on a busy one
    assert "within 3 s" in done.stderr, done.stderr
    assert took >= 3, f"gave up after {took:.1f} s, before --timeout 3"
