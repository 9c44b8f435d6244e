"""The clause registry, the generated docs table, and clause citations in the code."""

import re

from kvspec.core.clauses import all_clauses, clause_table_markdown
from tests.paths import ROOT

CITATION = re.compile(r"\b([A-Z]+)-(\d+)(?:\.\.(\d+))?\b")


def _cited_ids(text: str) -> set[str]:
    ids = set()
    for family, first, last in CITATION.findall(text):
        for n in range(int(first), int(last or first) + 1):
            ids.add(f"{family}-{n}")
    return ids


def _spec_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "kvspec").rglob("*.py")))


def test_docs_table_is_generated_from_the_registry() -> None:
    committed = (ROOT / "docs" / "clauses.md").read_text()
    assert committed == clause_table_markdown(), "run: kvspec clauses --markdown > docs/clauses.md"


def test_every_clause_is_cited_outside_its_declaration() -> None:
    sources = _spec_sources()
    declared = set(re.findall(r'Clause\(\s*"([A-Z]+-\d+)"', sources))
    assert declared == set(all_clauses())
    without_declarations = re.sub(r'Clause\(\s*"[A-Z]+-\d+"', "", sources)
    uncited = set(all_clauses()) - _cited_ids(without_declarations)
    assert not uncited, f"clauses no code cites: {sorted(uncited)}"


def test_every_citation_names_a_known_clause() -> None:
    cited = {
        c
        for c in _cited_ids(_spec_sources())
        if c.split("-")[0] in {cl.family for cl in all_clauses().values()}
    }
    assert cited <= set(all_clauses()), sorted(cited - set(all_clauses()))
