"""`kvspec plan` and `kvspec clauses`: the plans of the README's examples and the refusals."""

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


def test_tp3_to_tp2_is_refused_with_reasons_and_alternatives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "plan", "--source-tp", "3", "--target-tp", "2", "--kv-heads", "6")
    assert code == 2 and out == ""
    assert "source TP 3 and target TP 2 do not divide one another" in err
    assert "[PLAN-1]" in err
    assert "--source-tp 3 --target-tp 1 or 3 or 6" in err
    for alternative in ("1", "3", "6"):
        assert (
            run(capsys, "plan", "--source-tp", "3", "--target-tp", alternative, "--kv-heads", "6")[
                0
            ]
            == 0
        )


def test_all_problems_are_reported_together(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--source-tp", "3", "--target-tp", "2", "--kv-heads", "4")
    assert code == 2
    assert "2 problems" in err and "4 KV heads cannot be split over TP 3" in err


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
