"""`kvspec layouts --which SHAPE...`: every layout a cache of that shape could be, with
what it holds under each, so that layouts of identical shapes are seen together
[LAYOUT-4, LAYOUT-5]."""

from __future__ import annotations

import json

import pytest

from kvspec.cli import main
from kvspec.memory.cache_layout import CacheShape, detect_layout, empty_cache
from kvspec.memory.layout_readings import readings


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_two_heads_and_two_blocks_read_as_hnd_and_lhbnc(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "layouts", "--which", "2x2x16x16", "--heads", "2", "--head-dim", "8")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "a cache of a tensor [2, 2, 16, 16] (bfloat16, heads 2, head_dim 8) could be 2 layouts "
        "[LAYOUT-4]:"
    )
    assert lines[1].split() == [
        "vllm_packed_hnd",
        "2",
        "blocks",
        "of",
        "16,",
        "2",
        "heads",
        "x",
        "8",
    ]
    assert lines[2].split()[0] == "vllm_packed_lhbnc"
    assert "name the layout" in lines[3]
    code, out, _ = run(capsys, "layouts", "--which", "2x2x16x16", "--heads", "2", "--json", "-")
    names = [r["name"] for r in json.loads(out)["layouts"]]
    assert names == ["vllm_packed_hnd", "vllm_pth_hnd", "vllm_packed_lhbnc"]  # pth: fp8 records


def test_the_listing_agrees_with_detection() -> None:
    """Detection answers exactly when the per-layer readings are one [LAYOUT-4]."""
    for name, shape in (
        ("flash_attn", CacheShape(2, 3, 4, 2, 8)),
        ("vllm_packed_hnd", CacheShape(2, 2, 4, 2, 8)),
        ("sglang_mha", CacheShape(2, 4, 4, 3, 8)),
    ):
        cache = empty_cache(name, shape, "bfloat16", "meta")
        tensors = cache if isinstance(cache, tuple) else (cache,)
        found = readings([list(t.shape) for t in tensors], heads=shape.heads, head_dim=8)
        per_layer = [r.layout for r in found if r.shape.layers == 1 and r.dtype == "bfloat16"]
        assert name in per_layer
        try:
            assert [detect_layout(cache, heads=shape.heads, head_dim=8)] == per_layer
        except ValueError as error:
            assert len(per_layer) > 1 and all(n in str(error) for n in per_layer)


def test_a_cross_layer_shape_lists_its_readings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "layouts", "--which", "4x2x2x2x16x8", "--head-dim", "8")
    assert code == 0
    assert "  trtllm_pool" in out and "2 layers" in out
    assert "  sglang_host_page_head" not in out  # its K/V axis is first: 4 is not 2


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--which", "3x3"], "fits no cache layout"),
        (["--which", "2y3"], "expected a shape such as 2x16x4x8"),
        (["--which", "1x2x3x4x5x6x7x8x9"], "1 to 8 sizes"),
    ],
)
def test_a_shape_that_fits_nothing_or_is_no_shape_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    try:
        code = main(["layouts", *argv])
    except SystemExit as exited:
        code = int(exited.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.splitlines()) == 1
