"""`kvspec clauses --map`: each family's files, read from the registries, every one real."""

from __future__ import annotations

import importlib
import json
import re

import pytest

from kvspec.cli import main
from kvspec.conformance.checks import all_checks
from kvspec.conformance.families import error_cases
from kvspec.conformance.family_map import family_map, render_family_map
from kvspec.conformance.mutants import all_mutants
from kvspec.conformance.vectors import FAMILIES
from kvspec.core.clauses import all_clauses
from tests.paths import ROOT

ERROR_CASES = error_cases()

MAP = family_map(tests=ROOT / "tests")


def test_every_family_once_in_clause_order() -> None:
    families = list(dict.fromkeys(c.family for c in all_clauses().values()))
    assert [row.family for row in MAP] == families
    assert sorted(c for row in MAP for c in row.clauses) == sorted(all_clauses())


def test_every_file_named_exists_and_declares_or_cites_the_family() -> None:
    for row in MAP:
        for path in row.spec:  # the spec module declares one of the family's clauses
            assert re.search(rf'"{row.family}-\d+"', (ROOT / path).read_text()), (row.family, path)
        assert (ROOT / row.folder / "__init__.py").is_file(), row.family
        for path in (*row.errors, *row.checks, *row.mutants, *(row.tests or ())):
            assert (ROOT / path).exists(), (row.family, path)
        for path in row.tests or ():
            assert re.search(rf"\b{row.family}-\d", (ROOT / path).read_text()), path


def test_each_vector_family_is_named_by_the_module_holding_its_export_and_check() -> None:
    """The vectors column names a module of kvspec/conformance/vectors/ per vector family,
    and that module's FAMILY is the family the manifest's cases came from."""
    modules = {f.name: f.export.__module__ for f in FAMILIES}
    for row in MAP:
        assert set(row.vector_modules) == set(row.vectors), row.family
        for name, path in row.vector_modules.items():
            assert path == modules[name].replace(".", "/") + ".py", (row.family, name)
            assert path.startswith(("kvspec/conformance/families/", "kvspec/conformance/vectors/"))
            assert (ROOT / path).is_file()
            assert importlib.import_module(modules[name]).FAMILY.name == name
    for row in MAP:  # a family's error cases are in its own folder
        assert set(row.errors) <= {row.folder}, row.family


def test_the_tallies_count_every_check_mutant_and_error_case() -> None:
    """Each check and mutant counted once per family it serves, in the file defining it."""
    pairs = {(o.split("-")[0], c.id) for c in all_checks() for o in c.covers}
    assert sum(n for row in MAP for n in row.checks.values()) == len(pairs)
    pairs = {(o.split("-")[0], m.name) for m in all_mutants() for o in m.obligations}
    assert sum(n for row in MAP for n in row.mutants.values()) == len(pairs)
    assert sum(n for row in MAP for n in row.errors.values()) == len(ERROR_CASES)


def test_every_golden_vector_is_counted_under_the_families_it_cites() -> None:
    """Error vectors name one ``clause``, the rest a list of ``clauses``: each is counted
    once per family it cites, so no vector family is missing from the map."""
    manifest = json.loads((ROOT / "kvspec/conformance/golden/manifest.json").read_text())
    for name, cases in manifest["families"].items():
        cited = [
            {c.split("-")[0] for c in case.get("clauses") or [case["clause"]]} for case in cases
        ]
        expected: dict[str, int] = {}
        for families in cited:
            for family in families:
                expected[family] = expected.get(family, 0) + 1
        counted = {row.family: row.vectors[name] for row in MAP if name in row.vectors}
        assert counted == expected, name
    assert sum(row.vectors.get("errors", 0) for row in MAP) == len(manifest["families"]["errors"])


def test_the_issue_example_cp_is_where_the_code_puts_it() -> None:
    """CP's rule lives in topology/tokens.py, its checks, mutants and error cases in the
    ownership folder, listed first."""
    cp = next(row for row in MAP if row.family == "CP")
    assert "kvspec/topology/tokens.py" in cp.spec
    assert cp.folder == "kvspec/conformance/families/ownership/"
    for tally in (cp.checks, cp.mutants, cp.errors):
        assert next(iter(tally)) == cp.folder
    assert "tokens" in cp.vectors and "tests/spec/test_parallel_layouts.py" in (cp.tests or ())


def test_the_cli_prints_a_family_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["clauses", "--map", "lay"]) == 0
    out = capsys.readouterr().out
    assert out == render_family_map([r for r in MAP if r.family.startswith("LAY")])
    assert main(["clauses", "--map", "NOPE"]) == 1
    assert "no clause family starts with 'NOPE'" in capsys.readouterr().out


def test_without_a_checkout_the_tests_column_says_where_they_are() -> None:
    rendered = render_family_map(family_map(tests=None)[:1])
    assert "tests     (in the source checkout's tests/)" in rendered
