"""The sim's modules import one another without a cycle, TYPE_CHECKING imports included
(issue 32): a rank's roles and data paths are given narrow objects, never the rank, so
nothing below :mod:`sim.rank` needs to name it."""

from __future__ import annotations

from tests.import_graph import cycles, graph


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_sim() -> None:
    edges = graph("sim")
    assert "sim.rank" in edges and "sim.rank" in edges["sim.cluster"]
    assert cycles(edges) == []


def test_nothing_below_the_rank_imports_it() -> None:
    """The roles and data paths get a context or an endpoint, not the rank."""
    edges = graph("sim")
    for name in ("sim.sender", "sim.receiver", "sim.push", "sim.pull", "sim.write"):
        assert "sim.rank" not in edges[name], name
