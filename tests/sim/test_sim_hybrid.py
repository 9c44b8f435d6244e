"""The simulated cluster on hybrid models, in the one runtime: every layer group moved by
kvspec's group plan, every element and state verified by coordinate, the bytes of every
(source, receiver) pair equal to the plan's, under the run's faults, pulled and streamed
by layer groups like any other model [GROUP-3, STATE-2, WINDOW-1, STREAM-1]."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import torch
import zmq

from kvspec.naming.keys import parse_key
from kvspec.tensors import group_reshard as gr
from kvspec.topology.group_plan import plan_groups
from kvspec.topology.groups import (
    ChunkedLocal,
    DraftAttention,
    GdnState,
    Mamba2State,
    NoCache,
    SlidingWindow,
)
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.windows import chunk_tokens, window_tokens
from sim.books.report import SimReport
from sim.cli import main
from sim.harness.cluster import Cluster, run_simulation
from sim.net.messages import MessageError
from sim.paths.pieces import in_layers, pieces_frames, read_piece, read_pieces
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from tests.sim.runs import assert_all_verified, assert_booked_alike
from tests.spec.test_block_size import WINDOWED  # vLLM block size 144 at TP1, 80 at TP4

EVERY_KIND = ModelShape(
    6,
    2,
    4,
    groups=(
        SlidingWindow(4, 4, window=24),
        Mamba2State(
            num_heads=4, head_dim=2, n_groups=1, d_state=3, conv_kernel=3, ssm_dtype="float32"
        ),
        GdnState(num_k_heads=2, num_v_heads=4, head_k_dim=2, head_v_dim=3, conv_kernel=4),
        DraftAttention(1, 6),
        NoCache(),
    ),
    layers=(1, 0, 2, 3, 5, 4),
)
"""Every group kind in six layers; one Mamba-2 group, so B and C are replicated over TP
while x is split (vllm#55208)."""


def hybrid_run(
    source: StageLayout, target: StageLayout, model: ModelShape, **overrides: Any
) -> SimConfig:
    """A small hybrid run on OS-assigned ports."""
    settings = {"requests": 2, "seq_len": (30, 70), "timeout": 60.0, "ports": "os", **overrides}
    return SimConfig(stages=(source, target), model=model, **settings)


def plan_bytes(config: SimConfig) -> dict[tuple[int, int, int, int], int]:
    """kvspec's bytes per (replica 0, stage 0, src, dst), every group's edges of the pair
    summed over the run's requests, as the old hybrid harness's per-edge books were."""
    from sim.run.workload import Workload

    total: dict[tuple[int, int, int, int], int] = defaultdict(int)
    for request in Workload(config, 0).requests:
        plan = plan_groups(
            config.stages[0],
            config.stages[1],
            config.model,
            seq_len=request.seq_len,
            source_block_size=config.src_block_size,
            target_block_size=config.dst_block_size,
            policy=config.policy,
        )
        for (_, src, dst), n in plan.bytes_per_edge().items():
            total[(0, 0, src, dst)] += n
    return dict(total)


def verified(config: SimConfig) -> SimReport:
    report = run_simulation(config)
    assert_all_verified(report)
    assert report.edge_bytes == plan_bytes(config)
    by_group = {g: n for g, n in report.planned_group_bytes.items() if n}
    assert report.group_bytes == by_group, "bytes per layer group equal the plan [GROUP-3]"
    assert sum(by_group.values()) == report.bytes_moved
    return report


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1), (2, 4)])
def test_every_group_and_state_is_verified_with_the_plans_bytes(source: int, target: int) -> None:
    config = hybrid_run(StageLayout(source), StageLayout(target), EVERY_KIND)
    report = verified(config)
    assert config.content == "groups" and report.elements_verified > 0
    assert report.planned_group_bytes[5] == 0 and all(report.group_bytes[g] > 0 for g in range(5))
    assert "bytes per layer group" in report.render()


def test_a_sliding_window_receiver_gets_only_its_window() -> None:
    """WINDOW-1: a request longer than the window moves only the block-aligned window of
    the sliding group; every pair's bytes equal the plan's."""
    model = ModelShape(4, 4, 4, groups=(SlidingWindow(4, 4, window=24),), layers=(1, 0, 1, 0))
    config = hybrid_run(
        StageLayout(1), StageLayout(2), model, requests=1, seq_len=(100, 100), transport="inproc"
    )
    report = verified(config)
    window = len(window_tokens(24, 100, 16))
    assert window == 36  # tokens 64..99: the last 24, back to a block boundary
    for dst in range(2):  # 2 of 4 heads, 2 layers per group, K and V, 4 x bfloat16 each
        full, sliding = 2 * 2 * 100 * 2 * 4 * 2, 2 * 2 * window * 2 * 4 * 2
        assert report.edge_bytes[(0, 0, 0, dst)] == full + sliding


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1)])
def test_a_chunked_receiver_gets_only_its_current_chunk(source: int, target: int) -> None:
    """LOCAL-1: a chunked local-attention receiver holds and gets only the current chunk,
    block-aligned; on a chunk boundary the group moves nothing; every pair equals the plan."""
    model = ModelShape(4, 4, 4, groups=(ChunkedLocal(4, 4, chunk=36),), layers=(1, 0, 1, 0))
    # 100 tokens: the chunk 72..99 back to the block at 64; 72 = 2 x 36 is a chunk boundary
    for seq_len, chunk in ((100, 36), (72, 0)):
        assert len(chunk_tokens(36, seq_len, 16)) == chunk
        held = gr.held_region(
            StageLayout(target), model, 1, 0, seq_len=seq_len, block_size=16, receiving=True
        )
        assert len(held.tokens or ()) == chunk
        config = hybrid_run(
            StageLayout(source),
            StageLayout(target),
            model,
            requests=1,
            seq_len=(seq_len, seq_len),
            transport="inproc",
        )
        report = verified(config)
        full = 4 * 2 * seq_len * 2 * 4 * 2  # 4 heads, 2 layers, K and V, 4 x bfloat16
        assert report.bytes_moved == full + 4 * 2 * chunk * 2 * 4 * 2


def test_pp_stages_move_their_layers_of_each_group() -> None:
    config = hybrid_run(
        StageLayout(2, 2),
        StageLayout(4),
        EVERY_KIND,
        requests=1,
        seq_len=(20, 20),
        policy="balanced",
        transport="inproc",
    )
    verified(config)


def faulted_hybrid(target: StageLayout, spec: str, seed: int, **overrides: Any) -> SimReport:
    """Four (or ``requests=``) TP2 -> ``target`` requests of EVERY_KIND in one process
    under ``spec``."""
    settings: dict[str, Any] = {
        "requests": 4,
        "seq_len": (8, 40),
        "transport": "inproc",
        "faults": parse_faults(spec),
        "seed": seed,
        **overrides,
    }
    return run_simulation(hybrid_run(StageLayout(2), target, EVERY_KIND, **settings))


def _failed(report: SimReport) -> dict[str, str]:
    return {o.request_id: o.reasons[0] for o in report.outcomes if not o.ok}


@pytest.mark.parametrize(
    ("spec", "kinds"),
    [
        ("dup=0.4,reorder=0.4,garbage=0.4,delay=1ms", ("dup", "reorder", "garbage")),
        ("drop=0.3", ("drop",)),
        ("corrupt=0.3", ("corrupt",)),
    ],
)
def test_faults_strike_a_hybrid_and_are_booked_key_by_key(
    spec: str, kinds: tuple[str, ...]
) -> None:
    """The run's wire faults strike a hybrid's keyed messages of pieces and are booked where
    injected and where observed; dup, reorder and garbage harm nothing, a dropped or
    corrupted message fails exactly its request and every other request verifies."""
    for seed in range(6):
        report = faulted_hybrid(StageLayout(4), spec, seed)
        for kind in kinds:
            assert_booked_alike(report, kind, seed)
        struck = set().union(*(report.faulted_keys(k) for k in kinds))
        if kinds[0] in ("drop", "corrupt"):
            hit = {parse_key(k).request_id for k in struck}
            assert set(_failed(report)) == hit, (seed, report.render())
        else:
            assert_all_verified(report)
        if struck:
            break
    else:
        pytest.fail(f"{spec}: no fault struck in 6 seeds")


def test_a_killed_hybrid_sender_fails_what_it_owed_and_nothing_hangs() -> None:
    config = hybrid_run(
        StageLayout(2),
        StageLayout(2),
        EVERY_KIND,
        requests=4,
        seq_len=(8, 40),
        faults=parse_faults("kill=sender:1@0.5"),
    )
    report = run_simulation(config)
    assert report.fault_counts()["kill"] == {"injected": 1, "observed": 1}
    assert any("stage 0 rank 1" in d for d in report.dead)
    assert report.verified + report.failed == 4 and report.failed
    assert all("source rank 1" in why for why in _failed(report).values())


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 2)])
def test_a_hybrid_pulled_is_read_key_by_key_and_verified(source: int, target: int) -> None:
    """``--transfer pull``: each receiver reads each of its keys from its source over the
    verified connection; every element verifies and every pair moved the plan's bytes."""
    config = hybrid_run(StageLayout(source), StageLayout(target), EVERY_KIND, transfer="pull")
    report = verified(config)
    keys = sum(len(config_keys) for config_keys in _pair_keys(config).values())
    assert report.receiver_stats["reads_posted"] == keys
    assert not report.receiver_stats.get("reads_refused")


def test_a_pulled_hybrid_under_faults_fails_exactly_the_dropped() -> None:
    """Dropped answers fail exactly their requests; more of them than any read window
    (24 requests, a third dropped) hold back no read behind them: the run ends, every
    other request verified."""
    for seed in range(6):
        report = faulted_hybrid(
            StageLayout(2), "drop=0.3,dup=0.3", seed, transfer="pull", requests=24
        )
        assert_booked_alike(report, "drop", seed)
        assert_booked_alike(report, "dup", seed)
        dropped = {parse_key(k).request_id for k in report.faulted_keys("drop")}
        assert set(_failed(report)) == dropped, seed
        if dropped and report.verified:
            return
    pytest.fail("no seed dropped some requests and not others")


def _pair_keys(config: SimConfig) -> dict[str, list[str]]:
    from sim.run.workload import Workload

    workload = Workload(config, 0)
    book = workload.plans(0)
    return {r.request_id: [pk.key for pk in book.pair_keys(r)] for r in workload.requests}


def test_a_hybrid_streamed_by_layers_sends_each_layer_group_as_its_own_key() -> None:
    """``--stream layers`` [STREAM-1]: a pair's pieces are cut at layer bounds, one keyed
    message per layer that pair carries; every element verifies, the plan's bytes move,
    and each request's KV is ready layer group by layer group."""
    config = hybrid_run(
        StageLayout(2), StageLayout(4), EVERY_KIND, stream="layers", layer_compute_ms=0.0
    )
    report = verified(config)
    keys = _pair_keys(config)
    whole = _pair_keys(hybrid_run(StageLayout(2), StageLayout(4), EVERY_KIND))
    assert all(len(keys[r]) > len(whole[r]) for r in keys)
    streams = {parse_key(k).chunk_id for ks in keys.values() for k in ks}
    assert streams <= set(range(EVERY_KIND.num_layers)) and len(streams) > 1
    assert all(o.ready_s for o in report.outcomes)


def test_a_piece_cut_at_layer_bounds_keeps_its_layers_values() -> None:
    """STREAM-1: a piece of a group's layers 1 and 3 cut at the stream's layer bounds is
    one piece per bound holding that layer's values; a bound it has no layer in, none."""
    model = ModelShape(4, 4, 4, groups=(SlidingWindow(4, 4, window=24),), layers=(1, 0, 1, 0))
    plan = plan_groups(StageLayout(1), StageLayout(2), model, seq_len=20)
    edge = next(e for e in plan.edges if e.group == 0 and e.dst == 1)
    region = gr.held_region(StageLayout(1), model, 0, 0, seq_len=20, block_size=16, receiving=False)
    data = gr.fill(model, region, "req-0-0000", layout=StageLayout(1), rank=0)
    (piece,) = gr.cut(edge, region, data, 20)
    assert piece.layers == (1, 3)
    for span, layer, at in ((range(0, 2), 1, 0), (range(2, 4), 3, 1)):
        part = in_layers(piece, span)
        assert part is not None and part.layers == (layer,)
        assert torch.equal(part.data[0], piece.data[at]) and part.tokens == piece.tokens
    assert in_layers(piece, range(0, 1)) is None
    assert in_layers(piece, range(0, 4)) is piece


def test_vllm_block_sizes_without_a_hybrid_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["run", "--kv-heads", "4", "--vllm-block-size", "--quiet", "--ports", "os"])
    assert code == 2
    assert "--vllm-block-size derives a hybrid's block sizes" in capsys.readouterr().err


def test_sim_run_model_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m sim run --model NAME`` runs in the one runtime: its pairs' bytes in the
    report and JSON."""
    code = main(
        ["run", "--model", "deepseek-v3-mtp", "--source-tp", "2", "--target-tp", "1",
         "--requests", "1", "--seq-len", "8", "--ports", "os", "--quiet", "--json", "-"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["verified"]["edges_off_plan"] == 0
    # MLA: one sender's latent, 61 target layers and the draft layer, 8 tokens x 576 x 2 B
    moved = {g["group"]: g["bytes"] for g in report["layer_groups"]}
    assert moved == {0: 61 * 8 * 576 * 2, 1: 1 * 8 * 576 * 2}
    assert report["bytes_moved"] == sum(moved.values())


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--faults", "abort=0.1"], "--faults abort"),
        (["--transfer", "write"], "--transfer write"),
        (["--kv-heads", "4"], "--kv-heads"),
        (["--source-cp", "2"], "token shards"),
        (["--chain", "TP1,TP2,TP1"], "3 stages"),
    ],
)
def test_options_a_hybrid_run_does_not_take_are_refused(
    extra: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--model", "jamba-v0.1", "--quiet", "--ports", "os", *extra])
    assert code == 2
    assert named in capsys.readouterr().err


def _a_state_piece() -> tuple[list[Any], gr.Piece]:
    plan = plan_groups(StageLayout(1), StageLayout(2), EVERY_KIND, seq_len=8)
    edge = next(e for e in plan.edges if e.group == 2)
    region = gr.held_region(
        StageLayout(1), EVERY_KIND, 2, 0, seq_len=8, block_size=16, receiving=False
    )
    data = gr.fill(EVERY_KIND, region, "req-0000", layout=StageLayout(1), rank=0)
    piece = next(p for p in gr.cut(edge, region, data, 8) if p.part == "ssm")
    return pieces_frames([piece]), piece


def test_a_piece_round_trips_with_its_dtype_from_the_model() -> None:
    """The float32 temporal part of a Mamba-2 state crosses as raw bytes; the receiver
    reads its dtype from the model, not from the wire."""
    frames, sent = _a_state_piece()
    (piece,) = read_pieces([bytes(f) for f in frames], model=EVERY_KIND, src=0, dst=1)
    assert piece.part == "ssm" and str(piece.data.dtype) == "torch.float32"
    assert piece.data.numel() * 4 == len(bytes(frames[1]))
    assert torch.equal(piece.data, sent.data) and piece.dst_offset == sent.dst_offset


Change = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h, d: (h, d[:-1]), "not whole float32 elements"),
        (lambda h, d: ({**h, "part": "D"}, d), "part must be one of x, B, C, ssm"),
        (lambda h, d: ({**h, "group": 9}, d), "group must be an integer in 0..5"),
        (lambda h, d: ({**h, "layers": [6]}, d), "layers must be 1..6 layer indices"),
        (lambda h, d: ({**h, "dst_offset": -1}, d), "dst_offset must be an integer"),
    ],
)
def test_a_bad_piece_is_refused_with_the_value(change: Change, message: str) -> None:
    frames, _ = _a_state_piece()
    header = json.loads(bytes(frames[0]))["pieces"][0]
    header, data = change(header, bytes(frames[1]))
    with pytest.raises(MessageError, match=message):
        read_piece(header, data, model=EVERY_KIND, src=0, dst=1)


def test_a_description_that_does_not_match_its_frames_is_refused() -> None:
    frames, _ = _a_state_piece()
    with pytest.raises(MessageError, match=r"1 piece.*2 data frame"):
        read_pieces([bytes(f) for f in (*frames, frames[1])], model=EVERY_KIND, src=0, dst=1)


INDEXED = ModelShape(
    3,
    1,
    8,
    "mla",
    groups=(DraftAttention(1, 4, "mla", index_head_dim=128),),
    layers=(0, 0, 1),
    index_head_dim=256,
)
"""An MLA model whose latent and MTP draft layer each keep a sparse indexer [INDEX-1]."""


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1)])
def test_an_mla_indexer_reaches_every_receiver_whole(source: int, target: int) -> None:
    """INDEX-1: each receiver rank gets every token's indexer entry (fp8 values and float32
    scales) beside its latent, verified against the oracle; bytes per pair equal the plan."""
    config = hybrid_run(
        StageLayout(source), StageLayout(target), INDEXED, requests=1, seq_len=(9, 9),
        transport="inproc",
    )  # fmt: skip
    report = verified(config)
    per_dst = {
        d: sum(n for (_, _, _, dd), n in report.edge_bytes.items() if dd == d)
        for d in range(target)
    }
    latent_and_index = 2 * 9 * (8 * 2 + 256 + 2 * 4)  # the latent and main indexer, 2 layers
    draft = 1 * 9 * (4 * 2 + 128 + 4)  # the draft layer's latent and its own indexer
    assert per_dst == dict.fromkeys(range(target), latent_and_index + draft)


def test_a_wrong_indexer_byte_or_a_missing_part_is_caught() -> None:
    source, target = StageLayout(1), StageLayout(2)
    plan = plan_groups(source, target, INDEXED, seq_len=9)
    edge = next(e for e in plan.edges if e.group == 1 and e.dst == 1)
    sent = gr.held_region(source, INDEXED, 1, 0, seq_len=9, block_size=16, receiving=False)
    data = gr.fill(INDEXED, sent, "req-0000", layout=source, rank=0)
    pieces = gr.cut(edge, sent, data, 9)
    assert [p.part for p in pieces] == [None, "index", "index_scale"]
    frames = pieces_frames(pieces)
    header = json.loads(bytes(frames[0]))["pieces"][1]
    back = read_piece(header, bytes(frames[2]), model=INDEXED, src=0, dst=1)
    assert str(back.data.dtype) == "torch.float8_e4m3fn" and tuple(back.data.shape) == (1, 9, 128)
    with pytest.raises(MessageError, match="keeps no indexer"):
        model = ModelShape(3, 1, 8, "mla", groups=(DraftAttention(1, 4, "mla"),), layers=(0, 0, 1))
        read_piece(header, bytes(frames[2]), model=model, src=0, dst=1)
    held = gr.held_region(target, INDEXED, 1, 1, seq_len=9, block_size=16, receiving=True)
    into = gr.empty(INDEXED, held)
    counts = gr.counters(into)
    for piece in pieces:
        gr.place(piece, held, into, counts)
    check = {"layout": target, "rank": 1}
    assert gr.check_region(INDEXED, held, into, counts, "req-0000", **check) is None
    into["index_scale"].view(torch.int32)[0, 4, 0] ^= 1
    assert "index_scale: 1 of 9 elements differ" in (
        gr.check_region(INDEXED, held, into, counts, "req-0000", **check) or ""
    )
    counts["index"][0, 0, 0] = 0
    assert "index: 1 of 1152 elements never arrived" in (
        gr.check_region(INDEXED, held, into, counts, "req-0000", **check) or ""
    )


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1)])
def test_block_sizes_derived_per_tp_differ_and_every_element_verifies(
    source: int, target: int, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """BLOCK-1, WINDOW-2: Qwen3-Next's block size is 544 tokens at TP1 and 272 at TP4, so
    with --vllm-block-size the two stages' block sizes differ by construction; every element
    and every state still verifies, the report shows both and the bytes equal the plan."""
    out = tmp_path / "report.json"
    argv = ["run", "--model", "qwen3-next-80b-a3b", "--vllm-block-size", "--requests", "1"]
    argv += ["--source-tp", str(source), "--target-tp", str(target), "--seq-len", "16:40"]
    assert main([*argv, "--ports", "os", "--quiet", "--json", str(out)]) == 0
    blocks = {1: 544, 4: 272}
    shown = f"layer-group regions (block {blocks[source]}) -> (block {blocks[target]})"
    assert shown in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["ok"] and report["verified"]["edges_off_plan"] == 0
    assert (report["config"]["src_block_size"], report["config"]["dst_block_size"]) == (
        blocks[source],
        blocks[target],
    )


def test_a_window_hybrid_with_differing_block_sizes_moves_or_is_refused() -> None:
    """WINDOW-2: TP4 (blocks of 80) -> TP1 (blocks of 144) moves the receiver's window,
    aligned to its blocks, and verifies; TP1 -> TP4 after 1000 tokens needs 800-863, which
    the TP1 sender evicted, so the run is refused before any rank starts."""
    config = hybrid_run(
        StageLayout(4),
        StageLayout(1),
        WINDOWED,
        requests=1,
        seq_len=(1000, 1000),
        src_block_size=80,
        dst_block_size=144,
    )
    plan = plan_groups(
        StageLayout(4), StageLayout(1), WINDOWED, seq_len=1000, source_block_size=80,
        target_block_size=144,
    )  # fmt: skip
    assert {e.tokens.describe() for e in plan.edges if e.group == 1 and e.tokens} == {"864-999"}
    verified(config)
    with pytest.raises(ValueError, match=r"tokens 800-863 are evicted"):
        run_simulation(
            hybrid_run(
                StageLayout(1), StageLayout(4), WINDOWED, requests=1, seq_len=(1000, 1000),
                src_block_size=144, dst_block_size=80,
            )
        )  # fmt: skip


def test_a_stranger_neither_reads_a_hybrids_kv_nor_forges_its_verdict() -> None:
    """Issue 45: a hybrid run is the sim's one runtime, so its control plane is the
    authenticated one: a stranger's forged endpoint, result and error events are counted
    and dropped, junk and forged reads on a sender's KV port are refused, nothing reaches
    the stranger, and every request still verifies [sim.net.auth]."""
    config = hybrid_run(
        StageLayout(2),
        StageLayout(2),
        EVERY_KIND,
        requests=6,
        transfer="pull",
        faults=parse_faults("delay=5ms"),
    )
    cluster = Cluster(config)
    result: list[SimReport] = []
    runner = threading.Thread(target=lambda: result.append(cluster.run()))
    runner.start()
    deadline = time.time() + 60
    while not cluster.endpoints.get("r0s0k0") and time.time() < deadline:
        time.sleep(0.01)
    context = zmq.Context.instance()
    control = context.socket(zmq.DEALER)
    control.setsockopt(zmq.LINGER, 0)
    assert cluster.control_endpoint is not None
    control.connect(cluster.control_endpoint)
    forged = [
        b'{"ev": "bound", "rank": "r0s0k0", "endpoint": "tcp://127.0.0.1:9"}',
        b'{"ev": "result", "request": "req-0-0000", "ok": false, "reason": "forged"}',
        b'{"ev": "error", "traceback": "forged"}',
        b"9" * 4500,
    ]
    for frame in forged:
        control.send(frame)
    stranger = context.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(cluster.endpoints["r0s0k0"])
    read = json.dumps({"read": "req-0-0000_0_0_0_0", "seq": 0, "n": 0}).encode()
    for junk in ([read, b""], [b"\x80\x04garbage", b""], [os.urandom(64)]):
        for _ in range(10):
            stranger.send_multipart(junk)
    runner.join(120)
    stolen = stranger.poll(500) + control.poll(0)
    for sock in (control, stranger):
        sock.close()
    report = result[0]
    assert_all_verified(report)
    assert stolen == 0, "a stranger received something"
    assert report.strangers.get("control messages", 0) == len(forged)
    assert (
        report.strangers.get("kv reads refused", 0) + report.strangers.get("kv messages", 0) >= 10
    )
