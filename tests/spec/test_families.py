"""The clause families as folders (kvspec/conformance/families/): every clause family has
one folder, a folder never imports another (over the real import graph, function-level
and TYPE_CHECKING imports included), and its modules are found by name."""

from __future__ import annotations

import importlib

from kvspec.conformance.checks import all_checks
from kvspec.conformance.families import FAMILIES, modules, owner
from kvspec.conformance.mutants import all_mutants
from kvspec.core.clauses import all_clauses
from tests.import_graph import graph

PREFIX = "kvspec.conformance.families."


def family_of(module: str) -> str | None:
    """The family folder ``module`` belongs to, or None outside the families."""
    if not module.startswith(PREFIX):
        return None
    return module[len(PREFIX) :].split(".")[0]


def crossings(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of one family's module by another family's: what must be empty."""
    return sorted(
        (importer, imported)
        for importer, imports in edges.items()
        for imported in imports
        if family_of(importer) and family_of(imported) not in (None, family_of(importer))
    )


def test_no_family_imports_another() -> None:
    edges = graph("kvspec")
    assert any(family_of(m) for m in edges), "the graph sees the family modules"
    assert crossings(edges) == []


def test_a_planted_crossing_is_found() -> None:
    """The rule has teeth: one family's check importing another's helper is reported."""
    edges = graph("kvspec")
    planted = {**edges, f"{PREFIX}wire.checks": {*edges[f"{PREFIX}wire.checks"]}}
    planted[f"{PREFIX}wire.checks"].add(f"{PREFIX}payloads.checks")
    assert crossings(planted) == [(f"{PREFIX}wire.checks", f"{PREFIX}payloads.checks")]


def test_every_clause_family_has_one_folder() -> None:
    held = [f for name in FAMILIES for f in importlib.import_module(PREFIX + name).CLAUSE_FAMILIES]
    families = list(dict.fromkeys(c.family for c in all_clauses().values()))
    assert sorted(held) == sorted(families)  # each once, none unknown
    assert owner("CP") == "ownership" and owner("WIRE") == "wire"


def test_the_folders_modules_are_what_the_registries_read() -> None:
    """Every check and mutant is declared in a family folder's checks or mutants module."""
    checks, mutants = set(modules("checks")), set(modules("mutants"))
    assert {c.run.__module__ for c in all_checks()} <= checks
    assert {m.cls.__module__ for m in all_mutants()} <= mutants
    assert all(family_of(m) for m in checks | mutants | set(modules("errors")))


def test_a_family_folder_holds_each_of_its_checks_own_family() -> None:
    """A check or mutant is in the folder of one of the clause families it serves."""
    for check in all_checks():
        folders = {owner(o.split("-")[0]) for o in check.covers}
        assert family_of(check.run.__module__) in folders, (check.id, check.run.__module__)
    for mutant in all_mutants():
        folders = {owner(o.split("-")[0]) for o in mutant.obligations}
        assert family_of(mutant.cls.__module__) in folders, (mutant.name, mutant.cls.__module__)
