"""What the sim tests share: a small run, the verdict every clean run must reach, and
runs drawn over the whole planning domain."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvspec.memory.cache_layout import get_layout
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.books.accounting import BY_REQUEST
from sim.books.report import SimReport
from sim.harness.cluster import run_simulation
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from tests.strategies import cache_side, shortest_request

MHA = ModelShape(2, 4, 8)

FAULT_SPECS: dict[str, str] = {
    "drop": "drop=0.2",
    "dup": "dup=0.3",
    "reorder": "reorder=0.4",
    "corrupt": "corrupt=0.2",
    "garbage": "garbage=0.3",
    "kill": "kill=sender:1@0.5",
    "hang": "hang=receiver:0@0.3",
    "late": "late=0.3",
    "abort": "abort=0.3",
    "fail-nth": "fail-nth=sender:1@2",
    "restart": "restart=sender:1@0.5",
    "reuse": "reuse=0.3",
}
"""Each fault alone, at a rate that strikes a small run: the specs the sim tests inject."""


def faults_of(*kinds: str) -> dict[str, str]:
    """The specs of ``kinds``, in that order (for a test's parameters)."""
    return {kind: FAULT_SPECS[kind] for kind in kinds}


def small_run(stages: tuple[StageLayout, ...], model: ModelShape, **overrides: Any) -> SimConfig:
    """A small run; over TCP the OS assigns every port, so concurrent runs never collide."""
    settings_ = {"requests": 3, "seq_len": (3, 24), "timeout": 60.0, "ports": "os", **overrides}
    return SimConfig(stages=stages, model=model, **settings_)


def assert_booked_alike(report: SimReport, kind: str, seed: int) -> None:
    """Every fault counted where injected and where observed, and fault ``kind`` key by key
    (request by request for a fault booked by request) [sim.books.accounting]."""
    assert not report.unbalanced_faults(), (seed, report.fault_counts())
    injected = report.fault_keys["injected"].get(kind, [])
    observed = report.fault_keys["observed"].get(kind, [])
    if kind in BY_REQUEST:
        assert set(observed) == set(injected), seed
    else:
        assert sorted(observed) == sorted(injected), seed


def faulted_run(kind: str, seed: int, **overrides: Any) -> SimReport:
    """Four TP2 -> TP2 requests of 3..8 tokens in one process under fault ``kind`` alone
    (its :data:`FAULT_SPECS` rate) and ``seed``, its books checked key by key
    [sim.books.accounting]."""
    config = small_run(
        (StageLayout(2), StageLayout(2)),
        MHA,
        requests=4,
        seq_len=(3, 8),
        transport="inproc",
        faults=parse_faults(FAULT_SPECS[kind]),
        seed=seed,
        **overrides,
    )
    report = run_simulation(config)
    assert_booked_alike(report, kind, seed)
    return report


def assert_all_verified(report: SimReport) -> None:
    """Every request of every replica verified, and each edge moved the plan's bytes."""
    assert report.ok, report.render()
    assert (
        report.verified == len(report.outcomes) == report.config.requests * report.config.replicas
    )
    assert report.edge_bytes == report.planned_bytes, "bytes per edge equal the plan [PLAN-5]"


@st.composite
def domain_runs(
    draw: st.DrawFn,
    *,
    sizes: tuple[int, ...] = (1, 2, 3, 4, 6, 8),
    cross_layer: bool = False,
    **drawn: st.SearchStrategy[Any],
) -> SimConfig:
    """In-process runs over the whole domain: any TP pair (non-dividing included), PP,
    token shards on either side (PCP and DCP, every rule), attention-DP groups, any two
    presets with a block size each side's rule fits, chunks [PLAN-1, CP-1, CP-2, DP-1].
    ``drawn`` adds settings drawn per run (e.g. ``transfer=st.sampled_from(...)``)."""
    case = draw(
        transfer_cases(
            sizes=sizes,
            max_pp=2,
            max_layers=3,
            max_head_dim=4,
            non_dividing=True,
            dp_sizes=(1, 2),
            cp_sizes=(1, 2),
            dcp_sizes=(1, 2),
        )
    )
    attention = case.model.attention
    src_layout, src_bs = cache_side(draw, attention, case.source, cross_layer=cross_layer)
    dst_layout, dst_bs = cache_side(draw, attention, case.target, cross_layer=cross_layer)
    shortest = shortest_request(case)
    return small_run(
        (case.source, case.target),
        case.model,
        policy=case.policy,
        src_layout=get_layout(src_layout),
        src_block_size=src_bs,
        dst_layout=get_layout(dst_layout),
        dst_block_size=dst_bs,
        requests=2,
        seq_len=(shortest, shortest + 9),
        chunks=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 1000)),
        transport="inproc",
        **{name: draw(strategy) for name, strategy in drawn.items()},
    )
