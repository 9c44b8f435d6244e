"""The sim's rooms import one way (issue 41): a table of which package may import which,
checked over the real import graph (TYPE_CHECKING and function-level imports included),
no cycle among its modules, the sim never imports the ``kvspec`` command package
(:mod:`kvspec.cli`, the shared helpers being :mod:`kvspec.console`). That kvspec never
imports the sim is tests/spec/test_kvspec_imports.py's."""

from __future__ import annotations

import ast

from tests.import_graph import cycles, graph, modules

# Each room of sim/ and the rooms it may import (besides itself). The commands at the top
# (sim.cli, sim.node, python -m sim) may import every room.
LAYERS: dict[str, set[str]] = {
    "run": set(),
    "net": {"run"},
    "cache": {"run", "net"},
    "books": {"run", "net"},
    "paths": {"run", "net", "cache", "books"},
    "rank": {"run", "net", "cache", "books", "paths"},
    "harness": {"run", "net", "cache", "books", "paths", "rank"},
}
TOP = {"sim", "sim.__main__", "sim.cli", "sim.node"}


def room(module: str) -> str | None:
    """The room of a sim module (``sim.paths.push`` -> ``paths``), None for the commands."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def breaches(edges: dict[str, set[str]]) -> list[str]:
    """Every import the table does not allow, as ``importer -> imported``."""
    found = []
    for importer, imported in sorted(edges.items()):
        here = room(importer)
        for name in sorted(imported):
            there = room(name)
            if there is None and name not in TOP:
                continue
            allowed = here is None or there == here or there in LAYERS[here]
            if not allowed:
                found.append(f"{importer} -> {name}")
    return found


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_sim_module_has_a_room() -> None:
    """A module outside every room would escape the table."""
    homeless = [name for name in graph("sim") if room(name) is None and name not in TOP]
    assert homeless == []
    assert set(LAYERS) <= {room(name) for name in graph("sim")}


def test_the_rooms_import_one_way() -> None:
    edges = graph("sim")
    assert "sim.rank.loop" in edges["sim.harness.cluster"]  # the graph sees real imports
    assert breaches(edges) == []


def test_the_table_refuses_a_planted_import() -> None:
    """An import running back up (a data path naming the rank's roles, the bottom room
    naming the books, the cache naming the books beside it) is a breach."""
    edges = {name: set(found) for name, found in graph("sim").items()}
    edges["sim.paths.push"].add("sim.rank.sender")
    edges["sim.run.config"].add("sim.books.report")
    edges["sim.cache.memory"].add("sim.books.accounting")
    edges["sim.net.messages"].add("sim.cli")
    assert breaches(edges) == [
        "sim.cache.memory -> sim.books.accounting",
        "sim.net.messages -> sim.cli",
        "sim.paths.push -> sim.rank.sender",
        "sim.run.config -> sim.books.report",
    ]


def test_no_import_cycle_in_sim() -> None:
    assert cycles(graph("sim")) == []


def _external_imports(package: str) -> dict[str, set[str]]:
    """Module -> the top-level dotted names it imports from outside (any depth)."""
    found: dict[str, set[str]] = {}
    for name, path in modules(package).items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        found[name] = names
    return found


def test_the_sim_never_imports_the_kvspec_command() -> None:
    """The sim takes its argument, exit and output helpers from kvspec.console."""
    used = {
        (name, imported)
        for name, names in _external_imports("sim").items()
        for imported in names
        if imported == "kvspec.cli" or imported.startswith("kvspec.cli.")
    }
    assert used == set()
    assert any(
        imported.startswith("kvspec.console.") for imported in _external_imports("sim")["sim.cli"]
    )
