"""`kvspec plan` and `kvspec clauses`: the plans of the README's and docs/layouts.md's examples and
the refusals."""

import json
import subprocess
import sys

import pytest

from kvspec.cli import main
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, _ = run(capsys, "plan", *argv, "--json", "-")
    assert code == 0
    return json.loads(out)


def test_tp8_to_tp2_with_4_heads(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--source-tp", "8", "--target-tp", "2", "--kv-heads", "4")
    assert code == 0
    assert "transfer plan  TP8 -> TP2" in out
    assert "edges (4):" in out
    assert "idle senders [1, 3, 5, 7]" in out
    # 4 heads x 32 layers x 1024 tokens x 128 x 2 bytes x (K, V) = 64 MiB
    assert "moved, sender-side slicing      64.0 MiB  (1.00x the minimum)" in out


def test_pp2_tp2_to_tp4_with_61_layers(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(
        capsys,
        "--source-tp",
        "2",
        "--source-pp",
        "2",
        "--target-tp",
        "4",
        "--kv-heads",
        "8",
        "--layers",
        "61",
    )
    assert [r["layers"] for r in report["source_ranks"]] == [[0, 31], [0, 31], [31, 61], [31, 61]]
    assert [r["fan_in"] for r in report["target_ranks"]] == [2, 2, 2, 2]
    totals = report["totals"]
    assert totals["bytes_sender_side"] == totals["bytes_minimum"]
    assert totals["bytes_receiver_side"] == 2 * totals["bytes_minimum"]  # each edge is half a shard


def test_mla_tp4_to_tp8(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(capsys, "--source-tp", "4", "--target-tp", "8", "--attention", "mla")
    assert report["model"]["attention"] == "mla"
    assert [r["fan_in"] for r in report["target_ranks"]] == [1] * 8
    assert report["totals"]["bytes_minimum"] == 8 * 32 * 1024 * 576 * 2


def test_tp6_to_tp3_with_12_heads_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(
        capsys, "--source-tp", "6", "--target-tp", "3", "--kv-heads", "12", "--policy", "balanced"
    )
    plan = plan_transfer(StageLayout(6), StageLayout(3), ModelShape(32, 12, 128), policy="balanced")
    assert report["edges"] == [
        {
            **e.to_dict(),
            "bytes": e.nbytes(1024),
            "bytes_receiver_side": e.nbytes(1024, slicing="receiver"),
        }
        for e in plan.edges
    ]


def test_tp4_to_tp6_is_planned_by_head_range_intersection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PLAN-1, PLAN-6: 12 heads fit TP4 (3 each) and TP6 (2 each); no ratio is needed."""
    report = plan_json(capsys, "--source-tp", "4", "--target-tp", "6", "--kv-heads", "12")
    edges = {(e["src"], e["dst"]): e for e in report["edges"]}
    assert sorted(edges) == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 3), (2, 4), (3, 4), (3, 5)]
    # Target rank 1 holds heads 2..3: head 2 is the last of source rank 0's three, head 3
    # the first of source rank 1's; the equal-slice form names them where it can.
    assert edges[(0, 1)]["heads"] == [2, 3] and edges[(0, 1)]["offset_in_shard"] == 2
    assert edges[(1, 1)]["heads"] == [3, 4] and edges[(1, 1)]["num_slices"] == 3
    # Heads 4..5 are heads 1..2 of source rank 1's shard: no equal slice names them.
    assert edges[(1, 2)]["heads_in_shard"] == [1, 3] and edges[(1, 2)]["shard_heads"] == 3
    assert "offset_in_shard" not in edges[(1, 2)]
    totals = report["totals"]
    assert totals["bytes_sender_side"] == totals["bytes_minimum"]
    code, out, _ = run(capsys, "plan", "--source-tp", "4", "--target-tp", "6", "--kv-heads", "12")
    assert code == 0 and "h1-2/3" in out


def test_a_cp_receiver_gets_token_sets(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's done-when: TP8 -> TP8 CP2 interleave:1 with 4 heads; edges carry tokens."""
    argv = ["--source-tp", "8", "--target-tp", "8", "--target-cp", "2", "--kv-heads", "4"]
    report = plan_json(capsys, *argv, "--cp-rule", "interleave:1", "--seq-len", "6")
    assert report["seq_len"] == 6 and report["target"]["cp_rule"] == "interleave:1"
    by_dst = {e["dst"]: e for e in report["edges"]}
    # Target ranks 0..3 are CP group 0 (even tokens), 4..7 group 1 (odd tokens) [STAGE-2].
    assert by_dst[0]["tokens"] == [[0, 1], [2, 3], [4, 5]]
    assert by_dst[4]["tokens"] == [[1, 2], [3, 4], [5, 6]]
    assert by_dst[0]["heads"] == by_dst[4]["heads"] == [0, 1]
    code, out, _ = run(capsys, "plan", *argv, "--cp-rule", "interleave:1")
    assert code == 0
    assert "token shard cp_rank of 2 by interleave:1" in out
    assert "0, 2, ... 1022 (512 runs of 1, every 2; 512 tokens)" in out


def test_a_request_on_dp_groups_is_planned_between_the_routers_groups(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DP-1: only the chosen groups' ranks appear in edges."""
    report = plan_json(
        capsys,
        *("--source-tp", "8", "--source-dp", "2", "--source-dp-rank", "1"),
        *("--target-tp", "4", "--target-dp", "2", "--kv-heads", "2"),
    )
    assert {e["src"] for e in report["edges"]} <= {4, 5, 6, 7}
    assert {e["dst"] for e in report["edges"]} == {0, 1}
    assert report["source_dp"] == 1 and report["target_dp"] == 0
    assert [r["active"] for r in report["source_ranks"]] == [False] * 4 + [True] * 4


def test_a_side_that_cannot_hold_the_model_is_refused_with_alternatives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "plan", "--source-tp", "4", "--target-tp", "6", "--kv-heads", "8")
    assert code == 2 and out == ""
    assert "target TP6: 8 KV heads cannot be split over TP 6" in err and "[HEAD-1]" in err
    assert "--source-tp 4 --target-tp 4 or 8 or 2" in err
    for alternative in ("4", "8", "2"):
        argv = ["plan", "--source-tp", "4", "--target-tp", alternative, "--kv-heads", "8"]
        assert run(capsys, *argv)[0] == 0


@pytest.mark.parametrize(
    ("argv", "message", "hint"),
    [
        (
            ["--target-cp", "2", "--cp-rule", "interleave:24"],
            "interleave:24 needs a cache block size that is a multiple of 24",
            "--target-cp-rule interleave:16 or interleave:8 or interleave:4",
        ),
        (
            ["--target-cp", "2", "--cp-rule", "zigzag", "--seq-len", "3"],
            "zigzag over 2 token shards cuts a request into 4 segments",
            "--seq-len 4 or more",
        ),
        (
            ["--target-dcp", "4"],
            "dcp 4 needs every KV head held by at least 4 attention-TP ranks",
            "--target-dcp 2",
        ),
        (["--target-dp", "3"], "dp 3 x cp 1 = 3 does not divide tp 8", "--target-dp 2 or 4 or 1"),
        (["--target-dp", "2", "--target-dp-rank", "2"], "target DP rank 2", "--target-dp-rank 1"),
        (["--cp-rule", "ring", "--target-cp", "2"], "unknown context-parallel rule 'ring'", None),
    ],
)
def test_a_layout_its_rules_do_not_fit_is_refused_with_alternatives(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str, hint: str | None
) -> None:
    code, out, err = run(
        capsys, "plan", "--source-tp", "8", "--target-tp", "8", "--kv-heads", "4", *argv
    )
    assert code == 2 and out == ""
    assert message in err
    if hint is not None:
        assert hint in err


def test_all_problems_are_reported_together(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--source-tp", "3", "--target-tp", "6", "--kv-heads", "4")
    assert code == 2
    assert "2 problems" in err and "4 KV heads cannot be split over TP 3" in err
    assert "source TP3:" in err and "target TP6:" in err


def test_mla_with_kv_heads_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        "plan",
        "--source-tp",
        "2",
        "--target-tp",
        "2",
        "--attention",
        "mla",
        "--kv-heads",
        "4",
    )
    assert code == 2 and "MLA latent has no head axis" in err


def test_clauses_lists_ids(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "clauses", "head")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["HEAD-1", "HEAD-2", "HEAD-3"]


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvspec", "plan", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "examples:" in done.stdout and "--source-tp S" in done.stdout


def test_layouts_lists_every_preset_with_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.memory.cache_layout import PRESETS

    code, out, _ = run(capsys, "layouts")
    assert code == 0 and f"{len(PRESETS)} cache layouts" in out
    for name, layout in PRESETS.items():
        assert f"\n{name:<24}{layout.shape}\n" in out
    assert "stride order (0, 2, 1, 3) of logical [blocks, heads, slots, dim]; vllm 0.33.0" in out
    code, out, _ = run(capsys, "layouts", "sglang_mha")
    assert code == 0 and "sglang 0.5.23" in out and "not confirmed" in out
    code, out, _ = run(capsys, "layouts", "--json", "-")
    assert [entry["name"] for entry in json.loads(out)["layouts"]] == list(PRESETS)


def test_layouts_convert_round_trips_bit_for_bit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "layouts", "--convert", "vllm_pth_hnd", "vllm_pth_nhd", "--json", "-"
    )
    report = json.loads(out)
    assert code == 0 and report["round_trip_bit_exact"] is True
    assert [f["field"] for f in report["fields"]] == ["k", "k_scale", "v", "v_scale"]
    # [blocks, slots, heads, 2 * (head_dim + 4)] bytes of fp8 data and float32 scales
    assert report["target_tensors"] == [[4, 16, 2, 24]]
    code, out, _ = run(capsys, "layouts", "--convert", "trtllm_pool", "vllm_packed_hnd_layers")
    assert code == 0 and "bit-identical" in out


def _desc(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "desc", *argv, "--json", "-")
    assert code == 0, err
    return json.loads(out)


def test_desc_counts_the_issue_example(capsys: pytest.CaptureFixture[str]) -> None:
    """TP8 -> TP2, 4 KV heads: each sender holds one head; an SGLang row holds both of the
    receiver's heads, so every (layer, token, K or V) of the head is its own 256-byte range."""
    report = _desc(
        capsys,
        "--source-tp", "8", "--target-tp", "2", "--kv-heads", "4",
        "--src-layout", "vllm_packed_hnd", "--dst-layout", "sglang_mha",
    )  # fmt: skip
    assert [(e["src"], e["dst"]) for e in report["edges"]] == [(0, 0), (2, 0), (4, 1), (6, 1)]
    for edge in report["edges"]:
        assert edge["descriptors"] == 32 * 1024 * 2
        assert edge["bytes_per_descriptor"] == 128 * 2
    assert report["totals"]["descriptors_per_1k_tokens"] == 4 * 32 * 1024 * 2 * 1000 / 1024


def test_desc_one_range_per_layer_when_both_sides_match(capsys) -> None:
    """Same layout, heads and block ids in order on both sides: each layer is one run."""
    report = _desc(
        capsys,
        "--source-tp", "2", "--target-tp", "2", "--kv-heads", "4", "--contiguous",
        "--src-layout", "vllm_packed_hnd", "--dst-layout", "vllm_packed_hnd",
    )  # fmt: skip
    assert [e["descriptors"] for e in report["edges"]] == [32, 32]


def test_desc_check_judges_a_connectors_list(capsys, tmp_path) -> None:
    """DESC-1, DESC-2: --check passes the plan's own list, refuses a wrong one by rule."""
    args = ["--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--layers", "2"]
    args += ["--seq-len", "40", "--edge", "2:1", "--dst-layout", "sglang_mha"]
    listed = _desc(capsys, *args, "--show", "100000")["edges"][0]["first"]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(listed[::-1]))
    assert _desc(capsys, *args, "--check", str(good))["check"]["ok"] is True
    first = listed[0]
    wrong = {
        "DESC-1.2": [*listed, first],
        "DESC-1.1": listed[1:],
        "DESC-2.1": [*listed[1:], [first[0], 10**9, first[2], first[3], first[4]]],
    }
    for rule, value in wrong.items():
        path = tmp_path / "wrong.json"
        path.write_text(json.dumps(value))
        code, _, err = run(capsys, "desc", *args, "--check", str(path))
        assert code == 2 and err.startswith("kvspec desc: refused: --check") and f"[{rule}]" in err
        assert len(err.strip().splitlines()) == 1


def test_desc_with_token_shards_reads_each_ranks_own_tokens(capsys) -> None:
    """A PCP2 interleave:16 sender: each edge carries half the tokens, and each side's block
    ids cover only the tokens its rank holds [CP-1, DESC-1, PAGED-3]."""
    report = _desc(
        capsys,
        "--source-tp", "4", "--source-cp", "2", "--cp-rule", "interleave:16",
        "--target-tp", "6", "--kv-heads", "12", "--layers", "2", "--seq-len", "64",
        "--src-layout", "vllm_packed_hnd", "--dst-layout", "sglang_mha",
    )  # fmt: skip
    assert len(report["edges"]) == 12
    for edge in report["edges"]:
        shard = edge["src"] // 2  # TP ranks 0-1 are CP rank 0, 2-3 CP rank 1 [STAGE-2]
        assert edge["tokens"] == [
            [0 + 16 * shard, 16 + 16 * shard],
            [32 + 16 * shard, 48 + 16 * shard],
        ]
        heads = edge["heads"][1] - edge["heads"][0]
        assert edge["bytes"] == heads * 2 * 32 * 2 * 128 * 2  # heads x layers x 32 tokens x K,V
        # the sender's 32 tokens fill 2 blocks of 16; the receiver holds every token, and
        # the share ends at token 47 + 16 * shard: blocks up to there
        assert len(edge["src_block_ids"]) == 2 and len(edge["dst_block_ids"]) == 3 + shard
