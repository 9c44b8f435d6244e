"""Golden vectors: byte-identical export, the shipped copy up to date, replayable through
adapters, and a malformed vector set refused with a message instead of a traceback."""

import json
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance import load_adapter
from kvspec.conformance.mutants.routing import ReplicasMergedTwice
from kvspec.conformance.mutants.transfer import OffByOneHeadOffset
from kvspec.conformance.vectors import (
    GOLDEN_DIR,
    MANIFEST_FILE,
    VectorsError,
    check_vectors,
    export_vectors,
    load_vectors,
)


def test_export_is_byte_identical_and_matches_the_shipped_vectors(tmp_path: Path) -> None:
    a, b = export_vectors(tmp_path / "a"), export_vectors(tmp_path / "b")
    for name in ("manifest.json", "tensors.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() == (GOLDEN_DIR / name).read_bytes(), "run: make vectors"


def test_the_reference_passes_every_vector() -> None:
    results = check_vectors(GOLDEN_DIR, load_adapter("reference"))
    assert {r.verdict for r in results if r.family != "errors"} == {"passed"}
    assert [r for r in results if r.verdict == "FAILED"] == []


def test_mutants_fail_the_vectors() -> None:
    for mutant, family in ((OffByOneHeadOffset, "reshard"), (ReplicasMergedTwice, "plan")):
        failed = {r.family for r in check_vectors(GOLDEN_DIR, mutant()) if r.verdict == "FAILED"}
        assert family in failed, mutant.__name__


def test_cli_checks_the_installed_vectors_by_default(tmp_path: Path, capsys) -> None:
    assert main(["vectors", "check", "--impl", "reference"]) == 0
    assert (
        main(
            ["vectors", "check", "--impl", "kvspec.conformance.mutants.transfer:OffByOneHeadOffset"]
        )
        == 1
    )
    assert main(["vectors", "check", str(tmp_path), "--impl", "reference"]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_cli_json_to_stdout(capsys) -> None:
    assert main(["vectors", "check", "--impl", "reference", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {"family", "case_id", "verdict", "detail"} <= set(rows[0])


def test_each_action_has_its_own_help(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["vectors", "check", "--help"])
    text = capsys.readouterr().out
    assert "--impl" in text and "--seed" not in text


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "v"
    out.mkdir()
    for name in ("manifest.json", "tensors.safetensors"):
        (out / name).write_bytes((GOLDEN_DIR / name).read_bytes())
    return out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: "[1, 2]", "must be a JSON object"),
        (lambda m: "{not json", "cannot read a JSON manifest"),
        (lambda m: json.dumps({**m, "version": 99}), "is not kvspec-golden-vectors version"),
        (lambda m: json.dumps({**m, "families": []}), "'families' must map"),
        (lambda m: json.dumps({**m, "families": {"plan": [{"no": "id"}]}}), "'families' must map"),
        (lambda m: json.dumps({**m, "tensors_file": "../x"}), "'tensors_file' must name"),
        (lambda m: json.dumps({**m, "tensors_file": 7}), "'tensors_file' must name"),
        (lambda m: "[" * 100_000, "cannot read a JSON manifest"),
    ],
)
def test_malformed_manifests_are_refused(tmp_path: Path, damage, message) -> None:
    root = _copy(tmp_path)
    manifest = json.loads((root / MANIFEST_FILE).read_text())
    (root / MANIFEST_FILE).write_text(damage(manifest))
    with pytest.raises(VectorsError, match=message):
        load_vectors(root)


def test_a_damaged_tensor_file_is_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "tensors.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(VectorsError, match="cannot read tensors"):
        load_vectors(root)
