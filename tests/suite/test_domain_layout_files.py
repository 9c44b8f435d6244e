"""An adapter's domain may name a layout file where it names a preset: the layout
checks draw it and judge the adapter on it as on a preset [LAYOUT-1, LAYOUT-5]."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.conformance import Domain
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, get_check, run_check
from kvspec.memory.layout_files import layout_to_data
from kvspec.memory.presets import PRESETS

pytestmark = pytest.mark.usefixtures("ci_profile")


def _file(tmp_path: Path) -> str:
    data = {**layout_to_data(PRESETS["vllm_packed_nhd"]), "name": "domain_engine_nhd"}
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("check_id", ["LAYOUT-1/read-named", "LAYOUT-3/convert"])
def test_a_layout_file_in_the_domain_is_checked_like_a_preset(
    tmp_path: Path, check_id: str
) -> None:
    path = _file(tmp_path)
    domain = Domain(layouts=(path, "flash_attn"))

    class OnAFile(ReferenceAdapter):
        pass

    OnAFile.domain = domain

    assert domain.cache_layouts("mha") == (path, "flash_attn")
    result = run_check(get_check(check_id), OnAFile())
    assert result.verdict == PASSED, result


def test_a_bad_layout_file_in_the_domain_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**layout_to_data(PRESETS["flash_attn"]), "name": "x", "axes": []}))
    with pytest.raises(ValueError, match=r"bad.json: field 'axes' is \[\]"):
        Domain(layouts=(str(path),))


def test_an_adapter_that_misreads_the_file_s_layout_is_caught(tmp_path: Path) -> None:
    path = _file(tmp_path)

    class SwapsKV(ReferenceAdapter):
        domain = Domain(layouts=(path,))

        def read_layer(self, cache, layout, **known):  # type: ignore[no-untyped-def]
            got = super().read_layer(cache, layout, **known)
            return tuple(reversed(got)) if layout == path else got

    result = run_check(get_check("LAYOUT-1/read-named"), SwapsKV())
    assert result.verdict == FAILED
    assert f"a {path} " in str(result.reason) and "[LAYOUT-1.1]" in str(result.reason)


def test_the_domain_parses_its_layout_names_once_and_hands_values(tmp_path: Path) -> None:
    """A file in the domain is read when the domain is declared: a later change to the file
    changes nothing the suite draws from it; a name outside the domain is refused with the
    domain's names [LAYOUT-1, LAYOUT-5]."""
    path = _file(tmp_path)
    domain = Domain(layouts=(path, "flash_attn"))
    assert domain.layout(path).name == "domain_engine_nhd"
    assert domain.layout("flash_attn") is PRESETS["flash_attn"]
    Path(path).write_text("{not json")
    assert domain.layout(path).name == "domain_engine_nhd"
    assert domain.plain_layouts() == (path, "flash_attn")
    with pytest.raises(ValueError, match=r"'vllm_mla' is not in the domain; it has \['"):
        domain.layout("vllm_mla")
