"""``--transfer write``: senders write each edge's byte runs straight from their cache into
the receivers' caches [sim.paths.write, sim.paths.byteruns, DESC-1..3] — every element verified over
the domain, long runs sent as views of cache memory, short runs packed once, faults
booked, and the framing's own rules."""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS, get_layout
from kvspec.memory.descriptors import (
    RegisteredCache,
    execute_descriptors,
    plan_descriptors,
    plan_runs,
)
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import run_simulation
from sim.paths import byteruns
from sim.run.config import SimConfig
from tests.sim import runs
from tests.sim.runs import MHA, domain_runs, small_run


def make(stages, model, **overrides) -> SimConfig:
    """A small write run."""
    return small_run(stages, model, **{"transfer": "write", **overrides})


def assert_all_verified(report: SimReport) -> None:
    """Every request verified, the plan's bytes per edge, and the receivers' descriptors
    cover exactly the bytes the writes moved."""
    runs.assert_all_verified(report)
    assert report.receiver_stats["descriptor_bytes"] == report.bytes_moved


def write_configs() -> st.SearchStrategy[SimConfig]:
    """Write runs over the domain: any TP pair, PP, token shards, attention-DP groups,
    any two presets the sim moves, block sizes, chunks [PLAN-1, CP-1, DP-1, DESC-1]."""
    return domain_runs(
        sizes=(1, 2, 3, 4, 8), cross_layer=True, transfer=st.just("write"), checksum=st.booleans()
    )


@given(write_configs())
@settings(max_examples=20, deadline=None)
def test_in_process_writes_verify_every_element(config: SimConfig) -> None:
    """Any two presets, cross-layer tensors and token pools included: the bytes the
    receivers' caches hold after the writes are the oracle's, and each edge moved the
    plan's bytes."""
    assert_all_verified(run_simulation(config))


@pytest.mark.parametrize(
    "stages, layouts, seq_len",
    [
        ((StageLayout(8), StageLayout(2)), ("flash_attn", "flash_attn"), (40, 64)),
        ((StageLayout(1), StageLayout(1)), ("flash_attn", "kv_tuple"), (512, 512)),
        ((StageLayout(4), StageLayout(2)), ("vllm_packed_hnd", "sglang_mha"), (30, 50)),
    ],
)
def test_multi_process_writes(stages, layouts, seq_len) -> None:
    """Between processes over TCP: short runs (one head per token) packed, long runs
    (whole blocks of every head) as views; both verified."""
    report = run_simulation(
        make(
            stages,
            ModelShape(2, 8, 64),
            src_layout=get_layout(layouts[0]),
            dst_layout=get_layout(layouts[1]),
            seq_len=seq_len,
        )
    )
    assert_all_verified(report)


FAULTS = runs.faults_of("drop", "dup", "reorder", "corrupt", "garbage")


@pytest.mark.parametrize("kind", list(FAULTS))
def test_write_books_balance(kind: str) -> None:
    """Each fault strikes writes as it strikes payloads: the books balance key by key, a
    dropped or corrupted write fails exactly its request, the rest are verified."""
    for seed in range(4):
        report = runs.faulted_run(
            kind, seed, transfer="write", dst_layout=PRESETS["flashinfer"], dst_block_size=3
        )
        injected = report.fault_keys["injected"].get(kind, [])
        failed = {o.request_id for o in report.outcomes if not o.ok}
        if kind in ("dup", "reorder", "garbage"):
            assert not failed, seed
        if kind in ("drop", "corrupt"):
            assert len(failed) <= len(injected) and (failed or not injected), seed


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"slicing": "receiver"}, r"--transfer write with --slicing receiver"),
        ({"device": "cuda"}, r"--transfer write with --device cuda"),
        ({"transport": "gloo"}, r"--transfer write with --transport gloo"),
        ({"stream": "layers"}, r"--stream layers with --transfer write"),
        ({"unsafe_reuse": True}, r"--transfer write with --unsafe-reuse"),
    ],
)
def test_write_refuses_what_it_cannot_do(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        make((StageLayout(2), StageLayout(2)), MHA, **overrides)


# -- the framing [sim.paths.byteruns] -------------------------------------------------------------


def _caches(
    source_tp: int, target_tp: int, model: ModelShape, layout: str, seq_len: int, *, shuffled=False
):
    """A plan's first edge, both registrations, block ids (the receiver's reversed when
    ``shuffled``) and random region bytes for the sender, zeros for the receiver."""
    plan = plan_transfer(StageLayout(source_tp), StageLayout(target_tp), model)
    edge = plan.edges[0]
    blocks = -(-seq_len // 16)
    src_heads = len(plan.owner("source", edge.src).heads)
    dst_heads = len(plan.owner("target", edge.dst).heads)
    src = RegisteredCache(
        get_layout(layout), model.num_layers, blocks, 16, src_heads, 64, "bfloat16"
    )
    dst = RegisteredCache(
        get_layout(layout), model.num_layers, blocks, 16, dst_heads, 64, "bfloat16"
    )
    src_ids = list(range(blocks))
    dst_ids = src_ids[::-1] if shuffled else src_ids
    gen = torch.Generator().manual_seed(0)
    sources = {
        n: torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
        for n, size in src.regions().items()
    }
    targets = {n: torch.zeros(size, dtype=torch.uint8) for n, size in dst.regions().items()}
    args = (plan, edge, src, src_ids, dst, dst_ids, range(seq_len))
    return args, sources, targets


@pytest.mark.parametrize(
    "source_tp, target_tp, shuffled, packed",
    [(1, 1, False, False), (1, 1, True, True), (8, 2, False, True), (2, 1, True, True)],
)
def test_framing_lands_the_descriptor_lists_effect(source_tp, target_tp, shuffled, packed) -> None:
    """Views (a layer's K or V of every block in one run) or packed (a head per token, or
    one 16 KiB block per run): landing the frames writes exactly what executing the spec's
    descriptor list writes, and nothing else."""
    model = ModelShape(2, 8, 64)
    args, sources, targets = _caches(
        source_tp, target_tp, model, "flash_attn", 200, shuffled=shuffled
    )
    made = byteruns.framing(plan_runs(*args))
    assert made.packed is packed
    frames = byteruns.frames_from(made, list(sources.values()))
    assert [memoryview(f).nbytes for f in frames] == made.frame_lengths
    assert sum(made.frame_lengths) == made.nbytes == plan_descriptors(*args).share_bytes
    byteruns.land(made, frames, list(targets.values()))
    expected = {n: torch.zeros_like(t) for n, t in targets.items()}
    execute_descriptors(plan_descriptors(*args).descriptors, sources, expected)
    for name in targets:
        assert torch.equal(targets[name], expected[name]), name


def test_views_are_cache_memory_and_packed_frames_are_one_gather() -> None:
    """A view frame points into the sender's region: nothing was copied to send it. A
    packed message has one frame per (target region, source region) pair."""
    model = ModelShape(2, 8, 64)
    args, sources, _ = _caches(1, 1, model, "flash_attn", 128)
    made = byteruns.framing(plan_runs(*args))
    regions = list(sources.values())
    for frame in byteruns.frames_from(made, regions):
        address = ctypes.addressof(ctypes.c_char.from_buffer(frame))
        assert any(r.data_ptr() <= address < r.data_ptr() + r.numel() for r in regions), (
            "a view frame is a copy"
        )
    args, sources, _ = _caches(8, 2, model, "flash_attn", 128)
    made = byteruns.framing(plan_runs(*args))
    assert made.packed and len(made.groups) == model.num_layers  # one region per layer


def test_land_refuses_a_frame_of_the_wrong_length_before_writing() -> None:
    model = ModelShape(2, 8, 64)
    args, sources, targets = _caches(8, 2, model, "flash_attn", 64)
    made = byteruns.framing(plan_runs(*args))
    frames = [bytes(f) for f in byteruns.frames_from(made, list(sources.values()))]
    frames[-1] = frames[-1][:-1]
    with pytest.raises(ValueError, match=r"frame 1 has \d+ bytes, expected \d+"):
        byteruns.land(made, frames, list(targets.values()))
    assert all(int(t.count_nonzero()) == 0 for t in targets.values()), "nothing was written"
    with pytest.raises(ValueError, match=r"has 1 range frames, expected 2"):
        byteruns.land(made, frames[:1], list(targets.values()))
