"""The simulated cluster on hybrid models: real processes on OS-assigned loopback ports move
every layer group, every state is verified by coordinate, and the bytes of every edge
equal kvspec's group plan [GROUP-3, STATE-2, WINDOW-1]."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import torch

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
from sim.cli import main
from sim.harness.hybrid import HybridRun, run_hybrid
from sim.net.group_messages import piece_frames, read_header, read_piece
from sim.net.messages import MessageError
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


def plan_bytes(run: HybridRun) -> dict[tuple[int, int, int], int]:
    """kvspec's bytes per (group, src, dst), summed over the run's requests."""
    total: dict[tuple[int, int, int], int] = defaultdict(int)
    for _, seq_len in run.workload():
        plan = plan_groups(run.source, run.target, run.model, seq_len=seq_len, block_size=16)
        for key, n in plan.bytes_per_edge().items():
            total[key] += n
    return dict(total)


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1), (2, 4)])
def test_every_group_and_state_is_verified_with_the_plans_bytes(source: int, target: int) -> None:
    run = HybridRun(
        StageLayout(source), StageLayout(target), EVERY_KIND, requests=2, seq_len=(30, 70)
    )
    report = run_hybrid(run)
    assert report.ok, report.render()
    assert sorted(report.verified) == [r for r, _ in run.workload()]
    assert report.moved == plan_bytes(run)
    by_group = report.bytes_by_group(report.moved)
    assert by_group[5] == 0 and all(by_group[g] > 0 for g in range(5))


def test_a_sliding_window_receiver_gets_only_its_window() -> None:
    """WINDOW-1: a request longer than the window moves only the block-aligned window of
    the sliding group; every edge of it equals the plan's bytes."""
    model = ModelShape(4, 4, 4, groups=(SlidingWindow(4, 4, window=24),), layers=(1, 0, 1, 0))
    run = HybridRun(StageLayout(1), StageLayout(2), model, requests=1, seq_len=(100, 100))
    report = run_hybrid(run)
    assert report.ok, report.render()
    window = len(window_tokens(24, 100, 16))
    assert window == 36  # tokens 64..99: the last 24, back to a block boundary
    for dst in range(2):  # 2 of 4 heads, 2 sliding layers, K and V, 4 x bfloat16 each
        assert report.moved[(1, 0, dst)] == 2 * 2 * window * 2 * 4 * 2
        assert report.moved[(0, 0, dst)] == 2 * 2 * 100 * 2 * 4 * 2
    assert report.moved == plan_bytes(run)


@pytest.mark.parametrize(("source", "target"), [(1, 4), (4, 1)])
def test_a_chunked_receiver_gets_only_its_current_chunk(source: int, target: int) -> None:
    """LOCAL-1: a chunked local-attention receiver holds and gets only the current chunk,
    block-aligned; on a chunk boundary the group moves nothing; every edge equals the plan."""
    model = ModelShape(4, 4, 4, groups=(ChunkedLocal(4, 4, chunk=36),), layers=(1, 0, 1, 0))
    # 100 tokens: the chunk 72..99 back to the block at 64; 72 = 2 x 36 is a chunk boundary
    for seq_len, chunk in ((100, 36), (72, 0)):
        assert len(chunk_tokens(36, seq_len, 16)) == chunk
        run = HybridRun(
            StageLayout(source), StageLayout(target), model, requests=1, seq_len=(seq_len, seq_len)
        )
        held = gr.held_region(
            run.target, model, 1, 0, seq_len=seq_len, block_size=16, receiving=True
        )
        assert len(held.tokens or ()) == chunk
        report = run_hybrid(run)
        assert report.ok, report.render()
        assert report.moved == plan_bytes(run)
        moved = sum(n for (g, _, _), n in report.moved.items() if g == 1)
        assert moved == 4 * 2 * chunk * 2 * 4 * 2  # 4 heads, 2 layers, K and V, 4 x bfloat16


def test_pp_stages_move_their_layers_of_each_group() -> None:
    run = HybridRun(
        StageLayout(2, 2),
        StageLayout(4),
        EVERY_KIND,
        requests=1,
        seq_len=(20, 20),
        policy="balanced",
    )
    report = run_hybrid(run)
    assert report.ok, report.render()
    assert report.moved == {
        k: n
        for k, n in plan_groups(run.source, run.target, EVERY_KIND, seq_len=20, policy="balanced")
        .bytes_per_edge()
        .items()
    }


def test_sim_run_model_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m sim run --model NAME``: bytes per layer group in the report and JSON."""
    code = main(
        ["run", "--model", "deepseek-v3-mtp", "--source-tp", "2", "--target-tp", "1",
         "--requests", "1", "--seq-len", "8", "--json", "-"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["bytes_match"]
    assert set(report["bytes_by_group"]) == {"0", "1"}
    moved = {g: v["moved"] for g, v in report["bytes_by_group"].items()}
    # MLA: one sender's latent, 61 target layers and the draft layer, 8 tokens x 576 x 2 B
    assert moved == {"0": 61 * 8 * 576 * 2, "1": 1 * 8 * 576 * 2}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--faults", "drop=0.1"], "--faults"),
        (["--transfer", "pull"], "--transfer"),
        (["--kv-heads", "4"], "--kv-heads"),
        (["--source-cp", "2"], "token shards"),
    ],
)
def test_options_a_hybrid_run_does_not_take_are_refused(
    extra: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--model", "jamba-v0.1", "--quiet", *extra])
    assert code == 2
    assert named in capsys.readouterr().err


def _a_state_piece() -> list[Any]:
    run = HybridRun(StageLayout(1), StageLayout(2), EVERY_KIND, requests=1, seq_len=(8, 8))
    plan = run.plan(8)
    edge = next(e for e in plan.edges if e.group == 2)
    region = gr.held_region(run.source, EVERY_KIND, 2, 0, seq_len=8, block_size=16, receiving=False)
    data = gr.fill(EVERY_KIND, region, "req-0000", layout=run.source, rank=0)
    piece = next(p for p in gr.cut(edge, region, data, 8) if p.part == "ssm")
    return piece_frames(piece, run="token", request="req-0000")


def test_a_piece_round_trips_with_its_dtype_from_the_model() -> None:
    """The float32 temporal part of a Mamba-2 state crosses as raw bytes; the receiver
    reads its dtype from the model, not from the wire."""
    frames = _a_state_piece()
    header = read_header(frames[0], run="token")
    piece = read_piece(header, bytes(frames[1]), model=EVERY_KIND, dst=1, sources=1)
    assert piece.part == "ssm" and str(piece.data.dtype) == "torch.float32"
    assert piece.data.numel() * 4 == len(bytes(frames[1]))


Change = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h, d: (h, d[:-1]), "not whole float32 elements"),
        (lambda h, d: ({**h, "part": "D"}, d), "part must be one of x, B, C, ssm"),
        (lambda h, d: ({**h, "group": 9}, d), "group must be an integer in 0..5"),
        (lambda h, d: ({**h, "layers": [6]}, d), "layers must be 1..6 layer indices"),
        (lambda h, d: ({**h, "src": -1}, d), "src must be an integer in 0..0"),
    ],
)
def test_a_bad_piece_is_refused_with_the_value(change: Change, message: str) -> None:
    frames = _a_state_piece()
    header, data = change(read_header(frames[0], run="token"), bytes(frames[1]))
    with pytest.raises(MessageError, match=message):
        read_piece(header, data, model=EVERY_KIND, dst=1, sources=1)


def test_a_message_of_another_run_is_refused() -> None:
    frames = _a_state_piece()
    with pytest.raises(MessageError, match="another run"):
        read_header(frames[0], run="other")


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
    scales) beside its latent, verified against the oracle; bytes per edge equal the plan."""
    run = HybridRun(StageLayout(source), StageLayout(target), INDEXED, requests=1, seq_len=(9, 9))
    report = run_hybrid(run)
    assert report.ok, report.render()
    assert report.moved == plan_bytes(run)
    per_dst = {
        d: sum(n for (g, _, dd), n in report.moved.items() if dd == d and g == 0)
        for d in range(target)
    }
    assert per_dst == dict.fromkeys(range(target), 2 * 9 * (8 * 2 + 256 + 2 * 4))


def test_a_wrong_indexer_byte_or_a_missing_part_is_caught() -> None:
    run = HybridRun(StageLayout(1), StageLayout(2), INDEXED, requests=1, seq_len=(9, 9))
    plan = run.plan(9)
    edge = next(e for e in plan.edges if e.group == 1 and e.dst == 1)
    sent = gr.held_region(run.source, INDEXED, 1, 0, seq_len=9, block_size=16, receiving=False)
    data = gr.fill(INDEXED, sent, "req-0000", layout=run.source, rank=0)
    pieces = gr.cut(edge, sent, data, 9)
    assert [p.part for p in pieces] == [None, "index", "index_scale"]
    frames = piece_frames(pieces[1], run="token", request="req-0000")
    header = read_header(frames[0], run="token")
    back = read_piece(header, bytes(frames[1]), model=INDEXED, dst=1, sources=1)
    assert str(back.data.dtype) == "torch.float8_e4m3fn" and tuple(back.data.shape) == (1, 9, 128)
    with pytest.raises(MessageError, match="keeps no indexer"):
        model = ModelShape(3, 1, 8, "mla", groups=(DraftAttention(1, 4, "mla"),), layers=(0, 0, 1))
        read_piece(header, bytes(frames[1]), model=model, dst=1, sources=1)
    held = gr.held_region(run.target, INDEXED, 1, 1, seq_len=9, block_size=16, receiving=True)
    into = gr.empty(INDEXED, held)
    counts = gr.counters(into)
    for piece in pieces:
        gr.place(piece, held, into, counts)
    check = {"layout": run.target, "rank": 1}
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
    assert main([*argv, "--json", str(out)]) == 0
    blocks = {1: 544, 4: 272}
    shown = f"block size: sender {blocks[source]}, receiver {blocks[target]} tokens"
    assert shown in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["ok"] and report["bytes_match"]
    assert report["block_size"] == {"source": blocks[source], "target": blocks[target]}


def test_a_window_hybrid_with_differing_block_sizes_moves_or_is_refused() -> None:
    """WINDOW-2: TP4 (blocks of 80) -> TP1 (blocks of 144) moves the receiver's window,
    aligned to its blocks, and verifies; TP1 -> TP4 after 1000 tokens needs 800-863, which
    the TP1 sender evicted, so the run is refused before any rank starts."""
    run = HybridRun(
        StageLayout(4),
        StageLayout(1),
        WINDOWED,
        requests=1,
        seq_len=(1000, 1000),
        block_size=80,
        dst_block_size=144,
    )
    assert {e.tokens.describe() for e in run.plan(1000).edges if e.group == 1} == {"864-999"}
    report = run_hybrid(run)
    assert report.ok, report.render()
    with pytest.raises(ValueError, match=r"tokens 800-863 are evicted"):
        HybridRun(
            StageLayout(1),
            StageLayout(4),
            WINDOWED,
            requests=1,
            seq_len=(1000, 1000),
            block_size=144,
            dst_block_size=80,
        )
