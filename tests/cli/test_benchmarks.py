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


def test_markdown_marks_figures_below_the_goal(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/benchmarks.md's tables come from a run: every figure a row, the layout pairs a
    matrix."""
    from benchmarks.__main__ import GOAL, render_markdown
    from benchmarks.figure import Figure

    slow = Figure("convert flash_attn->kv_tuple", "GB/s", 1.0, 2.0, "memcpy", GOAL / 2)
    fast = Figure("scatter into flashinfer, block 32", "GB/s", 2.0, 2.0, "memcpy", 1.0)
    count = Figure("desc/1k tok", "count", 4000.0)
    table = render_markdown([slow, fast, count])
    assert "| scatter into flashinfer, block 32 | 2 GB/s |" in table and "| 1.00 |" in table
    assert "| desc/1k tok | 4e+03 count |" in table
    assert "| flash_attn |" in table and "0.40 ✗" in table, "a pair is a cell of the matrix"
    assert "convert flash_attn->kv_tuple |" not in table.split("| from")[0]


def test_a_reference_figure_is_never_held_to_the_goal() -> None:
    """A floor or a parser against json.loads shows its ratio but is not marked below goal."""
    from benchmarks.__main__ import GOAL, render_markdown
    from benchmarks.figure import Figure

    floor = Figure(
        "floor: 256 B runs, shuffled", "GB/s", 1.0, 2.0, "memcpy", GOAL / 2, reference=True
    )
    path = Figure("gather from flash_attn_hnd, block 16", "GB/s", 1.0, 2.0, "memcpy", GOAL / 2)
    rows = render_markdown([floor, path]).splitlines()
    assert "| 0.40 |" in rows[2] and "✗" not in rows[2]
    assert "| 0.40 ✗ |" in rows[3]


def test_the_floor_orders_are_permutations_of_whole_runs() -> None:
    """Each floor copies every run exactly once; the transpose order reads a block's runs
    head by head, as a NHD -> HND conversion does."""
    import torch

    from benchmarks.access import HEADS, SLOTS, orders

    runs = 4 * SLOTS * HEADS
    found = orders(runs)
    for index in found.values():
        assert torch.equal(index.sort().values, torch.arange(runs))
    transpose = next(i for name, i in found.items() if name.startswith("NHD"))
    nhd = torch.arange(runs).view(-1, SLOTS, HEADS)  # run id of (block, slot, head)
    assert transpose[:SLOTS].tolist() == [int(nhd[0, slot, 0]) for slot in range(SLOTS)]
    assert transpose[SLOTS].item() == nhd[0, 0, 1].item()
    assert not torch.equal(found["shuffled"], torch.arange(runs))


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
