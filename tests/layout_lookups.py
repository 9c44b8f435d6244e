"""Where the package looks a cache layout up by its name, read from the source (AST).

A *lookup* is a call of ``get_layout(...)`` or a preset table (``PRESETS``, ``LAYOUTS``,
``CROSS_LAYER``, ``RECORDS``, ``SCALED``) indexed by anything but a literal name
(``PRESETS["flash_attn"]`` names a constant, as an import does). A lookup is *declared*
where its module is a parse boundary (:data:`BOUNDARIES`), or where it resolves a
parameter of its own function annotated ``LayoutRef``: a public function that takes its
caller's reference says so in its signature and resolves it as it comes in. Every other
lookup is a layout travelling as a name, which configurations and caches no longer do
[LAYOUT-1, LAYOUT-5]."""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("kvspec", "sim")
"""What is scanned: the wheel's packages."""

TABLES = frozenset({"PRESETS", "LAYOUTS", "CROSS_LAYER", "RECORDS", "SCALED"})
"""The preset tables, by the names the package imports them as."""

REF = "LayoutRef"
"""The annotation that declares a parameter a layout reference."""

BOUNDARIES: dict[str, str] = {
    "kvspec/memory/cache_layout/registry.py": "get_layout itself: the one resolver",
    "kvspec/console/args.py": "command-line arguments: --src-layout and the like",
    "kvspec/cli/": "the kvspec commands: their arguments and files",
    "sim/cli.py": "the sim's command line",
    "sim/run/config.py": "SimConfig.from_dict: the form a rank process is handed",
    "kvspec/memory/descriptors/registered.py": "RegisteredCache.from_dict",
    "kvspec/conformance/domain.py": "an adapter's declared layouts: names it gives",
    "kvspec/conformance/adapter/": "adapter inputs: the adapter API hands names",
    "kvspec/conformance/reference.py": "the reference adapter, handed names as any is",
    "kvspec/adapters/": "engine adapters: the names engines and the suite hand them",
    "kvspec/conformance/checks/example_layouts.py": "an example is a JSON form (drawn, "
    "pinned, replayed, exported): a check reads its example's layout reference here",
    "kvspec/conformance/families/*/*mutants.py": "mutants are adapters: their methods are "
    "handed the names the suite hands any adapter",
    "kvspec/conformance/families/*/*vectors.py": "golden vector builders: a vector is a "
    "file that names its layouts",
}
"""The parse boundaries: where a layout's name comes in from outside (a command line, a
file or form, an adapter's inputs) and is resolved into the value handed on; a path ending
in ``/`` is a folder, one with ``*`` a pattern of files (each must match one)."""


@dataclass(frozen=True)
class Lookup:
    """One lookup by name: the file (relative to the repository root), the line, and the
    code of the call."""

    path: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


def _params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The parameters of ``function`` annotated ``LayoutRef``."""
    args = function.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return {
        a.arg
        for a in every
        if a.annotation is not None and REF in ast.unparse(a.annotation).replace('"', "")
    }


def _is_lookup(node: ast.AST, tables: frozenset[str]) -> ast.expr | None:
    """The looked-up argument of ``node`` if it is a lookup by name, else None."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == "get_layout":
            return node.args[0]
        if (
            name == "get"
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in tables
        ):
            return node.args[0]
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in tables
        and not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str))
    ):
        return node.slice
    return None


def _tables(tree: ast.AST) -> frozenset[str]:
    """The names the preset tables go by in a module: those of :data:`TABLES` it imports
    from ``kvspec.memory`` (``PRESETS`` of the model presets is another table)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvspec.memory"):
            names |= {a.asname or a.name for a in node.names if a.name in TABLES}
    return frozenset(names)


def lookups_in(source: str, path: str) -> list[Lookup]:
    """Every undeclared lookup by name in ``source`` (a module's text), boundaries aside:
    a lookup of a ``LayoutRef`` parameter of the function it is in is declared."""
    found: list[Lookup] = []
    tree = ast.parse(source, filename=path)
    tables = _tables(tree)

    def visit(node: ast.AST, refs: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            refs = refs | _params(node)
        arg = _is_lookup(node, tables)
        if arg is not None and not (isinstance(arg, ast.Name) and arg.id in refs):
            found.append(Lookup(path, getattr(node, "lineno", 0), ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, refs)

    visit(tree, set())
    return found


def _matches(path: str, boundary: str) -> bool:
    if "*" in boundary:
        return fnmatch.fnmatchcase(path, boundary)
    return path == boundary or (boundary.endswith("/") and path.startswith(boundary))


def is_boundary(path: str) -> bool:
    return any(_matches(path, b) for b in BOUNDARIES)


def package_lookups() -> list[Lookup]:
    """Every undeclared lookup by name in :data:`PACKAGES`, outside :data:`BOUNDARIES`."""
    found: list[Lookup] = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            if not is_boundary(path):
                found += lookups_in(file.read_text(), path)
    return found


def boundary_files() -> list[Path]:
    """The files and folders :data:`BOUNDARIES` names, as paths under the root: a pattern's
    first match (or the pattern itself, which then does not exist, when it matches none)."""
    found = []
    for b in BOUNDARIES:
        matches = sorted(ROOT.glob(b)) if "*" in b else [ROOT / b.rstrip("/")]
        found.append(matches[0] if matches else ROOT / b)
    return found
