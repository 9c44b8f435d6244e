"""`kvspec conform IMPL` when IMPL does not name a loadable adapter: exit 2, one first line
saying what is wrong, the next ones how to fix it, no traceback, and never kvspec's own
file given as the place of the error."""

import sys
from pathlib import Path

import pytest

import kvspec.conformance.adapter as adapter_module
from kvspec.cli import main

KVSPEC_LOADER = str(Path(adapter_module.__file__).parent)
"""The adapter package (its loading, capability checks and base class): never the place
of a user's error."""

ADAPTERS = """\
from kvspec.conformance.reference import ReferenceAdapter


class MyAdapter(ReferenceAdapter):
    pass


adapter = MyAdapter()
spare = MyAdapter()
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory; sys.path and the modules imported are put back after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _refused(capsys, *argv: str) -> list[str]:
    """The lines ``kvspec conform ARGV`` writes to stderr, after checking it exits 2
    without a traceback and without pointing at kvspec's loader."""
    assert main(["conform", *argv]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert KVSPEC_LOADER not in err, err
    lines = err.splitlines()
    assert lines and lines[0].startswith(f"kvspec conform: cannot use {argv[0]}: "), err
    return lines


def test_a_module_without_attr_suggests_its_adapters(workdir: Path, capsys) -> None:
    (workdir / "myconn_adapter.py").write_text(ADAPTERS)
    (first,) = _refused(capsys, "myconn_adapter")
    assert "did you mean myconn_adapter:adapter?" in first
    assert "(Adapter objects in it: adapter, spare, MyAdapter)" in first


def test_a_module_without_attr_or_adapters_says_so(workdir: Path, capsys) -> None:
    (workdir / "plain.py").write_text("x = 1\n")
    (first,) = _refused(capsys, "plain")
    assert "names a module, not the adapter in it: give MODULE:ATTR" in first
    assert "plain holds no Adapter instance or subclass" in first


def test_a_module_not_on_the_path_says_where_python_looked(workdir: Path, capsys) -> None:
    first, *rest = _refused(capsys, "missing_adapter:adapter")
    assert first.endswith(
        "cannot import 'missing_adapter': no module 'missing_adapter' on sys.path"
    )
    assert f"  current directory: {workdir}" in rest
    (shown,) = [line for line in rest if line.startswith("  sys.path: ")]
    assert str(workdir) in shown and sys.path[1] in shown
    (fix,) = [line for line in rest if line.startswith("  fix: ")]
    assert "run from the directory that holds missing_adapter.py" in fix
    assert "PYTHONPATH=DIR" in fix and "missing_adapter:adapter" in fix


def test_a_module_one_directory_down_is_pointed_at_and_the_hint_works(
    workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / "adapters").mkdir()
    (workdir / "adapters" / "nearby_adapter.py").write_text(ADAPTERS)
    lines = _refused(capsys, "nearby_adapter:adapter")
    assert "  found nearby: adapters/nearby_adapter.py (PYTHONPATH=adapters ...)" in lines
    monkeypatch.syspath_prepend(str(workdir / "adapters"))  # what PYTHONPATH=adapters does
    assert main(["conform", "nearby_adapter:adapter", "--clause", "PLAN-3", "--quiet"]) == 0


def test_a_package_without_the_module_lists_what_it_holds(workdir: Path, capsys) -> None:
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "__init__.py").write_text("")
    (workdir / "pkg" / "mine.py").write_text(ADAPTERS)
    first, *rest = _refused(capsys, "pkg.mien:adapter")
    assert first.endswith(f"package 'pkg' ({workdir / 'pkg'}) has no module 'mien'")
    assert rest == ["  modules in pkg: mine"]


def test_a_missing_package_is_named_as_the_missing_part(workdir: Path, capsys) -> None:
    first, *rest = _refused(capsys, "nopkg.mine:adapter")
    assert first.endswith("no module 'nopkg' on sys.path (needed for 'nopkg.mine')")
    assert any("run from the directory that holds nopkg/" in line for line in rest)


def test_a_dependency_missing_inside_the_module_points_at_its_line(workdir: Path, capsys) -> None:
    (workdir / "needs_engine.py").write_text("import os\nimport no_such_engine_xyz\n")
    (first,) = _refused(capsys, "needs_engine:adapter")
    assert "cannot import 'needs_engine': ModuleNotFoundError" in first
    assert "no_such_engine_xyz" in first
    assert first.endswith(f"at {workdir / 'needs_engine.py'}:2")


def test_a_misspelt_attribute_suggests_the_adapter(workdir: Path, capsys) -> None:
    (workdir / "spelt_adapter.py").write_text(ADAPTERS)
    (first,) = _refused(capsys, "spelt_adapter:adaptor")
    assert "module 'spelt_adapter' has no attribute 'adaptor'" in first
    assert "did you mean spelt_adapter:adapter?" in first


def test_a_misspelt_built_in_name_suggests_the_built_in(workdir: Path, capsys) -> None:
    (first,) = _refused(capsys, "refrence")
    assert "is neither a built-in adapter" in first and first.endswith("did you mean reference?")


def test_a_file_without_attr_is_named_as_module_and_adapter(workdir: Path, capsys) -> None:
    (workdir / "filed_adapter.py").write_text(ADAPTERS)
    (first,) = _refused(capsys, "filed_adapter.py")
    assert "names a file; name the module as Python imports it: filed_adapter:adapter" in first


def test_an_unknown_name_keeps_its_message_and_says_it_is_no_module_either(
    workdir: Path, capsys
) -> None:
    first, *rest = _refused(capsys, "nonsense")
    assert "'nonsense' is neither a built-in adapter (reference, " in first
    assert first.endswith("cannot import 'nonsense': no module 'nonsense' on sys.path")
    assert f"  current directory: {workdir}" in rest
