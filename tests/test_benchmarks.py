"""The benchmark runner works and reports every speed with its same-run baseline.

Speeds are not asserted here (they are measured, not tested); this keeps the runner
and the fast benchmarks from rotting.
"""

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import main


def test_quick_run_of_the_fast_benchmarks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures.json"
    argv = ["--quick", "--only", "reshard", "--only", "codec", "--repeat", "3", "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["repeat"] == 3
    figures = data["figures"]
    assert len(figures) >= 4
    for figure in figures:
        assert figure["name"] in table and figure["value"] > 0
        if figure["unit"] == "GB/s":
            assert figure["baseline"] > 0 and figure["baseline_name"]
            assert figure["ratio"] == pytest.approx(figure["value"] / figure["baseline"], rel=1e-6)
            low, high = figure["value_range"]
            assert low <= figure["value"] <= high and figure["repeats"] == 3


def test_interleaving_alternates_and_counts_every_run() -> None:
    """Both sides run equally often, alternating who goes first, after one warmup each."""
    from benchmarks.figure import interleaved

    order: list[str] = []
    mine, theirs = interleaved(lambda: order.append("m"), lambda: order.append("b"), repeat=4)
    assert order == ["m", "b", "m", "b", "b", "m", "m", "b", "b", "m"]
    assert mine.low <= mine.median <= mine.high and theirs.low <= theirs.median <= theirs.high


def test_the_descriptor_table_counts_ranges_per_block() -> None:
    """Same layout and heads on both sides, shuffled blocks of 16: one range per block and
    layer; one cross-layer tensor needs one per block (1024 tokens = 64 blocks)."""
    from benchmarks.descriptors import descriptors_per_1k

    same = descriptors_per_1k("vllm_packed_hnd", "vllm_packed_hnd", 1, 1, layers=2)
    assert same == 2 * 64 * 1000 / 1024
    cross = descriptors_per_1k("vllm_packed_hnd_layers", "vllm_packed_hnd_layers", 1, 1, layers=2)
    assert cross == 64 * 1000 / 1024
