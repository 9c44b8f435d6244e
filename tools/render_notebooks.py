"""Execute the notebooks and render each as Markdown with its figures: ``make notebooks``.

The ``.ipynb`` files stay stripped in the repository (``tools/strip_notebooks.py``);
what a reader sees without running anything is ``docs/notebooks/NAME.md`` with the
figures beside it in ``docs/notebooks/NAME_files/``, written here from one run with the
notebooks' full parameters (``--quick`` uses the small ones the tests use).

Usage (from the repository root):

    .venv/bin/python tools/render_notebooks.py            # every notebooks/*.ipynb
    .venv/bin/python tools/render_notebooks.py --quick A.ipynb
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "notebooks"
CELL_TIMEOUT_S = 1800


def execute(path: Path, *, quick: bool) -> nbformat.NotebookNode:
    """Run ``path`` top to bottom in this interpreter's kernel, from the repository root."""
    if quick:
        os.environ["KVSPEC_NOTEBOOK_QUICK"] = "1"
    else:
        os.environ.pop("KVSPEC_NOTEBOOK_QUICK", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()
    return notebook


def portable(text: str) -> str:
    """``text`` without this machine's paths: the repository root becomes ``.`` and the
    home directory ``~``, so a rendered page never shows where it was rendered."""
    for private, shown in ((ROOT, "."), (Path.home(), "~")):
        if private.parent != private:  # a home of "/" is no one's
            text = re.sub(re.escape(str(private)) + r"(?![\w.-])", shown, text)
    return text


def render(notebook: nbformat.NotebookNode, name: str, *, note: str) -> str:
    """Markdown of an executed notebook; its PNG figures are written to ``NAME_files/``.
    Outputs pass through :func:`portable`."""
    figures = OUT / f"{name}_files"
    shutil.rmtree(figures, ignore_errors=True)
    lines = [f"<!-- {note} -->", ""]
    figure = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            lines += [cell.source, ""]
            continue
        if cell.cell_type != "code":
            continue
        lines += ["```python", cell.source, "```", ""]
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                lines += ["```text", portable(output["text"].rstrip("\n")), "```", ""]
            elif kind in ("display_data", "execute_result"):
                data = output.get("data", {})
                if "image/png" in data:
                    figures.mkdir(parents=True, exist_ok=True)
                    figure += 1
                    target = figures / f"figure-{figure}.png"
                    target.write_bytes(base64.b64decode(data["image/png"]))
                    lines += [f"![figure {figure}]({name}_files/{target.name})", ""]
                elif "text/plain" in data:
                    lines += ["```text", portable(data["text/plain"].rstrip("\n")), "```", ""]
            elif kind == "error":
                raise RuntimeError(f"{name}: a cell raised {output.get('ename')}")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--quick", action="store_true", help="the tests' small parameters")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    OUT.mkdir(parents=True, exist_ok=True)
    for path in paths:
        started = time.monotonic()
        executed = execute(path, quick=args.quick)
        note = (
            f"Rendered by `make notebooks` from notebooks/{path.name} on "
            f"{time.strftime('%Y-%m-%d')}, {'quick' if args.quick else 'full'} parameters, "
            f"Python {sys.version.split()[0]}. Edit the notebook, not this file."
        )
        text = render(executed, path.stem, note=note)
        (OUT / f"{path.stem}.md").write_text(text)
        print(
            f"render_notebooks: {path.name} -> docs/notebooks/{path.stem}.md "
            f"({time.monotonic() - started:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
