"""The sim's modules import one another without a cycle, TYPE_CHECKING imports included
(issue 32): a rank's roles and data paths are given narrow objects, never the rank, so
nothing below :mod:`sim.rank` needs to name it."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"


def _imports(path: Path) -> set[str]:
    """Every ``sim.*`` module ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sim.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sim":
                found |= {f"sim.{a.name}" for a in node.names}
            elif node.module.startswith("sim."):
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {f"sim.{p.stem}": p for p in SIM.glob("*.py")}
    return {name: _imports(path) & set(modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_sim() -> None:
    graph = _graph()
    assert "sim.rank" in graph and "sim.rank" in graph["sim.cluster"]
    assert _cycles(graph) == []


def test_nothing_below_the_rank_imports_it() -> None:
    """The roles and data paths get a context or an endpoint, not the rank."""
    for name in ("sim.sender", "sim.receiver", "sim.push", "sim.pull", "sim.write"):
        assert "sim.rank" not in _graph()[name], name
