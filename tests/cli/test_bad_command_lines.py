"""Every bad command line ends the same way: exit status 2, a first line that names the
value and the limit, no traceback, little work (a bounded count of this process's CPU
seconds, never wall-clock seconds, which a busy machine stretches), and nothing left
behind (no file, no process, no temporary directory). Over 150 of them, across every command."""

from __future__ import annotations

import shlex
import tempfile
import time
from pathlib import Path

import multiprocess
import pytest

from kvspec.cli import main as kvspec_main
from sim.cli import main as sim_main

REFUSAL_CPU_S = 10.0
"""CPU seconds a refusal may cost this process: it is refused before the work it would
do (the largest, 100,000 requests, costs about 1 CPU s to validate)."""

RUN = ["run", "--quiet", "--ports", "os"]
OK = ["--kv-heads", "4"]

SIM_INT_FLAGS = {
    "--source-tp": None,
    "--target-tp": None,
    "--source-pp": None,
    "--target-pp": None,
    "--replicas": None,
    "--kv-heads": None,
    "--head-dim": None,
    "--layers": None,
    "--latent-dim": None,
    "--src-block-size": None,
    "--dst-block-size": None,
    "--requests": None,
    "--chunks": None,
    "--ranks-per-process": None,
}
BAD_INTS = ["0", "-1", "1e9", "abc", "", "9" * 30, "2.5"]

SIM_LINES: list[list[str]] = [
    [*RUN, *OK, flag, bad]
    for flag in SIM_INT_FLAGS
    for bad in BAD_INTS
    if not (flag == "--kv-heads" and bad == "")  # covered by the missing-value case below
]
SIM_LINES += [  # attention groups and token shards [STAGE-2, CP-1..3]
    [*RUN, *OK, "--source-cp", "3"],  # 3 does not divide the source's tp 4
    [*RUN, *OK, "--target-dp", "0"],
    [*RUN, *OK, "--source-dcp", "2"],  # 4 heads over 4 ranks: no replica to share tokens
    [*RUN, *OK, "--source-cp", "2", "--cp-rule", "ring"],
    [*RUN, *OK, "--source-cp", "2", "--cp-rule", "interleave:5"],  # blocks of 16
    [*RUN, *OK, "--source-cp", "2", "--cp-rule", "round_robin_blocks:8"],
    [*RUN, *OK, "--source-cp", "2", "--cp-rule", "zigzag", "--seq-len", "2:8"],
    [*RUN, *OK, "--source-cp", "2", "--source-dp-rank", "1"],  # the router picks DP ranks
]
SIM_LINES += [
    [*RUN, *OK, "--seed", "-1"],
    [*RUN, *OK, "--seed", "x"],
    [*RUN, *OK, "--timeout", "nan"],
    [*RUN, *OK, "--timeout", "inf"],
    [*RUN, *OK, "--timeout", "-1"],
    [*RUN, *OK, "--timeout", "0"],
    [*RUN, *OK, "--timeout", "1e9"],
    [*RUN, *OK, "--seq-len", "0"],
    [*RUN, *OK, "--seq-len", "5:3"],
    [*RUN, *OK, "--seq-len", "a:b"],
    [*RUN, *OK, "--seq-len", "1:99999999999"],
    [*RUN, *OK, "--seq-len", "9" * 40],
    [*RUN, *OK, "--seq-len", "3:"],  # what is used must be what was written (issue 30.5)
    [*RUN, *OK, "--seq-len", " 3"],
    [*RUN, *OK, "--seq-len", "1_6"],
    [*RUN, *OK, "--layer-compute-ms", "-1"],  # refused even when nothing streams
    [*RUN, *OK, "--layer-compute-ms", "nan"],
    [*RUN, *OK, "--layer-compute-ms", "inf"],
    [*RUN, *OK, "--layer-compute-ms", "1e9"],
    [*RUN, *OK, "--layer-compute-ms", "5ms"],
    [*RUN, *OK, "--faults", "drop=1e-400"],  # reads as 0
    [*RUN, *OK, "--faults", "drop=0x1"],
    [*RUN, *OK, "--faults", "delay=1e-400s"],
    [*RUN, *OK, "--faults", "kill=sender:1@1e-400"],
    [*RUN, *OK, "--requests", "+4"],
    [*RUN, *OK, "--requests", "٤"],  # an Arabic-Indic four: int() reads it, we do not
    [*RUN, *OK, "--chunks", "9", "--seq-len", "4:8"],
    [*RUN, *OK, "--faults", "drop=2"],
    [*RUN, *OK, "--faults", "drop=nan"],
    [*RUN, *OK, "--faults", "drop=-0.1"],
    [*RUN, *OK, "--faults", "drop"],
    [*RUN, *OK, "--faults", "explode=0.1"],
    [*RUN, *OK, "--faults", "delay=5"],
    [*RUN, *OK, "--faults", "delay=1000s"],
    [*RUN, *OK, "--faults", "delay=-5ms"],
    [*RUN, *OK, "--faults", "kill=sender:99@0.5"],
    [*RUN, *OK, "--faults", "kill=receiver:2@0.5"],
    [*RUN, *OK, "--faults", "kill=stage7:0@0.5"],
    [*RUN, *OK, "--faults", "kill=sender:1@2"],
    [*RUN, *OK, "--faults", "hang=sender"],
    [*RUN, *OK, "--faults", "fail-nth=sender:1@0"],
    [*RUN, *OK, "--faults", "fail-nth=sender:1@2.5"],
    [*RUN, *OK, "--faults", "restart=sender:9@0.5"],
    [*RUN, *OK, "--faults", "restart=sender:1@1.5"],
    [*RUN, *OK, "--faults", "late=1.1"],
    [*RUN, *OK, "--faults", "abort=-1"],
    [*RUN, *OK, "--hold", "-1"],
    [*RUN, *OK, "--hold", "x"],
    [*RUN, *OK, "--faults", "x" * 5000],
    [*RUN, *OK, "--faults", "drop=0.1," + "y" * 1_000_000],
    [*RUN, *OK, "--host", "no_such_host"],
    [*RUN, *OK, "--host", "256.1.1.1"],
    [*RUN, *OK, "--host", "8.8.8.8"],
    [*RUN, *OK, "--ports", "random"],
    ["run", "--quiet", *OK, "--base-port", "0"],
    ["run", "--quiet", *OK, "--base-port", "70000"],
    ["run", "--quiet", *OK, "--base-port", "abc"],
    ["run", "--quiet", *OK, "--base-port", "65530"],
    [*RUN, *OK, "--chain", "TPx"],
    [*RUN, *OK, "--chain", "TP0,TP1"],
    [*RUN, *OK, "--chain", "TP4"],
    [*RUN, *OK, "--chain", ""],
    [*RUN, *OK, "--chain", "TP2,PP0xTP2"],
    [*RUN, *OK, "--src-layout", "nonsense"],
    [*RUN, *OK, "--dst-layout", "mla"],
    [*RUN, *OK, "--dtype", "int4"],
    [*RUN, *OK, "--transfer", "sideways"],
    [*RUN, *OK, "--transfer", "pull", "--slicing", "receiver"],
    [*RUN, *OK, "--transfer", "pull", "--faults", "abort=0.1"],
    [*RUN, *OK, "--transfer", "pull", "--faults", "restart=sender:0@0.5"],
    [*RUN, *OK, "--transfer", "pull", "--unsafe-reuse"],
    [*RUN, *OK, "--src-layout", "vllm_pth_hnd"],  # an fp8 record for a bfloat16 model
    [*RUN, *OK, "--dst-layout", "flashmla_fp8"],
    [*RUN, *OK, "--dst-layout", "sglang_mla"],  # an MHA model's cache in a latent pool
    [*RUN, *OK, "--attention", "linear"],
    [*RUN, "--attention", "mla", "--kv-heads", "4"],
    [*RUN, *OK, "--policy", "random"],
    [*RUN, *OK, "--slicing", "both"],
    [*RUN, *OK, "--device", "tpu"],
    [*RUN, *OK, "--transport", "udp"],
    [*RUN, *OK, "--json", "/nonexistent-dir/report.json"],
    [*RUN, *OK, "--json", "/"],
    [*RUN, *OK, "--no-checksum", "--require-checksum"],
    [*RUN, "--source-tp", "4", "--target-tp", "6", "--kv-heads", "8"],
    [*RUN, "--source-tp", "4", "--target-tp", "2", "--kv-heads", "6"],
    [*RUN, "--source-tp", "2", "--target-tp", "2"],
    [*RUN, *OK, "--source-tp", "1000", "--target-tp", "1000"],
    [*RUN, *OK, "--replicas", "64", "--source-tp", "8", "--target-tp", "8"],
    [*RUN, *OK, "--requests", "100000", "--seq-len", "1000000", "--layers", "64"],
    ["run", "--quiet", *OK, "--chain", "TP8,TP8,TP8,TP8,TP8"],  # spec ports collide
    [*RUN, *OK, "--unknown-flag"],
    [*OK],
    ["walk"],
    [],
]

DESC = ["desc", "--source-tp", "8", "--target-tp", "2", "--kv-heads", "4", "--seq-len", "64"]

KVSPEC_LINES: list[list[str]] = [
    ["plan", "--source-tp", "4", "--target-tp", "2", flag, bad]
    for flag in ("--source-pp", "--target-pp", "--layers", "--head-dim", "--seq-len")
    for bad in ("0", "-3", "x", "1e6", "9" * 25)
]
KVSPEC_LINES += [
    ["plan", "--source-tp", bad, "--target-tp", "2", "--kv-heads", "4"]
    for bad in ("0", "-1", "abc", "1e9", "5000", "")
]
KVSPEC_LINES += [
    ["plan", "--source-tp", "4", "--target-tp", "2"],
    ["plan", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "6"],
    ["plan", "--source-tp", "3", "--target-tp", "6", "--kv-heads", "4"],
    ["plan", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "0"],
    ["plan", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--dtype", "int8"],
    ["plan", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--policy", "x"],
    ["plan", "--source-tp", "4", "--target-tp", "2", "--attention", "mla", "--kv-heads", "4"],
    shlex.split(
        "plan --source-tp 2 --source-pp 2 --target-tp 2 --kv-heads 2 --source-partition 1,x"
    ),
    shlex.split(
        "plan --source-tp 2 --source-pp 2 --target-tp 2 --kv-heads 2 --source-partition 30,30"
    ),
    shlex.split(
        "plan --source-tp 2 --source-pp 2 --target-tp 2 --kv-heads 2 --source-partition 0,32"
    ),
    shlex.split("plan --source-tp 2 --target-tp 2 --kv-heads 2 --json /nonexistent-dir/plan.json"),
    ["plan"],
    ["ports", "--stage", "tp=1e9"],
    ["ports", "--stage", "tp=abc"],
    ["ports", "--stage", "tp=0"],
    ["ports", "--stage", "foo=1"],
    ["ports", "--stage", ""],
    ["ports", "--stage", "tp=2,tp=2"],
    ["ports", "--stage", "tp=4096,pp=4096"],
    ["ports", "--stage", "tp=2,dp=2"],
    ["ports", "--stage", "tp=2", "--base", "0"],
    ["ports", "--stage", "tp=2", "--base", "70000"],
    ["ports", "--stage", "tp=2", "--rank-stride", "0"],
    ["ports", "--stage", "tp=2", "--replica-stride", "-4"],
    ["ports", "--stage", "tp=2", "--kv-offset", "99999"],
    ["ports", "--stage", "tp=2", "--base", "65500"],
    ["ports", *["--stage", "tp=8"] * 5],  # ports of different purposes collide
    ["ports", "--stage", "tp=2,id=70000"],
    ["ports", "--stage", "tp=2", "--json", "/nonexistent-dir/p.json"],
    ["ports"],
    ["layouts", "nonsense"],
    ["layouts", "FlashInfer"],
    ["layouts", "--convert", "flash_attn", "nope"],
    ["layouts", "--convert", "vllm_pth_hnd", "vllm_packed_hnd"],  # inline scales
    ["layouts", "--convert", "flash_attn", "mla"],  # K and V into a latent
    ["layouts", "--convert", "flash_attn", "vllm_packed_hnd_layers"],  # one layer into many
    ["layouts", "--convert", "flash_attn", "kv_tuple", "--blocks", "3", "--to-block-size", "32"],
    ["layouts", "--convert", "vllm_pth_hnd", "vllm_pth_nhd", "--head-dim", "3"],  # misaligned
    ["layouts", "--convert", "flash_attn"],
    # each flag at its own maximum: their product (16 PiB) is refused before allocating
    [
        "layouts",
        "--convert",
        "flash_attn",
        "flashinfer",
        *("--blocks", "4096", "--block-size"),
        *("4096", "--heads", "4096", "--head-dim", "65536", "--layers", "64"),
    ],
    ["layouts", "--heads", "0"],
    ["layouts", "--block-size", "x"],
    ["layouts", "--dtype", "int4"],
    ["layouts", "--json", "/nonexistent-dir/layouts.json"],
    [*DESC, "--src-layout", "nope"],
    [*DESC, "--dst-layout", "mla"],  # an MHA model's cache in a latent layout
    [*DESC, "--src-layout", "vllm_pth_hnd"],  # an fp8 record for a bfloat16 model
    [*DESC, "--edge", "9:9"],
    [*DESC, "--edge", "1:0"],  # sender 1 sends nothing (its head goes from sender 0)
    [*DESC, "--edge", "x"],
    [*DESC, "--dst-region-bytes", "1000"],  # a region too small for the block ids
    [*DESC, "--check", "list.json"],  # --check without --edge
    [*DESC, "--edge", "0:0", "--check", "/nonexistent-dir/list.json"],
    [*DESC, "--seq-len", "16000000", "--layers", "4096"],
    [*DESC, "--src-block-size", "0"],
    [*DESC, "--dst-block-size", "70000"],
    [*DESC, "--show", "-1"],
    ["desc", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "6"],  # 6 heads over TP4
    [*DESC, "--source-cp", "2", "--cp-rule", "interleave:16", "--src-block-size", "8"],  # CP-2
    ["desc", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--json", "/"],
    ["vectors", "check"],
    ["vectors", "check", "--impl", "nonsense"],
    ["vectors", "check", "--impl", "reference", "/nonexistent-dir"],
    ["vectors", "check", "--impl", "no_such_module:adapter"],
    ["vectors", "export"],
    ["vectors", "export", "/proc/kvspec-vectors"],
    ["vectors", "frobnicate"],
    ["conform", "no_such_module:adapter"],
    ["conform", "nonsense"],
    ["conform", "reference", "--profile", "fast"],
    ["conform", "reference", "--clause", "NOPE-99"],
    ["conform", "reference", "--check", "PLAN-2/exact-cover", "--replay", "{not json"],
    ["conform", "reference", "--check", "PLAN-2/exact-cover", "--replay", "[]"],
    ["conform", "reference", "--check", "PLAN-2/exact-cover", "--replay", "{}"],  # not its example
    ["vectors", "export", "--seed", "-1", "out"],
    ["--version", "extra"],
    ["plan", "--version"],
    ["conform"],
    ["conform", "reference", "--json", "/nonexistent-dir/conform.json"],
    ["conform", "reference", "--device", "tpu"],
    ["clauses", "--nonsense"],
    ["frobnicate"],
    [],
]


def _run(main, argv: list[str]) -> int:
    """The exit status of a command run in this process (argparse exits; ours return)."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2


def _check(main, argv, prog: str, capsys, tmp_path: Path, monkeypatch) -> None:
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # our own: other runs on the host
    started = time.process_time()  # CPU time: other processes on the host never count
    code = _run(main, argv)
    cpu = time.process_time() - started
    out, err = capsys.readouterr()
    shown = " ".join(argv)[:120]
    assert code == 2, f"{shown}: exit {code}\n{out}{err}"
    lines = err.strip().splitlines()
    assert lines, f"{shown}: no message"
    assert lines[0].startswith(f"{prog}"), f"{shown}: {lines[0]!r}"
    assert "Traceback" not in err + out, f"{shown}: a traceback\n{err}"
    assert len(lines[0]) < 600 and len(err) < 4000, f"{shown}: a {len(err)}-character message"
    assert cpu < REFUSAL_CPU_S, f"{shown}: a refusal cost {cpu:.1f} CPU s"
    assert list(work.iterdir()) == [], f"{shown}: left files behind"
    assert list(temp.iterdir()) == [], f"{shown}: left a temporary file behind"
    assert not multiprocess.active_children(), f"{shown}: left processes behind"


def test_there_are_over_150_bad_command_lines() -> None:
    assert len(SIM_LINES) + len(KVSPEC_LINES) > 150


@pytest.mark.parametrize("argv", SIM_LINES, ids=lambda a: " ".join(a)[:60])
def test_sim_refuses(argv, capsys, tmp_path, monkeypatch) -> None:
    _check(sim_main, argv, "python -m sim", capsys, tmp_path, monkeypatch)


@pytest.mark.parametrize("argv", KVSPEC_LINES, ids=lambda a: " ".join(a)[:60])
def test_kvspec_refuses(argv, capsys, tmp_path, monkeypatch) -> None:
    _check(kvspec_main, argv, "kvspec", capsys, tmp_path, monkeypatch)


def test_refusals_name_the_value_and_the_limit(capsys) -> None:
    code = _run(sim_main, [*RUN, *OK, "--requests", "1000001"])
    err = capsys.readouterr().err
    assert code == 2 and "--requests" in err and "1..100000" in err and "1000001" in err
    code = _run(sim_main, [*RUN, *OK, "--faults", "kill=sender:99@0.5"])
    err = capsys.readouterr().err
    assert code == 2 and "kill=sender:99@0.5" in err and "ranks 0..3" in err
    code = _run(
        kvspec_main,
        [
            "layouts",
            "--convert",
            "flash_attn",
            "kv_tuple",
            *("--blocks", "4096", "--block-size"),
            *("4096", "--heads", "64", "--head-dim", "128"),
        ],
    )
    err = capsys.readouterr().err
    kv_bytes = 2 * 4096 * 4096 * 64 * 128 * 2  # K and V, blocks, slots, heads, dim, bfloat16
    assert code == 2 and f"{kv_bytes:,} bytes" in err and f"at most {1 << 28:,}" in err
    code = _run(kvspec_main, ["ports", "--stage", "tp=1e9"])
    err = capsys.readouterr().err
    assert code == 2 and "tp" in err and "'1e9'" in err and "1..4096" in err
