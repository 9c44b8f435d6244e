"""`kvspec adapter new NAME`: a scaffold that passes the suite as written, names the engine
function each method stands for, and never overwrites or shadows anything."""

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.cli import scaffold as template
from kvspec.cli.adapter import class_name, scaffold
from kvspec.conformance.adapter import (
    CAPABILITIES,
    DECLARED,
    check_adapter,
    protocol_capabilities,
    protocol_for,
)
from kvspec.conformance.checks import all_checks
from tests.paths import ROOT

PLUG = "# plug your engine here:"
# quick: this test is about the commands a user types and every check running on the
# scaffold; the reference it delegates to is checked at ci by test_conformance. At ci it is
# 43 CPU s in one process, which a 2-core machine at load 13 did not finish in 300 s.
CONFORM_FLAGS = ("--profile", "quick", "--quiet", "--json", "report.json")


def _kvspec() -> list[str]:
    """The installed console script beside this interpreter (as a user runs it), or
    ``python -m kvspec`` where there is none."""
    script = shutil.which("kvspec", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "kvspec"]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"scaffold_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scaffold_passes_every_check_as_written(tmp_path: Path) -> None:
    """Written into an empty directory and checked from there, by the commands a user
    types: every check of the suite runs, and every one passes."""
    made = subprocess.run(
        [*_kvspec(), "adapter", "new", "myconn_adapter"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert "kvspec conform myconn_adapter:adapter" in made.stdout
    assert (tmp_path / "myconn_adapter.py").is_file()
    ran = subprocess.run(
        [*_kvspec(), "conform", "myconn_adapter:adapter", *CONFORM_FLAGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert summary["passed"] == len(all_checks()) > 100, summary
    assert sum(summary.values()) == summary["passed"], summary  # none failed, skipped, ...
    assert "nothing was checked" not in ran.stderr


def test_the_scaffold_provides_every_capability_and_says_what_goes_in_each(
    tmp_path: Path,
) -> None:
    assert main(["adapter", "new", "engine_adapter", "--dir", str(tmp_path)]) == 0
    path = tmp_path / "engine_adapter.py"
    module = _load(path)
    check_adapter(module.adapter, where="engine_adapter:adapter")
    assert protocol_capabilities(module.adapter) == set(CAPABILITIES)
    assert type(module.adapter).__name__ == "EngineAdapter"
    assert "kvspec conform engine_adapter:adapter" in (module.__doc__ or "")

    lines = path.read_text().splitlines()
    methods = {m for ms in CAPABILITIES.values() for m in ms}
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    found = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in methods:
            above = []
            row = node.lineno - 2  # the line above the def, 0-based
            while row >= 0 and lines[row].strip().startswith("#"):
                above.insert(0, lines[row].strip())
                row -= 1
            found[node.name] = " ".join(above)
    assert set(found) == methods
    bare = sorted(m for m, comment in found.items() if not comment.startswith(PLUG))
    assert not bare, f"methods without a '{PLUG}' comment: {bare}"
    vague = sorted(m for m, c in found.items() if len(c) < len(PLUG) + 20)
    assert not vague, f"comments that do not say what goes there: {vague}"


def test_the_scaffold_is_clean_under_the_projects_linter(tmp_path: Path) -> None:
    """The whole scaffold, and one of each protocol alone (its imports and helpers only)."""
    pytest.importorskip("ruff")
    (tmp_path / "linted_adapter.py").write_text(scaffold("linted_adapter"))
    for capability in CAPABILITIES:
        one = f"only_{capability.replace('-', '_')}"
        (tmp_path / f"{one}.py").write_text(scaffold(one, [capability]))
    config = ["--config", str(ROOT / "pyproject.toml")]
    path = tmp_path
    for command in (["check", *config, str(path)], ["format", "--check", *config, str(path)]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_with_writes_only_the_protocols_asked_and_passes_as_written(tmp_path: Path) -> None:
    """``--with routing,layouts``: the class names those two protocols and holds their
    methods alone; checked by the commands a user types, every check needing only them
    passes and every other is not provided."""
    asked = {"routing", "layouts"}
    made = subprocess.run(
        [*_kvspec(), "adapter", "new", "two_adapter", "--with", "routing, layouts"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    path = tmp_path / "two_adapter.py"
    (cls,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
    assert [ast.unparse(b) for b in cls.bases] == ["Adapter", "RoutingProtocol", "LayoutsProtocol"]
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert defined == {m for c in asked for m in CAPABILITIES[c]}
    module = _load(path)
    assert protocol_capabilities(module.adapter) == asked
    check_adapter(module.adapter, where="two_adapter:adapter")
    ran = subprocess.run(
        [*_kvspec(), "conform", "two_adapter:adapter", *CONFORM_FLAGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    runnable = [c for c in all_checks() if set(c.needs) <= asked | set(DECLARED)]
    assert summary["passed"] == len(runnable) > 5, summary
    assert summary["not provided"] == len(all_checks()) - len(runnable), summary


def test_with_refuses_a_name_that_is_no_capability(tmp_path: Path, capsys) -> None:
    assert main(["adapter", "new", "mine", "--dir", str(tmp_path), "--with", "routng"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvspec adapter: refused: --with names no capability 'routng'")
    assert "did you mean routing for routng?" in err
    assert all(name in err for name in CAPABILITIES)
    assert main(["adapter", "new", "mine", "--dir", str(tmp_path), "--with", ","]) == 2
    assert "--with names no capability; the capabilities are" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_templates_protocols_are_kvspecs() -> None:
    """The template names each protocol once, by its capability and class, so ``--with``
    (read from the template, without importing the suite) knows exactly kvspec's."""
    sections = [s for s in template.sections() if s.kind == "protocol"]
    assert sorted(s.key for s in sections) == sorted(CAPABILITIES)
    for section in sections:
        assert protocol_for(section.key).__name__ == section.protocol


def test_new_never_overwrites_a_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mine.py"
    path.write_text("# my own work\n")
    assert main(["adapter", "new", "mine", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvspec adapter: refused: ") and str(path) in err
    assert "never overwrites" in err and "Traceback" not in err
    assert path.read_text() == "# my own work\n"


@pytest.mark.parametrize("name", ["9lives", "my-adapter", "my.adapter", "class", "", "a b"])
def test_new_refuses_a_name_python_cannot_import(name: str, tmp_path: Path, capsys) -> None:
    assert main(["adapter", "new", name, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvspec adapter: refused: NAME must be a Python identifier")
    assert repr(name) in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["json", "torch", "kvspec"])
def test_new_refuses_a_name_that_would_hide_an_installed_module(
    name: str, tmp_path: Path, capsys
) -> None:
    assert main(["adapter", "new", name, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"a module {name!r} is installed already" in err and f"{name}_adapter" in err
    assert list(tmp_path.iterdir()) == []


def test_new_refuses_a_directory_that_is_not_there(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere"
    assert main(["adapter", "new", "mine", "--dir", str(missing)]) == 2
    assert f"--dir {missing}: not a directory" in capsys.readouterr().err
    assert not missing.exists()


def test_class_names_follow_the_module_name() -> None:
    assert class_name("myconn_adapter") == "MyconnAdapter"
    assert class_name("myconn") == "MyconnAdapter"
    assert class_name("adapter") == "MyAdapter"  # not the base class it subclasses
    assert class_name("vllm_nixl") == "VllmNixlAdapter"


def test_a_scaffold_named_adapter_still_loads(tmp_path: Path) -> None:
    """``adapter.py`` holding ``adapter = MyAdapter()``: no clash with ``Adapter``."""
    path = tmp_path / "adapter.py"
    path.write_text(scaffold("adapter"))
    assert protocol_capabilities(_load(path).adapter) == set(CAPABILITIES)
