"""The clause families as folders: each holds one family's checks, refusal checks, mutants,
golden-vector builders and error cases, and never imports another family.

A family folder is a package of :data:`FAMILIES`, its ``__init__`` naming the clause
families it holds (``CLAUSE_FAMILIES``); its modules are found by name: ``checks.py``
and ``*_checks.py`` (checks), ``mutants.py`` and ``*_mutants.py`` (mutants),
``errors.py`` (error cases), ``vectors.py`` and ``*_vectors.py`` (vector families, exported
in the order :data:`kvspec.conformance.vectors.FAMILIES` declares), ``protocol.py`` (the
family's adapter capability protocols, gathered by
:mod:`kvspec.conformance.adapter.protocols`). A check or mutant lies in the folder of a
clause family it serves. What families share is in
:mod:`kvspec.conformance.draws` (drawing inputs: transfer cases on tensors, and its
``hybrids``, ``records`` and ``messages``) and :mod:`kvspec.conformance.refusals`
(probing refusals).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvspec.error_cases import ErrorCase

FAMILIES: tuple[str, ...] = (
    "ownership",
    "models",
    "routing",
    "transfer",
    "layouts",
    "paged",
    "descriptors",
    "oracle",
    "groups",
    "indexer",
    "naming",
    "payloads",
    "chunks",
    "streaming",
    "wire",
    "lifecycle",
)
"""Every family folder, in clause-table order of the first clause family each holds."""

Part = Literal["checks", "mutants", "errors", "vectors"]


def modules(part: Part) -> list[str]:
    """The modules of every family holding ``part``, family by family, by name."""
    found = []
    for family in FAMILIES:
        package = importlib.import_module(f"{__name__}.{family}")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if info.name == part or info.name.endswith(f"_{part}"):
                found.append(f"{package.__name__}.{info.name}")
    return found


def owner(clause_family: str) -> str:
    """The family folder holding ``clause_family`` (``CP`` -> ``ownership``)."""
    for family in FAMILIES:
        package = importlib.import_module(f"{__name__}.{family}")
        if clause_family in package.CLAUSE_FAMILIES:
            return family
    raise KeyError(f"no family folder holds the clause family {clause_family!r}")


def error_cases() -> tuple[ErrorCase, ...]:
    """Every family's error cases, family by family (the golden ``errors`` vectors export
    them in :data:`~kvspec.conformance.vectors.errors.EXPORT_ORDER`, not this order)."""
    return tuple(
        case for name in modules("errors") for case in importlib.import_module(name).ERROR_CASES
    )
