"""Strip the outputs from Jupyter notebooks, so that running one never shows in a diff.

Usage (from the repository root):

    .venv/bin/python tools/strip_notebooks.py            # every notebooks/*.ipynb, in place
    .venv/bin/python tools/strip_notebooks.py A.ipynb    # just these
    .venv/bin/python tools/strip_notebooks.py --check    # change nothing; exit 1 and name
                                                         # every notebook that is not stripped

Stripping empties every code cell's outputs, sets its execution count to null, drops the
per-cell metadata Jupyter records as it runs (timings, collapsed/scrolled state) and keeps
only the kernel spec and the language name of the notebook's metadata (the rest records
the machine it last ran on). Files are written as Jupyter writes them (one-space indent,
sorted keys), so a stripped notebook that is opened and saved without running stays the
same. Run it before committing a notebook; ``tests/docs/test_notebooks.py`` fails on one that
is not stripped.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")


def strip(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``notebook`` (parsed JSON) without outputs or run-dependent metadata."""
    clean = copy.deepcopy(notebook)
    for cell in clean.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        metadata = cell.get("metadata", {})
        for key in VOLATILE_CELL_METADATA:
            metadata.pop(key, None)
    metadata = clean.get("metadata", {})
    kept: dict[str, Any] = {}
    if "kernelspec" in metadata:
        kept["kernelspec"] = metadata["kernelspec"]
    if "name" in metadata.get("language_info", {}):
        kept["language_info"] = {"name": metadata["language_info"]["name"]}
    clean["metadata"] = kept
    return clean


def dumps(notebook: dict[str, Any]) -> str:
    """The notebook as Jupyter writes it (nbformat: indent 1, sorted keys, newline)."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/)")
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    dirty = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        clean = dumps(strip(json.loads(text)))
        if clean == text:
            continue
        dirty.append(path)
        if not args.check:
            path.write_text(clean, encoding="utf-8")
    verb = "not stripped" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}")
    if args.check and dirty:
        print(f"run: python {Path(__file__).relative_to(ROOT)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
