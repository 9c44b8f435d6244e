"""The import graph of a package, and its cycles: what the import tests of kvspec and of the
sim hold to none. Every import counts, ``TYPE_CHECKING`` and function-level ones included:
a cycle hidden behind either is still two modules that cannot be read (or moved) apart."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT


def modules(package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (a folder under the repository
    root), packages by their ``__init__``."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in it: ``from P import N``
    names module ``P.N`` where there is one, else ``P``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if inner in known else node.module)
    return found & set(known)


def graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (itself left out)."""
    known = modules(package)
    return {name: _imports(path, known) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
