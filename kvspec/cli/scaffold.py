"""The adapter scaffold of ``kvspec adapter new``: the template
(``kvspec/conformance/templates/adapter.py.tmpl``) read into sections, one per capability
protocol, and rendered with the protocols asked for (``--with routing,layouts``; default:
every one), their imports and the class's bases. Stdlib only, so the CLI starts without
torch: the protocols' names are read from the template, whose protocols a test holds to
kvspec's."""

from __future__ import annotations

import difflib
import keyword
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from string import Template

TEMPLATE = ("conformance", "templates", "adapter.py.tmpl")
"""Where the scaffold's template lies inside the kvspec package."""

LINE = 100
"""The line length the written module is formatted to (the project's, ruff's)."""


@dataclass
class Section:
    """A run of template lines: ``text`` (always written), ``heading`` (written before the
    first protocol written after it), ``protocol`` (one capability's methods) or
    ``helper`` (written when a protocol written uses it), and what it needs imported."""

    kind: str
    key: str = ""
    protocol: str = ""
    lines: list[str] = field(default_factory=list)
    imports: list[tuple[str, str]] = field(default_factory=list)
    uses: set[str] = field(default_factory=set)


def sections() -> list[Section]:
    """The template read into its sections, in order."""
    text = files("kvspec").joinpath(*TEMPLATE).read_text(encoding="utf-8")
    found: list[Section] = []
    for line in text.splitlines():
        if not line.startswith("#%"):
            if found:
                found[-1].lines.append(line)
            continue
        words = line[2:].split()
        if not words or words[0] == "#":  # a comment of the template's own
            continue
        if words[0] == "text" or words[0] == "heading":
            found.append(Section(words[0]))
        elif words[0] == "protocol":
            found.append(Section("protocol", key=words[1], protocol=words[2]))
        elif words[0] == "helper":
            found.append(Section("helper", key=words[1]))
        elif words[0] == "import":
            found[-1].imports += [(words[1], name) for name in words[2:]]
        elif words[0] == "uses":
            found[-1].uses.add(words[1])
    return found


def capabilities() -> list[str]:
    """Every capability the template has a protocol for, in its order."""
    return [s.key for s in sections() if s.kind == "protocol"]


def with_problem(asked: Sequence[str]) -> str | None:
    """Why ``asked`` (the ``--with`` names) cannot be written, or None."""
    known = capabilities()
    if not asked:
        return f"--with names no capability; the capabilities are {', '.join(known)}"
    unknown = [a for a in asked if a not in known]
    if not unknown:
        return None
    close = {u: difflib.get_close_matches(u, known, n=1) for u in unknown}
    hints = [f"{c[0]} for {u}" for u, c in close.items() if c]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    return (
        f"--with names no capability {', '.join(map(repr, unknown))}{hint}; the capabilities "
        f"are {', '.join(known)}"
    )


def scaffold(name: str, class_name: str, asked: Iterable[str] | None = None) -> str:
    """The text of the adapter module ``name``.py implementing the protocols of ``asked``
    (every capability when None), ruff-clean as written."""
    parts = sections()
    chosen = set(capabilities() if asked is None else asked)
    protocols = [s for s in parts if s.kind == "protocol" and s.key in chosen]
    helpers = {h for s in protocols for h in s.uses}
    written: list[Section] = []
    for i, section in enumerate(parts):
        if section.kind == "heading":
            following = []
            for later in parts[i + 1 :]:
                if later.kind == "heading":
                    break
                following.append(later)
            keep = any(s.kind == "protocol" and s.key in chosen for s in following)
        else:
            keep = (
                section.kind == "text"
                or (section.kind == "protocol" and section.key in chosen)
                or (section.kind == "helper" and section.key in helpers)
            )
        if keep:
            written.append(section)
    imports = [pair for s in written for pair in s.imports]
    imports += [("kvspec.conformance.adapter.protocols", s.protocol) for s in protocols]
    bases = ["Adapter", *(s.protocol for s in protocols)]
    text = _tidy([line for s in written for line in s.lines])
    return Template(text).substitute(
        name=name,
        class_name=class_name,
        imports=_imports(imports),
        bases=_statement(f"class {class_name}", bases, ":"),
        count=len(protocols),
        total=len(capabilities()),
    )


def _tidy(lines: list[str]) -> str:
    """``lines`` with each run of blank lines as ruff format leaves it: one before an
    indented line (inside the class), at most two before a top-level one."""
    out: list[str] = []
    blanks = 0
    for line in lines:
        if not line.strip():
            blanks += 1
            continue
        if out:
            out += [""] * min(blanks, 1 if line.startswith(" ") else 2)
        blanks = 0
        out.append(line)
    return "\n".join(out) + "\n"


def _imports(pairs: Iterable[tuple[str, str]]) -> str:
    """``from M import a, b`` lines, the standard library's first, as isort orders them."""
    by_module: dict[str, set[str]] = {}
    for module, name in pairs:
        by_module.setdefault(module, set()).add(name)
    blocks: list[list[str]] = [[], []]
    for module in sorted(by_module):
        names = sorted(by_module[module], key=_name_order)
        line = _statement(f"from {module} import ", names, "", bare=True)
        blocks[module.split(".")[0] == "kvspec"].append(line)
    return "\n\n".join("\n".join(b) for b in blocks if b)


def _statement(head: str, items: list[str], tail: str, *, bare: bool = False) -> str:
    """``head(a, b)tail`` on one line where it fits, else one item a line (ruff's format);
    ``bare``: no parentheses on one line (an import)."""
    one = f"{head}{', '.join(items)}{tail}" if bare else f"{head}({', '.join(items)}){tail}"
    if len(one) <= LINE:
        return one
    inner = "".join(f"    {item},\n" for item in items)
    return f"{head}(\n{inner}){tail}"


def _name_order(name: str) -> tuple[int, str]:
    """isort's order by type: constants, then classes, then the rest."""
    if name.isupper() and not keyword.iskeyword(name):
        return (0, name)
    return (1 if name[:1].isupper() else 2, name)
