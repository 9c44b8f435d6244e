"""kvspec's packages import one way (issue 41): a table of which layer may import which,
checked over the real import graph (TYPE_CHECKING and function-level imports included),
and a core that imports nothing but the standard library, so that starting ``kvspec``,
reading the clauses or parsing a form can never load torch, NumPy or Hypothesis, by
construction rather than by care. Cycles and the sim are tests/spec/test_kvspec_imports.py's.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.import_graph import graph, modules

CORE = ("kvspec.core",)
"""The stdlib-only core: the clause registry, argument checks, errors, forms, untrusted
input, and the names (profiles, tiers, dtypes) that start-up needs."""

# Each layer, the module prefixes in it (the longest prefix wins), and the layers it may
# import besides itself. The spec's families sit on the core; the suite on the spec; the
# commands (kvspec.cli, python -m kvspec) on everything.
LAYERS: dict[str, tuple[tuple[str, ...], set[str]]] = {
    "core": (CORE, set()),
    "lifecycle": (("kvspec.lifecycle",), {"core"}),
    "topology": (("kvspec.topology",), {"core"}),
    "naming": (("kvspec.naming",), {"core", "topology"}),
    "tensors": (("kvspec.tensors",), {"core", "topology"}),
    "memory": (("kvspec.memory",), {"core", "topology", "tensors"}),
    "transport": (("kvspec.transport",), {"core", "topology", "tensors", "memory", "naming"}),
}
SPEC = {"core", "lifecycle", "topology", "naming", "tensors", "memory", "transport"}
LAYERS.update(
    {
        "error_cases": (("kvspec.error_cases",), SPEC),
        "testing": (("kvspec.testing",), SPEC),
        "console": (("kvspec.console",), SPEC),
        "package": (("kvspec",), set()),  # its __init__: the version, nothing else
        # the old names of moved modules, kept for users' code; nothing in kvspec imports them
        "moved": (("kvspec.errors", "kvspec.strategies"), {"core", "testing", "topology"}),
        "conformance": (("kvspec.conformance",), SPEC | {"error_cases", "testing", "package"}),
        "adapters": (("kvspec.adapters",), SPEC | {"testing", "conformance"}),
        "cli": (
            ("kvspec.cli", "kvspec.__main__"),
            SPEC | {"error_cases", "testing", "console", "conformance", "package"},
        ),
    }
)


def layer(module: str) -> str:
    """The layer of a kvspec module: the one with the longest prefix of its name (the
    package itself only by its own name); "" for a module no layer holds."""
    best, length = "", -1
    for name, (prefixes, _) in LAYERS.items():
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "kvspec"
            if (module == prefix or inside) and len(prefix) > length:
                best, length = name, len(prefix)
    return best


def breaches(edges: dict[str, set[str]]) -> list[str]:
    """Every import the table does not allow, as ``importer -> imported``."""
    found = []
    for importer, imported in sorted(edges.items()):
        here = layer(importer)
        for name in sorted(imported):
            there = layer(name)
            if there != here and there not in LAYERS[here][1]:
                found.append(f"{importer} -> {name}")
    return found


def test_every_module_has_a_layer_and_every_layer_a_module() -> None:
    names = graph("kvspec")
    assert layer("kvspec.newcomer") == ""  # a new top-level module must be given a layer
    assert all(layer(name) for name in names)
    assert {layer(name) for name in names} == set(LAYERS)
    assert {"kvspec.core.clauses", "kvspec.core.forms", "kvspec.core.errors"} <= set(names)


def test_the_layers_import_one_way() -> None:
    edges = graph("kvspec")
    assert "kvspec.topology.tokens" in edges["kvspec.tensors.reshard"]  # real imports seen
    assert breaches(edges) == []


def test_the_table_refuses_a_planted_import() -> None:
    """An import running back up (the topology naming tensors, the core naming the
    topology, the spec naming the suite, an adapter naming the command) is a breach."""
    edges = {name: set(found) for name, found in graph("kvspec").items()}
    edges["kvspec.topology.plan"].add("kvspec.tensors.reshard")
    edges["kvspec.core.forms"].add("kvspec.topology.model")
    edges["kvspec.memory.paged"].add("kvspec.conformance.runner")
    edges["kvspec.adapters.sglang"].add("kvspec.cli.conform")
    assert breaches(edges) == [
        "kvspec.adapters.sglang -> kvspec.cli.conform",
        "kvspec.core.forms -> kvspec.topology.model",
        "kvspec.memory.paged -> kvspec.conformance.runner",
        "kvspec.topology.plan -> kvspec.tensors.reshard",
    ]


def _outside_imports(path: Path) -> set[str]:
    """The top-level names of every module a file imports from outside kvspec."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - {"kvspec", "__future__"}


def test_the_core_imports_only_the_standard_library() -> None:
    """Not torch, NumPy or Hypothesis, not even under TYPE_CHECKING (``_typeshed`` is the
    type checker's own)."""
    files = modules("kvspec")
    outside = {
        name: sorted(_outside_imports(files[name]) - set(sys.stdlib_module_names) - {"_typeshed"})
        for name in files
        if layer(name) == "core"
    }
    assert {name: found for name, found in outside.items() if found} == {}


def test_the_moved_modules_old_names_still_work_and_say_where_they_went() -> None:
    """An adapter written by an earlier ``kvspec adapter new`` imports TransferCase from
    kvspec.strategies, and a caller of the spec catches kvspec.errors.FormError: both run,
    warned once each, on the very objects of their new homes."""
    import importlib
    import warnings

    from kvspec.core.errors import FormError
    from kvspec.topology.case import TransferCase

    for name in ("kvspec.errors", "kvspec.strategies"):
        sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_errors = importlib.import_module("kvspec.errors")
        old_strategies = importlib.import_module("kvspec.strategies")
    assert old_errors.FormError is FormError
    assert old_strategies.TransferCase is TransferCase
    assert callable(old_strategies.transfer_cases)  # the rest of the old namespace
    said = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert [m.split(" moved")[0] for m in said] == ["kvspec.errors", "kvspec.strategies"]
    assert "kvspec.core.errors" in said[0] and "kvspec.topology.case" in said[1]
