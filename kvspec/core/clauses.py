"""The registry of every clause of the spec, and the clause table generated from it.

Each spec module declares its own ``CLAUSES`` beside the code that implements them;
this module is the single place that gathers them. ``docs/clauses.md`` is produced by
``kvspec clauses --markdown`` and a test keeps it in step.

Listing the clauses imports none of the spec modules that are not imported yet: each
``CLAUSES`` is a literal of :class:`~kvspec.core.clause.Clause`, :func:`~kvspec.core.clause.must`
and :func:`~kvspec.core.clause.refuses`, and is read from the module's source, so that
``kvspec clauses`` starts without the tensor modules (and torch). A declaration in any
other form is read by importing its module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

from kvspec.core.clause import Clause, Obligation, accepts, must, refuses

SPEC_MODULES: tuple[str, ...] = (
    "kvspec.topology.stage",
    "kvspec.topology.model",
    "kvspec.tensors.dtypes",
    "kvspec.tensors.kv",
    "kvspec.topology.tokens",
    "kvspec.topology.ownership",
    "kvspec.topology.plan",
    "kvspec.topology.groups",
    "kvspec.topology.state",
    "kvspec.topology.windows",
    "kvspec.topology.block_size",
    "kvspec.topology.indexer",
    "kvspec.topology.group_plan",
    "kvspec.tensors.slicing",
    "kvspec.tensors.reshard",
    "kvspec.memory.cache_layout",
    "kvspec.memory.paged",
    "kvspec.memory.descriptors",
    "kvspec.tensors.oracle",
    "kvspec.memory.records",
    "kvspec.memory.planes",
    "kvspec.tensors.state_oracle",
    "kvspec.tensors.scaled_oracle",
    "kvspec.memory.state_cache",
    "kvspec.naming.keys",
    "kvspec.naming.ports",
    "kvspec.transport.payload",
    "kvspec.transport.chunks",
    "kvspec.transport.streaming",
    "kvspec.transport.wire",
    "kvspec.lifecycle.machine",
)
"""Modules that declare clauses, in the order their families appear in the table."""


_DECLARATION_NAMES = {"Clause": Clause, "must": must, "accepts": accepts, "refuses": refuses}
"""The only names a ``CLAUSES`` literal may use to be read without importing its module."""

_DECLARATION_NODES = (
    ast.Tuple,
    ast.List,
    ast.Call,
    ast.keyword,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.BinOp,  # "..." + "..." across lines
    ast.Add,
)


def _build(node: ast.AST) -> Any:
    """The value of a declaration literal already limited to :data:`_DECLARATION_NODES`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _DECLARATION_NAMES[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_build(item) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp):
        return _build(node.left) + _build(node.right)
    if isinstance(node, ast.Call):
        kwargs = {k.arg: _build(k.value) for k in node.keywords if k.arg is not None}
        return _build(node.func)(*[_build(a) for a in node.args], **kwargs)
    raise ValueError(f"not a declaration node: {type(node).__name__}")


def read_clauses(name: str) -> tuple[Clause, ...] | None:
    """The ``CLAUSES`` of spec module ``name`` read from its source without importing it,
    or None when it is not one literal of Clause, must and refuses (or has no source)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None
    bindings = [
        node
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        and any(
            isinstance(target, ast.Name) and target.id == "CLAUSES"
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    if len(bindings) != 1 or isinstance(bindings[0], ast.AugAssign) or bindings[0].value is None:
        return None
    value = bindings[0].value
    for node in ast.walk(value):
        if not isinstance(node, _DECLARATION_NODES) or (
            isinstance(node, ast.Name) and node.id not in _DECLARATION_NAMES
        ):
            return None
    clauses = _build(value)  # interpreted node by node: nothing of the source executes
    if not isinstance(clauses, tuple) or not all(isinstance(c, Clause) for c in clauses):
        return None
    return clauses


def declared_clauses(name: str) -> tuple[Clause, ...]:
    """The ``CLAUSES`` of spec module ``name``: its own if it is imported, else read from
    its source (:func:`read_clauses`), else imported."""
    module = sys.modules.get(name)
    if module is None:
        clauses = read_clauses(name)
        if clauses is not None:
            return clauses
        module = importlib.import_module(name)
    return module.CLAUSES


@cache
def all_clauses() -> dict[str, Clause]:
    """Every clause by id, in table order; duplicate ids are a bug and refused."""
    registry: dict[str, Clause] = {}
    for name in SPEC_MODULES:
        for clause in declared_clauses(name):
            if clause.id in registry:
                raise RuntimeError(f"clause id {clause.id} is declared twice (again in {name})")
            registry[clause.id] = clause
    return registry


def get_clause(clause_id: str) -> Clause:
    """The clause with id ``clause_id``; unknown ids are refused with the known ones."""
    clauses = all_clauses()
    if clause_id not in clauses:
        raise KeyError(f"no clause {clause_id!r}; known clauses: {', '.join(clauses)}")
    return clauses[clause_id]


@cache
def all_obligations() -> dict[str, Obligation]:
    """Every obligation of every clause by id (``PAYLOAD-3.4``), in table order."""
    return {o.id: o for clause in all_clauses().values() for o in clause.obligations}


def get_obligation(obligation_id: str) -> Obligation:
    """The obligation with id ``obligation_id``; unknown ids are refused."""
    obligations = all_obligations()
    if obligation_id not in obligations:
        raise KeyError(f"no obligation {obligation_id!r}; see `kvspec clauses --coverage`")
    return obligations[obligation_id]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def clause_table_markdown() -> str:
    """The clause table of ``docs/clauses.md``, grouped by family, each family's
    obligations after its clauses."""
    lines = [
        "# kvspec clauses",
        "",
        "Generated by `kvspec clauses --markdown` from the `CLAUSES` of each spec module; "
        "do not edit by hand. Each clause is split into numbered obligations: a positive one "
        "says what an implementation must produce or accept, a negative one what it must "
        "refuse. `kvspec clauses --coverage` shows the checks that exercise each obligation "
        "and the one-bug implementations (mutants) they kill.",
    ]
    by_family: dict[str, list[Clause]] = {}
    for clause in all_clauses().values():
        by_family.setdefault(clause.family, []).append(clause)
    for family, clauses in by_family.items():
        lines += ["", f"## {family}", "", "| id | rule | text |", "|---|---|---|"]
        lines += [f"| {c.id} | {c.title} | {_cell(c.text)} |" for c in clauses]
        lines += ["", "| obligation | kind | sentence |", "|---|---|---|"]
        lines += [
            f"| {o.id} | {o.kind} | {_cell(o.text)} |" for c in clauses for o in c.obligations
        ]
    return "\n".join(lines) + "\n"
