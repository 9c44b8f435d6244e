"""The README's and the docs pages' examples are true: their Python blocks run and their
console transcripts match; their links reach what they name; the site's nav lists every
page; the clause families of docs/rules.md are the spec's."""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from kvspec.cli import main
from sim.cli import main as sim_main
from tests.paths import ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)

GENERATED = {
    "docs/clauses.md": "kvspec clauses --markdown (tests/spec/test_clauses.py); no code blocks",
    "docs/adapter-api.md": "kvspec adapter doc (tests/suite/test_adapter_api.py); no code blocks",
    "docs/field-report.md": "python -m field.report, from make field's reports; no code blocks",
}
"""Pages written by code, compared with what the code renders by their own tests."""

RENDERED_NOTEBOOKS = "docs/notebooks/"
"""tools/render_notebooks.py's pages: their python blocks are notebook cells, run from the
notebooks themselves by tests/docs/test_notebooks.py (they share state from cell to cell and
draw figures), and their console block is a `jupyter execute` line, not a transcript."""


def _page_names() -> list[str]:
    """README.md and every hand-written page under docs/, as paths from the root."""
    pages = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md"))]
    return [p for p in pages if p not in GENERATED and not p.startswith(RENDERED_NOTEBOOKS)]


PAGES = _page_names()


def _blocks(page: str, language: str) -> list[str]:
    text = (ROOT / page).read_text()
    return [body for lang, body in BLOCK.findall(text) if lang == language]


def _transcripts(page: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) for every `$ .venv/bin/...` line of a console block."""
    found = []
    for body in _blocks(page, "console"):
        current: tuple[str, list[str]] | None = None
        for line in body.splitlines():
            if line.startswith("$ "):
                current = (line[2:], [])
                found.append(current)
            elif current is not None:
                current[1].append(line)
    return found


PYTHON_BLOCKS = [(page, i) for page in PAGES for i in range(len(_blocks(page, "python")))]
TRANSCRIPTS = [(page, *t) for page in PAGES for t in _transcripts(page)]


@pytest.mark.parametrize(
    ("page", "index"), PYTHON_BLOCKS, ids=[f"{p}-{i}" for p, i in PYTHON_BLOCKS]
)
def test_python_block_runs(page: str, index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader runs the blocks from the checkout's root (`examples` is found there).
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    code = compile(_blocks(page, "python")[index], f"{page} python block {index}", "exec")
    exec(code, {})


@pytest.mark.parametrize(
    ("page", "command", "shown"),
    TRANSCRIPTS,
    ids=[f"{page}-{command[:60]}" for page, command, _ in TRANSCRIPTS],
)
def test_console_transcript(
    page: str, command: str, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(command, comments=True)
    if words[:3] == [".venv/bin/python", "-m", "sim"]:
        code = sim_main(words[3:])
    else:
        assert words[0] == ".venv/bin/kvspec", f"{page} runs only kvspec and sim: {command}"
        code = main(words[1:])
    out, err = capsys.readouterr()
    annotated = re.search(r"exit (\d+)", command)
    expected_code = int(annotated.group(1)) if annotated else 0
    assert code == expected_code
    printed = (out + err).splitlines()
    for line in shown:
        if line == "...":
            continue
        # "..." inside a shown line stands for text that varies from run to run
        pattern = re.compile(".*?".join(re.escape(part) for part in line.split("...")))
        assert any(pattern.fullmatch(p) for p in printed), line


def test_the_conformance_page_shows_the_example_adapter_verbatim() -> None:
    adapter = (ROOT / "examples" / "field_adapter.py").read_text()
    assert adapter in _blocks("docs/conformance.md", "python")


def test_the_readme_shows_a_short_adapter() -> None:
    """The README's adapter (run by test_python_block_runs) stays about twenty lines."""
    (adapter,) = [b for b in _blocks("README.md", "python") if "(Adapter, " in b]
    assert len(adapter.strip().splitlines()) <= 25


def test_the_readme_keeps_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    (commands,) = [b for lang, b in BLOCK.findall(text) if lang == "console" and "make run" in b]
    assert [line.split()[:2] for line in commands.splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]


def test_every_page_has_its_blocks_tested_or_is_excluded_for_a_reason() -> None:
    """A page under docs/ is tested here unless it is generated (GENERATED) or a rendered
    notebook: a new page is picked up without editing this file."""
    every = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md"))
    left_out = [p for p in every if p not in PAGES]
    assert all(p in GENERATED or p.startswith(RENDERED_NOTEBOOKS) for p in left_out)
    for page in GENERATED:
        assert (ROOT / page).is_file(), page
        assert not BLOCK.findall((ROOT / page).read_text()), f"{page} has code blocks now"


# -- links --------------------------------------------------------------------------------

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\]\(([^)\s]+)\)")
REFERENCE = re.compile(r"^\[[^\]\n]+\]:[ \t]*(\S+)", re.M)
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def _prose(text: str) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it (MkDocs' toc makes the same for these pages:
    `mkdocs build --strict` checks its own)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


LINKED_PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_relative_link_reaches_its_file_and_anchor(page: str) -> None:
    path = ROOT / page
    prose = _prose(path.read_text())
    broken = []
    for target in INLINE_LINK.findall(prose) + REFERENCE.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif linked.is_dir():  # mkdocs --strict refuses a link to a folder (make docs)
            broken.append(f"{target}: a folder, not a file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading in {linked.relative_to(ROOT)}")
    assert not broken, f"{page}: " + "; ".join(broken)


def test_the_slugs_are_githubs() -> None:
    assert slug("What `make run` shows") == "what-make-run-shows"
    assert slug("Two data paths: ZMQ and torch.distributed") == (
        "two-data-paths-zmq-and-torchdistributed"
    )
    assert slug("Today's cache layouts, and the bytes a pull connector moves") == (
        "todays-cache-layouts-and-the-bytes-a-pull-connector-moves"
    )


# -- the site -----------------------------------------------------------------------------

NAV_ENTRY = re.compile(r"^\s+- (?:(?:\"[^\"]*\"|[^:\"]+): )?(\S+\.md)\s*$")


def _nav() -> list[str]:
    """The pages of mkdocs.yml's nav (read without YAML: every `- Title: page.md` line
    under `nav:`; a section is a `- Title:` line with nothing after the colon)."""
    lines = (ROOT / "mkdocs.yml").read_text().splitlines()
    nav = lines[lines.index("nav:") + 1 :]
    pages = []
    for line in nav:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert line.startswith(" "), f"mkdocs.yml: nav must be last, found {line!r}"
        match = NAV_ENTRY.match(line)
        if match:
            pages.append(match.group(1))
        else:
            assert line.rstrip().endswith(":"), f"mkdocs.yml: not a nav entry: {line!r}"
    return pages


def test_the_nav_lists_every_page_once_and_only_pages_that_exist() -> None:
    nav = _nav()
    assert len(nav) == len(set(nav)), "a page twice in the nav"
    assert nav[0] == "index.md"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, (
        f"in the nav, not under docs/: {sorted(set(nav) - set(pages))}; "
        f"under docs/, not in the nav: {sorted(set(pages) - set(nav))}"
    )


def test_the_readme_links_every_page() -> None:
    """The README's "where things live" reaches every page but the home (which is the
    README) and the rendered notebooks (the notebooks page links them)."""
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in INLINE_LINK.findall(_prose((ROOT / "README.md").read_text()))
    }
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert page.resolve() in linked, f"the README does not link {page.name}"


def test_the_site_home_is_the_readme_with_its_links_made_relative_to_docs() -> None:
    hooks = _tool("mkdocs_hooks")  # imports mkdocs only when MkDocs calls a hook
    text = hooks.readme_for_docs(
        "[a](docs/sim.md#x) [b](sim/paths/pull.py) [c](#here) [d](https://x.org)\n"
        "```python\nx[0](y)\n```\n[E-1]: docs/clauses.md#e\n"
    )
    assert text == (
        "[a](sim.md#x) [b](../sim/paths/pull.py) [c](#here) [d](https://x.org)\n"
        "```python\nx[0](y)\n```\n[E-1]: clauses.md#e\n"
    )


# -- generated tables ---------------------------------------------------------------------


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_clause_families_are_the_ones_the_spec_declares() -> None:
    families = _tool("clause_families")
    committed = (DOCS / "rules.md").read_text()
    assert families.render(committed) == committed, "run: python tools/clause_families.py"
    from kvspec.core.clauses import all_clauses

    for clause in all_clauses().values():
        assert f" {clause.id} {clause.title}" in committed
