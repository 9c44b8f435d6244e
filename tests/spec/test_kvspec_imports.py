"""kvspec's modules import one another without a cycle, TYPE_CHECKING and function-level
imports included, and never import the sim (kvspec is the reference; the sim takes every
rule from it)."""

from __future__ import annotations

import ast

from tests.import_graph import cycles, graph, modules


def test_the_graph_sees_submodules_named_in_a_from_import() -> None:
    """``from kvspec.conformance import adapter`` is an edge to the adapter package, so a
    cycle through a subpackage is not hidden behind its parent."""
    edges = graph("kvspec")
    assert "kvspec.conformance.adapter" in edges["kvspec.conformance.checks"]
    assert "kvspec.conformance.adapter.base" in edges["kvspec.conformance.adapter.capabilities"]


def test_no_import_cycle_in_kvspec() -> None:
    assert cycles(graph("kvspec")) == []


def test_kvspec_never_imports_the_sim() -> None:
    for name, path in modules("kvspec").items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "sim" or n.startswith("sim.") for n in names), (name, names)
