"""The notebooks in notebooks/: each runs top to bottom without an error, and each is
committed stripped of its outputs.

Notebooks run with ``KVSPEC_NOTEBOOK_QUICK=1`` (their small parameters), the repository
root as working directory and ``PYTHONPATH``, in a Jupyter kernel of the very interpreter
running the tests, so they import this checkout's ``kvspec`` and ``sim``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = {"routing_explorer", "simulated_cluster"}
CELL_TIMEOUT_S = 120
KERNEL = "kvspec-python3"


def _strip_tool():
    spec = importlib.util.spec_from_file_location(
        "strip_notebooks", ROOT / "tools/strip_notebooks.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


strip_notebooks = _strip_tool()


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_the_notebooks_are_there() -> None:
    assert {p.stem for p in NOTEBOOKS} >= EXPECTED, f"found {[p.name for p in NOTEBOOKS]}"


@pytest.fixture(scope="session")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernel spec for this interpreter, first on Jupyter's search path.

    A ``python3`` spec elsewhere (a user's, another environment's) could start a
    Python without this checkout; this one cannot.
    """
    if importlib.util.find_spec("ipykernel") is None:
        pytest.fail(
            f"ipykernel is not installed for {sys.executable}; the notebooks need it: "
            "pip install -e '.[dev]' (make test does)"
        )
    data_dir = tmp_path_factory.mktemp("jupyter")
    spec_dir = data_dir / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"kvspec ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    previous = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(data_dir), previous]))
    yield KERNEL
    if previous is None:
        del os.environ["JUPYTER_PATH"]
    else:
        os.environ["JUPYTER_PATH"] = previous


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, kernel_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev dependency")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is a dev dependency")
    monkeypatch.setenv("KVSPEC_NOTEBOOK_QUICK", "1")
    python_path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(python_path))  # the kernel inherits it
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(ROOT)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{path.name} failed:\n{error}", pytrace=False)
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    imported = [line for line in printed.splitlines() if line.startswith("kvspec from ")]
    # relative to the kernel's working directory, the repository root: this checkout
    assert imported == [f"kvspec from {Path('kvspec', '__init__.py')}"], (
        f"{path.name} must print where it imported kvspec from, and it must be this checkout"
    )
    if path.stem == "simulated_cluster":  # the figure's caption, computed from its runs
        assert re.search(r"the whiskers overlap for \d+ of \d+ stage pairs", printed), printed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_stripped(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    carrying = [
        i
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code"
        and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    fix = "run: python tools/strip_notebooks.py"
    assert not carrying, f"{path.name}: cells {carrying} carry outputs; {fix}"
    assert strip_notebooks.dumps(strip_notebooks.strip(notebook)) == text, (
        f"{path.name} keeps run-dependent metadata or is not in Jupyter's format; {fix}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_says_what_it_shows_and_has_quick_parameters(path: Path) -> None:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[0]["cell_type"] == "markdown", f"{path.name} must open with what it shows"
    assert "KVSPEC_NOTEBOOK_QUICK" in "".join(cells[0]["source"]), (
        f"{path.name}'s first cell must say how to run it, quick parameters included"
    )
    first_code = next(c for c in cells if c["cell_type"] == "code")
    assert 'os.environ.get("KVSPEC_NOTEBOOK_QUICK")' in "".join(first_code["source"]), (
        f"{path.name}'s first code cell must read KVSPEC_NOTEBOOK_QUICK"
    )


def test_strip_tool_strips_and_checks(tmp_path: Path) -> None:
    executed = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 3,
                "id": "a",
                "metadata": {"execution": {"iopub.status.idle": "2024"}, "tags": ["keep"]},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": "hi\n"}],
                "source": "print('hi')",
            }
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": "3.11.7"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(executed))
    tool = [sys.executable, str(ROOT / "tools/strip_notebooks.py")]
    check = subprocess.run([*tool, "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 1 and f"not stripped: {path}" in check.stdout
    assert json.loads(path.read_text()) == executed, "--check changes nothing"

    assert subprocess.run([*tool, str(path)], capture_output=True).returncode == 0
    stripped = json.loads(path.read_text())
    cell = stripped["cells"][0]
    assert (cell["outputs"], cell["execution_count"]) == ([], None)
    assert cell["metadata"] == {"tags": ["keep"]}, "run-dependent metadata goes, tags stay"
    assert stripped["metadata"]["language_info"] == {"name": "python"}
    assert subprocess.run([*tool, "--check", str(path)], capture_output=True).returncode == 0


def _render_tool():
    pytest.importorskip("nbclient", reason="nbclient is a dev dependency")
    spec = importlib.util.spec_from_file_location(
        "render_notebooks", ROOT / "tools/render_notebooks.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MACHINE_PATHS = re.compile(
    r"(?<![\w.:/])/(?:home/|Users/|root/|tmp/|(?:[\w.-]+/)+(?:kvspec|sim|notebooks)/)"
)
"""An absolute path a reader's machine does not have: a home directory, a temporary one,
or a checkout's files (``/work/other-checkout/kvspec/...``); URLs are not matched."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_rendered_copy_shows_no_path_of_the_machine_it_ran_on(path: Path) -> None:
    text = (ROOT / "docs" / "notebooks" / f"{path.stem}.md").read_text()
    for private in (ROOT, Path.home()):
        if private.parent != private:
            assert not re.search(re.escape(str(private)) + r"(?![\w.-])", text), private
    found = MACHINE_PATHS.search(text)
    assert found is None, f"{path.stem}.md shows {text[found.start() : found.start() + 60]!r}"


def test_the_renderer_replaces_this_machines_paths(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev dependency")
    tool = _render_tool()
    tool.OUT = tmp_path  # where a figure would go
    here, home = ROOT / "kvspec" / "__init__.py", Path.home() / "data"
    cell = nbformat.v4.new_code_cell("print(here, home)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{here} {home}\n")]
    text = tool.render(nbformat.v4.new_notebook(cells=[cell]), "n", note="test")
    assert str(ROOT) not in text and "./kvspec/__init__.py" in text
    if home.parent.parent != home.parent:  # a home of "/" is left alone
        assert str(home) not in text and "~/data" in text
    assert MACHINE_PATHS.search(text) is None
    assert MACHINE_PATHS.search(f"ran in {ROOT}/kvspec/x.py") is not None  # the net catches


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_has_a_rendered_copy(path: Path) -> None:
    """make notebooks renders each notebook, executed, to docs/notebooks/ for readers."""
    rendered = ROOT / "docs" / "notebooks" / f"{path.stem}.md"
    assert rendered.exists(), f"run: make notebooks (no {rendered.relative_to(ROOT)})"
    text = rendered.read_text()
    assert f"from notebooks/{path.name}" in text and "kvspec from " in text
    for figure in re.findall(r"\]\(([^)]+\.png)\)", text):
        assert (rendered.parent / figure).exists(), f"{rendered.name} links a missing {figure}"
