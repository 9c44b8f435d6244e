"""Layouts as values [LAYOUT-1, LAYOUT-5]: configurations and caches carry the
:class:`CacheLayout`, a name is resolved only where input is parsed, reading a layout file
registers nothing, and each layout fact is one property of the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.memory.cache_layout import PRESETS, get_layout
from kvspec.memory.descriptors import RegisteredCache
from kvspec.memory.layout_files import layout_to_data
from kvspec.memory.paged import empty_paged_cache
from kvspec.memory.records import cell_bytes
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.run.config import SimConfig
from tests.layout_lookups import BOUNDARIES, boundary_files, lookups_in, package_lookups
from tests.paths import ROOT

MODEL = ModelShape(num_layers=2, num_kv_heads=2, head_dim=8)


def test_the_package_looks_no_layout_up_by_name_outside_its_parse_boundaries() -> None:
    found = package_lookups()
    assert not found, "layouts looked up by name outside the parse boundaries:\n" + "\n".join(
        map(str, found)
    )


def test_every_declared_boundary_exists() -> None:
    """The allow-list names real files and folders: a moved boundary is not silently kept."""
    missing = [str(p.relative_to(ROOT)) for p in boundary_files() if not p.exists()]
    assert not missing and len(BOUNDARIES) <= 15


def test_a_planted_lookup_is_found() -> None:
    """A name carried into a real module and resolved there is found; what is declared is
    not: a literal preset name, a ``LayoutRef`` parameter, the model presets' table."""
    path = "kvspec/memory/paged.py"
    source = (ROOT / path).read_text()
    assert lookups_in(source, path) == []
    planted = source + (
        "\n\ndef planted_layer_layout(cache: PagedCache, name: str) -> CacheLayout:\n"
        "    return get_layout(name).layer_layout\n"
    )
    found = lookups_in(planted, path)
    assert [(f.line, f.code) for f in found] == [
        (planted.count("\n"), "get_layout(name)"),
    ]
    tables = (
        "from kvspec.memory.presets import PRESETS as P\n"
        "from kvspec.topology.model_presets import PRESETS\n"
        "from kvspec.memory.cache_layout import LayoutRef, get_layout\n"
        "def a(name: str):\n    return P[name]\n"
        "def b(name: str):\n    return P.get(name)\n"
        "def c():\n    return P['flash_attn']\n"
        "def d(ref: LayoutRef):\n    return get_layout(ref)\n"
        "def e(name: str):\n    return PRESETS[name]\n"
        "def f(example: dict):\n    return get_layout(example['layout'])\n"
    )
    assert [f.code for f in lookups_in(tables, "x.py")] == [
        "P[name]",
        "P.get(name)",
        "get_layout(example['layout'])",
    ]


def _user_file(tmp_path: Path, name: str, base: str = "vllm_packed_hnd") -> Path:
    data = {**layout_to_data(PRESETS[base]), "name": name}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_reading_a_layout_file_registers_nothing(tmp_path: Path) -> None:
    path = _user_file(tmp_path, "spec_values_user")
    layout = get_layout(str(path))
    assert layout.ref == str(path) and layout.origin == str(path)
    with pytest.raises(ValueError, match=r"unknown cache layout 'spec_values_user'"):
        get_layout("spec_values_user")
    assert get_layout(layout) is layout  # a value is its own


def test_a_sim_config_carries_values_and_writes_them_back_as_it_read_them(
    tmp_path: Path,
) -> None:
    path = _user_file(tmp_path, "spec_values_sim", base="sglang_mha")
    stages = (StageLayout(2), StageLayout(1))
    config = SimConfig(
        stages=stages,
        model=MODEL,
        src_layout=PRESETS["vllm_packed_hnd"],
        dst_layout=get_layout(str(path)),
    )
    form = config.to_dict()
    assert (form["src_layout"], form["dst_layout"]) == ("vllm_packed_hnd", str(path))
    back = SimConfig.from_dict(json.loads(json.dumps(form)))  # as a rank process gets it
    assert back == config and back.dst_layout.ref == str(path)
    assert back.to_dict() == form
    with pytest.raises(TypeError, match=r"SimConfig.src_layout is a CacheLayout value"):
        SimConfig(stages=stages, model=MODEL, src_layout="flash_attn")  # type: ignore[arg-type]


def test_a_registered_cache_carries_its_value(tmp_path: Path) -> None:
    layout = get_layout(str(_user_file(tmp_path, "spec_values_reg")))
    cache = RegisteredCache(layout, 2, 4, 4, 2, 8, "bfloat16")
    assert cache.layout is layout and cache.to_dict()["layout"] == layout.ref
    assert RegisteredCache.from_dict(cache.to_dict()) == cache
    with pytest.raises(TypeError, match=r"RegisteredCache.layout is a CacheLayout value"):
        RegisteredCache("flash_attn", 2, 4, 4, 2, 8, "bfloat16")  # type: ignore[arg-type]


def test_a_paged_cache_holds_the_value_it_was_made_with(tmp_path: Path) -> None:
    """A file's cross-layer layout, never registered by name, still reads layer by layer:
    the cache holds the value, and the value its per-layer layout."""
    path = _user_file(tmp_path, "spec_values_layers", base="vllm_packed_nhd_layers")
    layout = get_layout(str(path))
    cache = empty_paged_cache(
        layout, num_layers=2, num_blocks=3, block_size=4, heads=2, head_dim=8, dtype="bfloat16"
    )
    assert cache.layout is layout and cache.layer_layout is PRESETS["vllm_packed_nhd"]
    assert cache.shape.num_blocks == 3 and cache.shape.block_size == 4


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_layout_fact_is_a_property_of_the_value(name: str) -> None:
    layout = PRESETS[name]
    # a token pool's page size is stated: its shape does not hold it [LAYOUT-5]
    assert layout.page_size(16) == (16 if "tokens" in layout.axes else None)
    # a cross-layer layout reads each layer as its per-layer preset's value
    per_layer = layout.per_layer
    assert layout.layer_layout is (layout if per_layer is None else PRESETS[per_layer])
    kv = layout.kv_tensors or 2
    assert layout.tensors() == kv and layout.tensors(1) == (layout.kv_tensors or 1)
    if layout.plain:  # K and V (or a latent) of head_dim elements of the cache's dtype
        assert layout.cell_bytes("bfloat16", 64, kv) == kv * 64 * 2
        assert layout.cell_bytes("float32", 8, kv) == kv * 8 * 4


def test_a_record_cell_counts_its_inline_scales() -> None:
    """vLLM's per-token-head fp8 record: each of K and V is head_dim fp8 values and a float32
    scale [LAYOUT-6]; the records module counts the same through the value."""
    layout = PRESETS["vllm_pth_hnd"]
    assert layout.cell_bytes("float8_e4m3fn", 64) == 2 * (64 + 4)
    model = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64, dtype="float8_e4m3fn")
    assert cell_bytes(layout, model) == 2 * (64 + 4)
