"""Ranks on GPUs [sim.rank.loop, sim.cache.staging]: placed by global rank over the visible devices;
on a GPU, payloads go out and come in through the pinned staging ring (CUDA runs skip
without a device)."""

from __future__ import annotations

import pytest
import torch

from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.harness.cluster import run_simulation
from sim.net.endpoints import RankId, all_ranks
from sim.rank.loop import device_for, global_rank
from sim.run.config import SimConfig


def _config(**overrides) -> SimConfig:
    return SimConfig(
        stages=(StageLayout(8), StageLayout(2)),
        model=ModelShape(2, 8, 16),
        device="cuda",
        replicas=2,
        ports="os",
        **overrides,
    )


def test_ranks_are_placed_by_global_rank_over_the_visible_devices() -> None:
    """TP8 -> TP2 on 10 GPUs: every rank of a replica on its own device; the second
    replica wraps around. By stage-local rank, both stages' rank 0 would share cuda:0."""
    config = _config()
    ranks = all_ranks(config)
    assert [global_rank(config, who) for who in ranks] == list(range(20))
    first = [device_for(config, who, devices=10).index for who in ranks[:10]]
    assert first == list(range(10)), "one device per rank"
    assert device_for(config, RankId(1, 0, 0), devices=10).index == 0  # wraps
    assert device_for(config, RankId(0, 1, 1), devices=4).index == 9 % 4
    cpu = SimConfig(stages=config.stages, model=config.model)
    assert device_for(cpu, RankId(0, 1, 1)).type == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path needs one")
@pytest.mark.parametrize("transfer", ["push", "pull"])
def test_cuda_runs_verify_through_the_staging_ring(transfer: str) -> None:
    """On a GPU every rank sets its device, stages through pinned slots on a side stream,
    and every element verifies, with chunks and fp8 scales."""
    config = SimConfig(
        stages=(StageLayout(4), StageLayout(2)),
        model=ModelShape(2, 4, 16, dtype="float8_e4m3fn"),
        device="cuda",
        ports="os",
        chunks=2,
        seq_len=(8, 40),
        transfer=transfer,
    )
    report = run_simulation(config)
    assert report.ok, report.render()
