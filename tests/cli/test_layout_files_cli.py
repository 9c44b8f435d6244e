"""A user's layout file wherever a preset name is taken: `kvspec layouts FILE`, `kvspec
desc --src-layout FILE`, `python -m sim run --src-layout FILE`; a bad file is refused
with exit status 2 and one line naming the file, the field and why [LAYOUT-5]."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main as kvspec_main
from kvspec.memory.layout_files import layout_to_data
from kvspec.memory.presets import PRESETS
from sim.cli import main as sim_main
from tests.user_layouts import engine_hnd

LAYOUT: dict[str, Any] = engine_hnd("cli_engine_hnd")


@pytest.fixture
def layout_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(LAYOUT, indent=2))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = kvspec_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_kvspec_layouts_shows_a_file_in_full(
    capsys: pytest.CaptureFixture[str], layout_file: Path
) -> None:
    code, out, err = run(capsys, "layouts", str(layout_file))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"cli_engine_hnd  {LAYOUT['shape']}"
    assert "  logical axes    [blocks, slots, heads, dim] (stride order (0, 2, 1, 3))" in lines
    assert "  K and V         packed in the last axis" in lines
    assert "  source          an-engine 2.1: engine/cache.py: allocate_kv" in lines
    assert "  not confirmed   the page padding" in lines
    code, out, _ = run(capsys, "layouts", str(layout_file), "--json", "-")
    report = json.loads(out)
    assert report["name"] == "cli_engine_hnd" and report["stride_order"] == [0, 2, 1, 3]
    assert report["source"] == {**LAYOUT["source"]}


def test_kvspec_layouts_converts_a_file_to_a_preset_and_back(
    capsys: pytest.CaptureFixture[str], layout_file: Path
) -> None:
    code, out, err = run(capsys, "layouts", "--convert", str(layout_file), "vllm_packed_nhd")
    assert code == 0, err
    assert "convert cli_engine_hnd -> vllm_packed_nhd" in out and "bit-identical" in out


def test_kvspec_layouts_shows_a_state_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from kvspec.memory.presets import STATE_PRESETS

    data = {**layout_to_data(STATE_PRESETS["vllm_conv_ds"]), "name": "cli_conv"}
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(data))
    code, out, err = run(capsys, "layouts", str(path))
    assert code == 0, err
    assert out.startswith("cli_conv  per block: conv [dim, state_len]")


def test_kvspec_desc_takes_a_file_as_either_side(
    capsys: pytest.CaptureFixture[str], layout_file: Path
) -> None:
    common = ["desc", "--source-tp", "2", "--target-tp", "1", "--kv-heads", "2", "--layers", "2"]
    code, out, err = run(
        capsys, *common, "--seq-len", "64", "--src-layout", str(layout_file), "--json", "-"
    )
    assert code == 0, err
    by_file = json.loads(out)
    # the file is vllm_packed_hnd's bytes: the same descriptors, edge for edge
    code, out, _ = run(
        capsys, *common, "--seq-len", "64", "--src-layout", "vllm_packed_hnd", "--json", "-"
    )
    by_preset = json.loads(out)
    assert by_file["edges"] == by_preset["edges"]
    assert by_file["totals"] == by_preset["totals"]


def test_sim_runs_a_file_against_a_preset_and_verifies(
    capsys: pytest.CaptureFixture[str], layout_file: Path
) -> None:
    argv = ["run", "--quiet", "--ports", "os", "--source-tp", "2", "--target-tp", "1"]
    argv += ["--kv-heads", "2", "--requests", "2", "--src-layout", str(layout_file)]
    assert sim_main([*argv, "--dst-layout", "sglang_mha"]) == 0
    out = capsys.readouterr().out
    assert "requests: 2 verified, 0 failed, of 2 — ALL VERIFIED" in out
    assert str(layout_file) in out  # the report names the caches as they were given


def test_sim_pulls_from_a_file_into_a_file(
    capsys: pytest.CaptureFixture[str], layout_file: Path, tmp_path: Path
) -> None:
    other = {**layout_to_data(PRESETS["sglang_mha_hnd"]), "name": "cli_pool_hnd"}
    (tmp_path / "pool.json").write_text(json.dumps(other))
    argv = ["run", "--quiet", "--ports", "os", "--source-tp", "2", "--target-tp", "1"]
    argv += ["--kv-heads", "2", "--requests", "2", "--transfer", "pull"]
    argv += ["--src-layout", str(layout_file), "--dst-layout", str(tmp_path / "pool.json")]
    assert sim_main(argv) == 0
    assert "ALL VERIFIED" in capsys.readouterr().out


DESC = ["desc", "--source-tp", "2", "--target-tp", "1", "--kv-heads", "4"]


def _bad(**changes: Any) -> dict[str, Any]:
    return {**LAYOUT, **changes}


BAD_FILES = [
    (
        "axes-twice",
        _bad(axes=["blocks", "slots", "slots", "dim"]),
        "field 'axes' names 'slots' twice",
    ),
    ("typo-field", _bad(stride=[0, 1]), "field 'stride' is not a field of a cache layout"),
    (
        "kv-axis-and-record",
        _bad(
            axes=["kv", "blocks", "heads", "slots", "dim"],
            logical=["kv", "blocks", "slots", "heads", "dim"],
        ),
        "field 'record' is given, but K and V are on a 'kv' axis",
    ),
    (
        "preset-name",
        _bad(name="vllm_packed_nhd", logical=LAYOUT["axes"]),
        "field 'name' is 'vllm_packed_nhd'",
    ),
    (
        "layers-no-preset",
        _bad(
            axes=["blocks", "layers", "heads", "slots", "dim"],
            logical=["layers", "blocks", "heads", "slots", "dim"],
        ),
        "field 'per_layer' is missing",
    ),
    ("unknown-dtype", _bad(dtypes=["int4"]), "field 'dtypes[0]' is 'int4'"),
]


@pytest.mark.parametrize(
    ("data", "says"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
@pytest.mark.parametrize("command", ["layouts", "desc", "sim"])
def test_a_bad_file_is_refused_in_one_line_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Any, says: str, command: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    if command == "layouts":
        code = kvspec_main(["layouts", str(path)])
    elif command == "desc":
        code = kvspec_main([*DESC, "--src-layout", str(path)])
    else:
        with pytest.raises(SystemExit) as exited:
            sim_main(
                ["run", "--quiet", "--ports", "os", "--kv-heads", "4", "--src-layout", str(path)]
            )
        code = int(exited.value.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and not out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "refused: " in lines[0] and f"layout file {path}: {says}" in lines[0], lines[0]


def test_a_file_that_cannot_hold_the_model_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fp8 = {**layout_to_data(PRESETS["vllm_pth_hnd"]), "name": "cli_fp8_records"}
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps(fp8))
    code = sim_main(
        ["run", "--quiet", "--ports", "os", "--kv-heads", "4", "--src-layout", str(path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"--src-layout {path} cannot hold" in err.splitlines()[0]
    assert "holds float8_e4m3fn caches, not bfloat16" in err
    code = kvspec_main([*DESC[:-2], "--attention", "mla", "--src-layout", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "cannot hold a mla model's cache" in err


def test_a_k_and_v_file_for_an_mla_model_is_refused_naming_kv_tensors(
    capsys: pytest.CaptureFixture[str], layout_file: Path
) -> None:
    argv = ["run", "--quiet", "--ports", "os", "--attention", "mla", "--source-tp", "2"]
    assert sim_main([*argv, "--target-tp", "1", "--src-layout", str(layout_file)]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert f"cache layout '{layout_file}' cannot hold an mla cache: its kv_tensors is 2" in first


ENTRY_POOL: dict[str, Any] = {
    "kind": "cache",
    "name": "user_entry_pool",
    "shape": "[slots, layers, 2, heads, head_dim]: one entry per token slot",
    "axes": ["tokens", "layers", "kv", "heads", "dim"],
    "kv_tensors": 2,
    "tuple_form": False,
    "per_layer": "sglang_mha",
    "source": {
        "project": "a-user",
        "file": "pool.py: allocate",
        "version": "0.1",
        "confirmed": "every layer's K then V row inside one entry per token slot",
    },
}


def test_a_users_file_round_trips_through_layouts_desc_and_a_sim_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 33's done-when: one layout file, written by hand (a cross-layer token pool whose
    layers are tuples, as SGLang's page-major pool), read back as written, shown, converted
    and back bit for bit, planned into the same descriptors as the preset of its bytes, and
    moved by the sim both ways with every element verified [LAYOUT-5, DESC-1, ORACLE-5]."""
    from kvspec.memory.layout_files import dumps
    from kvspec.memory.layout_refs import read_file

    path = tmp_path / "entry_pool.json"
    path.write_text(json.dumps(ENTRY_POOL, indent=2))
    layout = read_file(path)
    assert json.loads(dumps(layout)) == ENTRY_POOL  # the file is the value, and back

    code, out, err = run(capsys, "layouts", str(path), "--json", "-")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["name"] == "user_entry_pool" and shown["physical_axes"] == ENTRY_POOL["axes"]
    code, out, err = run(capsys, "layouts", "--convert", str(path), "sglang_host_page_first")
    assert code == 0, err
    assert "bit-identical" in out

    common = ["desc", "--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--layers", "2"]
    common += ["--seq-len", "40", "--dst-layout", "vllm_packed_hnd", "--json", "-"]
    code, out, err = run(capsys, *common, "--src-layout", str(path))
    assert code == 0, err
    by_file = json.loads(out)
    code, out, err = run(capsys, *common, "--src-layout", "sglang_page_major")
    assert code == 0, err
    by_preset = json.loads(out)  # the same bytes as SGLang's page-major pool
    assert by_file["edges"] == by_preset["edges"] and by_file["totals"] == by_preset["totals"]
    assert by_file["totals"]["descriptors"] > 0

    for transfer in ("push", "pull"):
        argv = ["run", "--quiet", "--ports", "os", "--source-tp", "4", "--target-tp", "2"]
        argv += ["--kv-heads", "4", "--requests", "2", "--transfer", transfer]
        argv += ["--src-layout", str(path), "--dst-layout", str(path)]
        assert sim_main(argv) == 0, transfer
        out = capsys.readouterr().out
        assert "requests: 2 verified, 0 failed, of 2 — ALL VERIFIED" in out, transfer


def test_an_unknown_layout_name_is_refused_with_the_nearest_presets_and_a_short_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """27 presets no longer fit one line: the refusal names the first ten, how many more
    and where they are listed, and the presets a typo is nearest to."""
    argv = ["run", "--quiet", "--ports", "os", "--kv-heads", "2"]
    with pytest.raises(SystemExit) as exited:
        sim_main([*argv, "--src-layout", "sglang_page_majr"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean sglang_page_major or " in err  # the nearest first
    assert f"and {len(PRESETS) - 10} more (every preset: kvspec layouts)" in err
    assert len(err.splitlines()[0]) < 600
