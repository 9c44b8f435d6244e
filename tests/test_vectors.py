"""Golden vectors: byte-identical export, committed copy up to date, replayable through adapters."""

from pathlib import Path

from kvspec.cli import main
from kvspec.conformance import load_adapter
from kvspec.conformance.mutants.routing import ReplicasMergedTwice
from kvspec.conformance.mutants.transfer import OffByOneHeadOffset
from kvspec.conformance.vectors import check_vectors, export_vectors

ROOT = Path(__file__).resolve().parent.parent


def test_export_is_byte_identical_and_matches_the_committed_vectors(tmp_path: Path) -> None:
    a, b = export_vectors(tmp_path / "a"), export_vectors(tmp_path / "b")
    for name in ("manifest.json", "tensors.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() == (ROOT / "vectors" / name).read_bytes(), (
            "run: kvspec vectors export vectors"
        )


def test_the_reference_passes_every_vector() -> None:
    results = check_vectors(ROOT / "vectors", load_adapter("reference"))
    assert {r.verdict for r in results if r.family != "errors"} == {"passed"}
    assert [r for r in results if r.verdict == "FAILED"] == []


def test_mutants_fail_the_vectors() -> None:
    for mutant, family in ((OffByOneHeadOffset, "reshard"), (ReplicasMergedTwice, "plan")):
        failed = {
            r.family for r in check_vectors(ROOT / "vectors", mutant()) if r.verdict == "FAILED"
        }
        assert family in failed, mutant.__name__


def test_cli(tmp_path: Path, capsys) -> None:
    assert main(["vectors", "check", str(ROOT / "vectors"), "--impl", "reference"]) == 0
    assert (
        main(
            [
                "vectors",
                "check",
                str(ROOT / "vectors"),
                "--impl",
                "kvspec.conformance.mutants.transfer:OffByOneHeadOffset",
            ]
        )
        == 1
    )
    assert main(["vectors", "check", str(tmp_path), "--impl", "reference"]) == 2
    assert "manifest.json" in capsys.readouterr().err
