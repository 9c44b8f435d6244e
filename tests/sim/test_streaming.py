"""Layer-wise streaming [STREAM-1]: the spec's groups, keys and placement as properties,
and the simulated cluster streaming layer groups as they are computed."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.naming.keys import parse_key
from kvspec.tensors.kv import kv_equal, random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.transport.payload import merge_to_request_kv, payload_from_shipment
from kvspec.transport.streaming import (
    group_layers,
    layer_groups,
    layer_part,
    merge_layers,
    stream_key,
    stream_position,
)
from sim.cli import main as sim_main
from sim.harness.cluster import run_simulation
from sim.run.config import SimConfig


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_groups_cut_every_layer_once_in_order(args: tuple[int, int]) -> None:
    layers, groups = args
    got = layer_groups(layers, groups)
    assert len(got) == groups and all(len(g) for g in got)
    assert [i for g in got for i in g] == list(range(layers))
    sizes = [len(g) for g in got]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1


def test_more_groups_than_layers_is_refused_with_the_values() -> None:
    with pytest.raises(ValueError, match=r"cannot cut 4 layer\(s\) into 5 non-empty groups"):
        layer_groups(4, 5)


@given(
    st.integers(0, 50),
    st.integers(1, 64).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
)
def test_group_keys_are_distinct_and_invert(chunk: int, group_of: tuple[int, int]) -> None:
    group, groups = group_of
    key = parse_key(
        stream_key("req_1", 0, chunk, group, groups, 0, 0)
    )  # single-rank: still rank-aware
    assert key.kind == "rank_aware"
    assert stream_position(key.chunk_id, groups) == (chunk, group)


@given(
    transfer_cases(sizes=(1, 2, 4, 8), max_pp=2, max_layers=5, max_head_dim=2),
    st.integers(1, 5),
    st.integers(0, 2**16),
)
@settings(max_examples=40)
def test_groups_placed_in_any_order_equal_the_merged_shard(case, groups: int, seed: int) -> None:
    """Every receiver, every group: placed from its parts (reversed) = those layers of the
    shard merged from the whole payloads [STREAM-1.3]."""
    model = case.model
    seq_len = case.seq_len if case.sharded else 3
    plan = plan_transfer(
        case.source,
        case.target,
        model,
        policy=case.policy,
        seq_len=seq_len,
        source_dp=case.source_dp,
        target_dp=case.target_dp,
    )
    full = random_request_kv(model, seq_len, seed=seed)
    shards = shard(full, case.source, model, dp_rank=case.source_dp)
    for dst in case.target.ranks():
        whole = [
            (s.edge.src, payload_from_shipment(plan, s, "r"))
            for src in plan.sources_of(dst)
            for s in send(plan, src, shards[src])
            if s.edge.dst == dst
        ]
        if not whole:
            continue
        merged = merge_to_request_kv(plan, dst, whole)
        owner = plan.owner("target", dst)
        for group in layer_groups(model.num_layers, min(groups, model.num_layers)):
            mine = group_layers(owner.layers, group)
            if not len(mine):
                continue
            parts = [(s, q) for s, p in whole if (q := layer_part(p, group)) is not None]
            got = merge_layers(plan, dst, group, parts[::-1])
            start = mine.start - owner.layers.start
            assert kv_equal(got, merged.layer_slice(start, start + len(mine)))


def _config(stream: str, **overrides) -> SimConfig:
    settings_ = dict(
        stages=(StageLayout(4), StageLayout(2)),
        model=ModelShape(6, 4, 8),
        requests=4,
        seq_len=(8, 40),
        ports="os",
        timeout=60.0,
        stream=stream,
        layer_compute_ms=2.0,
    )
    return SimConfig(**{**settings_, **overrides})


@pytest.mark.parametrize("stream", ["layers", "chunks:4", "whole"])
def test_in_process_streamed_runs_verify_every_element(stream: str) -> None:
    report = run_simulation(_config(stream, transport="inproc", slicing="receiver"))
    assert report.ok, report.render()
    assert report.edge_bytes == report.planned_bytes
    ready = report.kv_ready(0)
    assert len(ready) == 4 and all(r > 0 for r in ready)


def test_streamed_pp_chain_verifies_every_element() -> None:
    """PP senders compute only their layers; a three-stage chain forwards groups again."""
    config = _config(
        "layers",
        stages=(StageLayout(2, 2), StageLayout(4), StageLayout(1)),
        model=ModelShape(5, 4, 8),
        transport="inproc",
    )
    report = run_simulation(config)
    assert report.ok, report.render()
    assert report.edge_bytes == report.planned_bytes
    assert len(report.kv_ready(0)) == len(report.kv_ready(1)) == 4


def test_multi_process_streaming_beats_whole_request(capsys) -> None:
    """The CLI runs the whole-request twin first and reports both, per TP pair. With 6
    layers of 20 ms each, a whole request is ready >= 120 ms after its compute starts;
    streamed, its last layer goes out at 120 ms and only that layer is still to move."""
    argv = shlex.split(
        "run --source-tp 4 --target-tp 2 --kv-heads 4 --layers 6 --requests 3"
        " --seq-len 8:16 --ports os --quiet --stream layers --layer-compute-ms"
        " 20"
    )
    assert sim_main(argv) == 0
    out = capsys.readouterr().out
    assert "ALL VERIFIED" in out
    line = next(x for x in out.splitlines() if "stage 0->1 TP4->TP2: p50" in x)
    assert "whole-request" in line and "sooner" in line


def test_bad_stream_lines_are_refused_with_the_values(capsys) -> None:
    for argv, text in (
        (["--stream", "chunks:9"], "--stream chunks:9: N must be in 1..4"),
        (["--stream", "rows"], "--stream must be off, whole, layers or chunks:N, got 'rows'"),
        (["--stream", "layers", "--chunks", "2"], "--stream layers with --chunks 2"),
        (["--stream", "layers", "--layer-compute-ms", "-1"], "--layer-compute-ms: must be in"),
    ):
        try:
            code = sim_main(
                ["run", "--layers", "4", "--kv-heads", "4", "--ports", "os", "--quiet", *argv]
            )
        except SystemExit as refused:  # argparse refuses a value of the wrong kind itself
            code = refused.code
        assert code == 2
        assert text in capsys.readouterr().err
