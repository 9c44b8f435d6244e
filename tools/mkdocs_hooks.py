"""MkDocs hooks of the docs site (``mkdocs.yml``: ``hooks``); ``make docs`` builds it.

The pages are written to be read in the repository too, where a link such as
``../sim/paths/pull.py`` or ``../README.md`` works as it is. On the site:

- the home page is the README itself: ``docs/index.md`` only names it, and
  :func:`on_page_markdown` puts the README's text there with its links made relative
  to ``docs/`` (``docs/sim.md`` -> ``sim.md``, ``examples/x.py`` -> ``../examples/x.py``);
  a page's link to ``../README.md`` goes to the home page;
- :func:`on_files` adds every file of the repository outside ``docs/`` that a page (or
  the README) links to, as it is, under ``repo/``, so those links work on the site as
  well. Only files that exist are added: a link to a missing file still fails
  ``mkdocs build --strict``.

Nothing here imports mkdocs until MkDocs calls a hook, so ``tests/docs/test_readme.py`` tests
the link rewriting without it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.structure.files import Files

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
INLINE_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
REFERENCE = re.compile(r"^(\[[^\]\n]+\]:[ \t]*)(\S+)", re.M)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def _outside_fences(text: str, change) -> str:
    """``text`` with ``change`` applied to everything but its fenced code blocks."""
    out, last = [], 0
    for fence in FENCE.finditer(text):
        out += [change(text[last : fence.start()]), fence.group(0)]
        last = fence.end()
    return "".join([*out, change(text[last:])])


def _retarget(text: str, retarget) -> str:
    """``text`` with every link target (inline or reference) passed through ``retarget``."""

    def change(prose: str) -> str:
        prose = INLINE_LINK.sub(lambda m: m.group(1) + retarget(m.group(2)) + m.group(3), prose)
        return REFERENCE.sub(lambda m: m.group(1) + retarget(m.group(2)), prose)

    return _outside_fences(text, change)


def _targets(text: str) -> list[str]:
    found: list[str] = []
    _retarget(text, lambda target: found.append(target) or target)
    return found


def readme_for_docs(readme: str) -> str:
    """The README's text as ``docs/index.md``: links relative to the repository's root
    made relative to ``docs/``."""

    def retarget(target: str) -> str:
        if SCHEME.match(target) or target.startswith(("#", "/")):
            return target
        return target[len("docs/") :] if target.startswith("docs/") else "../" + target

    return _retarget(readme, retarget)


def _readme(config: Any) -> Path:
    return Path(config["docs_dir"]).parent / "README.md"


def _repository_file(uri: str, docs: Path, config: Any, dest_uri: str):
    """A file of the repository outside ``docs/``, copied to the site as it is (a
    Markdown file among them is not made a page)."""
    from mkdocs.structure.files import File, InclusionLevel

    class RepositoryFile(File):
        def is_documentation_page(self) -> bool:
            return False

        def is_static_page(self) -> bool:
            return False

        def is_media_file(self) -> bool:
            return True

    return RepositoryFile(
        uri,
        str(docs),
        config["site_dir"],
        config["use_directory_urls"],
        dest_uri=dest_uri,
        inclusion=InclusionLevel.INCLUDED,  # not hidden for its leading '..'
    )


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    sources = [
        (page.src_uri, Path(page.abs_src_path).read_text(encoding="utf-8"))
        for page in files.documentation_pages()
    ]
    sources.append(("index.md", readme_for_docs(_readme(config).read_text(encoding="utf-8"))))
    for src_uri, text in sources:
        for target in _targets(text):
            if SCHEME.match(target) or target.startswith(("#", "/")):
                continue
            path = target.split("#", 1)[0]
            uri = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), path))
            if not uri.startswith("../") or files.get_file_from_path(uri) is not None:
                continue
            local = (docs / uri).resolve()
            if local == _readme(config).resolve() or not local.is_file():
                continue
            dest_uri = "repo/" + local.relative_to(root).as_posix()
            files.append(_repository_file(uri, docs, config, dest_uri))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == "index.md":
        markdown = readme_for_docs(_readme(config).read_text(encoding="utf-8"))
    depth = page.file.src_uri.count("/")
    readme = "../" * (depth + 1) + "README.md"
    home = "../" * depth + "index.md"

    def retarget(target: str) -> str:
        if target == readme or target.startswith(readme + "#"):
            return home + target[len(readme) :]
        return target

    return _retarget(markdown, retarget)
