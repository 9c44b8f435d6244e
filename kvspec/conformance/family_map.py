"""Where each clause family lives: its folder (``kvspec/conformance/families/<family>/``:
its checks, mutants, vector builders and error cases), its spec modules and its tests —
read from the registries themselves, so the map cannot rot.

``kvspec clauses --map`` prints it; a newcomer changing one rule reads it first. What
cites the family from another folder (a check of another family that also covers one of
its obligations) is counted under that folder.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvspec.core.clauses import SPEC_MODULES, all_clauses, declared_clauses


@dataclass(frozen=True)
class FamilyMap:
    """One family's pieces; each tally maps a file (or vector family) to how many it holds."""

    family: str
    clauses: tuple[str, ...]
    spec: tuple[str, ...]
    folder: str
    """The family folder holding its pieces: ``kvspec/conformance/families/<family>/``."""
    errors: dict[str, int] = field(default_factory=dict)
    """Folder -> error cases of the family's clauses there (its own folder only)."""
    checks: dict[str, int] = field(default_factory=dict)
    """Folder -> checks covering one of the family's obligations, its own folder first."""
    mutants: dict[str, int] = field(default_factory=dict)
    """Folder -> mutants breaking one of the family's obligations, its own folder first."""
    vectors: dict[str, int] = field(default_factory=dict)
    """Vector family -> its cases citing one of the family's clauses."""
    vector_modules: dict[str, str] = field(default_factory=dict)
    """Vector family (each of ``vectors``) -> the module holding its export and check."""
    tests: tuple[str, ...] | None = None
    """Test files citing the family's clauses; None where no tests are at hand (a wheel)."""


def _folder_of(path: str) -> str:
    """The family folder of a file path, else the path itself."""
    parts = path.split("/")
    if parts[:3] == ["kvspec", "conformance", "families"] and len(parts) > 4:
        return "/".join(parts[:4]) + "/"
    return path


def _folder(module: str) -> str:
    """The family folder of a family module, else the module's file."""
    return _folder_of(_path(module))


def _first(home: str, tally: dict[str, int]) -> dict[str, int]:
    """``tally`` with the family's own folder first."""
    return dict(sorted(tally.items(), key=lambda item: item[0] != home))


def _path(module: str) -> str:
    """The file of ``module`` in the repository: a package's is its ``__init__.py``."""
    spec = importlib.util.find_spec(module)
    package = spec is not None and spec.submodule_search_locations is not None
    return module.replace(".", "/") + ("/__init__.py" if package else ".py")


def _family(clause_or_obligation: str) -> str:
    return clause_or_obligation.split("-", 1)[0]


def _tally(pairs: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """family -> file -> count, each file in first-seen order."""
    out: dict[str, Counter[str]] = {}
    for family, where in pairs:
        out.setdefault(family, Counter())[where] += 1
    return {f: dict(c) for f, c in out.items()}


def _vector_families(manifest: Path) -> dict[str, dict[str, int]]:
    """family -> vector family -> cases citing one of the family's clauses."""
    families = json.loads(manifest.read_text())["families"]
    pairs = []
    for name, cases in families.items():
        for case in cases:
            # an error vector names one clause (``clause``), every other vector a list
            cited = case.get("clauses") or ([case["clause"]] if "clause" in case else [])
            for fam in sorted({_family(c) for c in cited}):
                pairs.append((fam, name))
    return _tally(pairs)


def _test_files(tests: Path, families: list[str]) -> dict[str, tuple[str, ...]]:
    """family -> test files (relative to ``tests``' parent) citing one of its clause ids."""
    cited: dict[str, list[str]] = {f: [] for f in families}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, families)) + r")-\d")
    for path in sorted(tests.rglob("test_*.py")):
        for fam in sorted(set(pattern.findall(path.read_text()))):
            cited[fam].append(path.relative_to(tests.parent).as_posix())
    return {f: tuple(v) for f, v in cited.items()}


def family_map(*, tests: Path | None = None) -> list[FamilyMap]:
    """Every family in clause-table order; ``tests`` is a checkout's ``tests/`` to search."""
    from kvspec.conformance.checks import all_checks
    from kvspec.conformance.families import error_cases, owner
    from kvspec.conformance.mutants import all_mutants
    from kvspec.conformance.vectors import FAMILIES, GOLDEN_DIR

    clauses = all_clauses()
    families = list(dict.fromkeys(c.family for c in clauses.values()))
    spec: dict[str, list[str]] = {f: [] for f in families}
    for module in SPEC_MODULES:
        for fam in dict.fromkeys(c.family for c in declared_clauses(module)):
            spec[fam].append(_path(module))
    checks = _tally(
        [
            (fam, _folder(c.run.__module__))
            for c in all_checks()
            for fam in dict.fromkeys(_family(o) for o in c.covers)
        ]
    )
    mutants = _tally(
        [
            (fam, _folder(m.cls.__module__))
            for m in all_mutants()
            for fam in dict.fromkeys(_family(o) for o in m.obligations)
        ]
    )
    folders = {f: f"kvspec/conformance/families/{owner(f)}/" for f in families}
    errors = _tally([(_family(e.clause), folders[_family(e.clause)]) for e in error_cases()])
    vectors = _vector_families(GOLDEN_DIR / "manifest.json")
    vector_modules = {v.name: _path(v.export.__module__) for v in FAMILIES}
    cited = _test_files(tests, families) if tests is not None else None
    return [
        FamilyMap(
            family=f,
            clauses=tuple(c.id for c in clauses.values() if c.family == f),
            spec=tuple(spec[f]),
            folder=folders[f],
            errors=errors.get(f, {}),
            checks=_first(folders[f], checks.get(f, {})),
            mutants=_first(folders[f], mutants.get(f, {})),
            vectors=vectors.get(f, {}),
            vector_modules={v: vector_modules[v] for v in vectors.get(f, {})},
            tests=None if cited is None else cited[f],
        )
        for f in families
    ]


def _counted(tally: dict[str, int], home: str) -> str:
    """``N`` for the family's own folder, ``elsewhere (N)`` for the rest."""
    return (
        ", ".join(f"{n}" if where == home else f"{where} ({n})" for where, n in tally.items())
        or "none"
    )


def render_family_map(rows: list[FamilyMap]) -> str:
    """One block per family: what to open to change one of its rules."""
    lines = []
    for row in rows:
        lines.append(f"{row.family}  ({', '.join(row.clauses)})")
        lines.append(f"  folder    {row.folder}")
        lines.append(f"  spec      {', '.join(row.spec)}")
        lines.append(f"  errors    {_counted(row.errors, row.folder)}")
        lines.append(f"  checks    {_counted(row.checks, row.folder)}")
        lines.append(f"  mutants   {_counted(row.mutants, row.folder)}")
        vectors = {
            # the errors vectors are the family's own error cases
            name
            if name == "errors" or _folder_of(row.vector_modules[name]) == row.folder
            else f"{name} in {_folder_of(row.vector_modules[name])}": n
            for name, n in row.vectors.items()
        }
        lines.append(f"  vectors   {', '.join(f'{v} ({n})' for v, n in vectors.items()) or 'none'}")
        if row.tests is None:
            lines.append("  tests     (in the source checkout's tests/)")
        else:
            lines.append(f"  tests     {', '.join(row.tests) or 'none'}")
    return "\n".join(lines) + "\n"
