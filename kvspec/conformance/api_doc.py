"""The adapter API reference, ``docs/adapter-api.md``, rendered from the code itself.

Everything on the page is read from what the suite runs: the capability protocols, family
by family (:data:`~kvspec.conformance.adapter.PROTOCOLS`), their methods' signatures and
docstrings, the base's attributes and hooks (:class:`~kvspec.conformance.adapter.Adapter`),
the schema of the refusal
methods' ``config`` (:mod:`kvspec.conformance.transfer_config`), the registered checks
and the obligations they cover (what must be produced, what must be refused), the
refusals held to an exception type (:data:`~kvspec.conformance.adapter.REFUSAL_TYPES`)
and the fields of every kvspec type a method takes or returns. ``kvspec adapter doc
--output docs/adapter-api.md`` regenerates the page; a test keeps it equal to
:func:`render`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvspec.conformance import domain as domain_module
from kvspec.conformance.adapter import (
    DECLARED,
    PROTOCOLS,
    REFUSAL_TYPES,
    VALIDATORS,
    Adapter,
    AdapterProtocol,
)
from kvspec.conformance.checks import Check, all_checks
from kvspec.conformance.transfer_config import (
    MODEL_KEYS,
    RANK_KEYS,
    STAGE_KEYS,
    TRANSFER_KEYS,
    Key,
    ModelFacts,
    RankConfig,
    StageConfig,
    TransferConfig,
)
from kvspec.core.clauses import all_obligations

COMMAND = "kvspec adapter doc --output docs/adapter-api.md"
"""The command that regenerates the page."""

ATTRIBUTES: tuple[str, ...] = (
    "name",
    "version",
    "domain",
    "policies",
    "policy_rules",
    "slicing_modes",
    "coalesces",
)
"""The data attributes an adapter may set, in the order the Adapter docstring lists them."""

HOOKS: tuple[str, ...] = ("supports",)
"""Methods an adapter may override that are no capability."""

CONFIG_TYPES: tuple[tuple[type, Mapping[str, Key]], ...] = (
    (TransferConfig, TRANSFER_KEYS),
    (StageConfig, STAGE_KEYS),
    (RankConfig, RANK_KEYS),
)
"""The schema of a refusal method's ``config``: each TypedDict and what its keys mean."""


def render() -> str:
    """The whole page, as Markdown."""
    checks = all_checks()
    sections = [
        _introduction(),
        _contents(),
        _attributes(),
        _config_section(),
        *(_family(family, protocols, checks) for family, protocols in _by_family().items()),
        _declared(checks),
        _types_section(),
    ]
    return "\n".join(s.rstrip("\n") + "\n" for s in sections)


# -- the parts of the page -----------------------------------------------------------------


def _introduction() -> str:
    return f"""# The adapter API

<!-- Rendered from the code by `{COMMAND}`; do not edit by hand
(tests/suite/test_adapter_api.py fails when the page and the code disagree). -->

An adapter plugs an implementation into the conformance suite: subclass
`kvspec.conformance.Adapter` and the capability protocols your implementation answers,
override every method of each, and run `kvspec conform MODULE:ATTR`: `class
MyConnector(Adapter, RoutingProtocol, LayoutsProtocol)` (from
`kvspec.conformance.adapter.protocols`) implements `sources`, `targets` and `read_layer`.
`kvspec adapter new NAME` writes `NAME.py`, an adapter implementing every protocol (or
those of `--with routing,layouts`) by calling kvspec's reference: it passes as it is, and
each method says which function of an engine goes in its place.
`kvspec.conformance.FullAdapter` is the base implementing every protocol.

How the suite reads an adapter:

- A **capability** is a protocol: a small class declared in its clause family's folder
  (`kvspec/conformance/families/<family>/protocol.py`), below family by family, each with
  its methods. An adapter's capabilities are the protocols it is an instance of, found by
  type. Override every method of each protocol you name. A protocol named but not fully
  overridden, a method spelled close to a protocol's, or a method that cannot take the
  arguments the suite always passes (the protocol method's required ones) is refused when
  the adapter loads (exit 2).
- Deprecated, for adapters written before the protocols: an `Adapter` subclass that
  overrides every method of a capability without naming its protocol is still found
  (registered as implementing it, with a `DeprecationWarning` naming the protocols to
  list); overriding only some of a capability's methods is refused at load, as before.
- A check that needs a capability the adapter does not provide is reported *not
  provided*: never failed, never counted as passed.
- **Refusing**: a method refuses an input by raising one of the adapter's
  `refusal_types` (default: `ValueError`, which kvspec's own errors are; declare your
  engine's error types there), except where a refusal below names its exception type. Any
  other exception (`IndexError`, an undeclared engine error) is a crash, tier `breaks`.
  A refusal whose message names none of the offending values (a value counts as named
  when it appears as a value, not inside a clause id such as `[PAGED-2]`) still passes;
  the check carries an `unclear` note. `NotProvided` is for a capability the adapter does
  not have.
- Inputs are kvspec's own frozen dataclasses and tensors ([Types](#types)); an adapter
  translates them into its implementation's terms and back. Keyword arguments that have a
  default (a token pool's `page_size`, a target `block_size`) are passed only to a method
  that takes them.
"""


def _contents() -> str:
    lines = [
        "## Contents\n",
        "- [Attributes and hooks](#attributes-and-hooks)",
        "- [The `config` of the refusal methods](#the-config-of-the-refusal-methods)",
    ]
    for family, protocols in _by_family().items():
        lines.append(f"- [The {family} family](#family-{family})")
        for p in protocols:
            methods = ", ".join(f"`{m}`" for m in p.methods)
            lines.append(f"  - [`{p.__name__}`](#{_anchor(p.capability)}): {methods}")
    lines += [
        "- [Capabilities an adapter declares](#capabilities-an-adapter-declares)",
        "- [Types](#types)",
    ]
    return "\n".join(lines) + "\n"


def _attributes() -> str:
    hints = _hints(Adapter)
    lines = [
        "## Attributes and hooks\n",
        "| attribute | type | default |",
        "|---|---|---|",
    ]
    for name in ATTRIBUTES:
        hint = hints.get(name, type(getattr(Adapter, name)))
        lines.append(
            f"| `{name}` | {_type_cell(hint)} | {_cell(_default(getattr(Adapter, name)))} |"
        )
    lines += ["", _markdown(_after_summary(inspect.getdoc(Adapter) or "")), ""]
    for name in HOOKS:
        hook = getattr(Adapter, name)
        lines += [_signature(name, hook), "", _markdown(inspect.getdoc(hook) or ""), ""]
    return "\n".join(lines)


def _config_section() -> str:
    validators = ", ".join(f"`{m}`" for m in VALIDATORS)
    lines = [
        "## The `config` of the refusal methods\n",
        f"Each refusal method ({validators}) is handed one plain-data configuration, a "
        "`TransferConfig`: the suite holds every configuration it hands out to this "
        "schema (kvspec/conformance/transfer_config.py). Engines refuse a bad configuration "
        "in different places (parallel sizes where they create process groups, layer "
        "partitions in their pipeline set-up, the pair of stages in the transfer code, model "
        "facts where the model loads, the stages' agreement in a handshake): one protocol "
        "each, so an adapter provides what its engine's code really does. Refusal probes "
        "change one fact at a time to step outside the spec, so a value may break its type "
        "on purpose (a size of 0, a head count of `'4'`); the keys never do. Raise to refuse the "
        "configuration; return to accept it.",
        "",
    ]
    for typed, keys in CONFIG_TYPES:
        hints = _hints(typed)
        required = typed.__required_keys__  # type: ignore[attr-defined]  # each is a TypedDict
        lines += [
            f'<a id="{_config_anchor(typed.__name__)}"></a>',
            f"### `{typed.__name__}`\n",
            _markdown(inspect.getdoc(typed) or ""),
            "",
            "| key | type | required | meaning | example | clauses |",
            "|---|---|---|---|---|---|",
        ]
        for key, about in keys.items():
            lines.append(
                f"| `{key}` | {_type_cell(hints[key])} | {'yes' if key in required else 'no'} "
                f"| {_cell(about.meaning, code=False)} | {_cell(repr(about.example))} "
                f"| {', '.join(about.clauses)} |"
            )
        lines.append("")
    lines += [
        f'<a id="{_config_anchor("ModelFacts")}"></a>',
        "### `ModelFacts`\n",
        "A model's facts as `ModelShape.to_dict()` writes them: a dict keyed by the fields of "
        "[`ModelShape`](#type-modelshape) (" + ", ".join(f"`{k}`" for k in MODEL_KEYS) + "); "
        "`groups` and `layers` only for a hybrid model, `index_head_dim` only when set.",
        "",
    ]
    return "\n".join(lines)


def _by_family() -> dict[str, list[type[AdapterProtocol]]]:
    """Each family folder's protocols, in the families' order."""
    found: dict[str, list[type[AdapterProtocol]]] = {}
    for protocol in PROTOCOLS:
        found.setdefault(_family_of(protocol), []).append(protocol)
    return found


def _family_of(protocol: type[AdapterProtocol]) -> str:
    """``routing`` for a protocol declared in ``kvspec/conformance/families/routing/``."""
    return protocol.__module__.split(".")[-2]


def _family(family: str, protocols: list[type[AdapterProtocol]], checks: list[Check]) -> str:
    package = importlib.import_module(protocols[0].__module__.rsplit(".", 1)[0])
    lines = [
        f'<a id="family-{family}"></a>',
        f"## The {family} family\n",
        _markdown(_summary(inspect.getdoc(package) or "")),
        "",
        f"Its protocols, in `{protocols[0].__module__}`:",
        "",
    ]
    for protocol in protocols:
        lines.append(_protocol(protocol, checks))
    return "\n".join(lines)


def _protocol(protocol: type[AdapterProtocol], checks: list[Check]) -> str:
    name = protocol.capability
    mine = [c for c in checks if name in c.needs]
    lines = [
        f'<a id="{_anchor(name)}"></a>',
        f"### `{protocol.__name__}`: capability `{name}`\n",
        _markdown(inspect.getdoc(protocol) or ""),
        "",
    ]
    for method in protocol.methods:
        function = getattr(protocol, method)
        lines += [_signature(method, function), "", _markdown(inspect.getdoc(function) or "")]
        lines += ["", *_arguments(function), ""]
    lines += _obligations(name, mine)
    return "\n".join(lines)


def _declared(checks: list[Check]) -> str:
    lines = [
        "## Capabilities an adapter declares\n",
        "These come from what an adapter's data says, not from a method.\n",
    ]
    for name, how in DECLARED.items():
        mine = [c for c in checks if name in c.needs]
        lines += [f'<a id="{_anchor(name)}"></a>', f"### `{name}`\n", _markdown(how) + ".", ""]
        lines += _obligations(name, mine)
    return "\n".join(lines)


def _public_path(cls: type) -> str:
    """``cls``'s dotted name by the shortest package that exports it (``kvspec.conformance.
    adapter.Acceptance``, not the module inside the package that defines it)."""
    parts = cls.__module__.split(".")
    best = cls.__module__
    for n in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:n]))
        if package is None or getattr(package, cls.__qualname__, None) is not cls:
            break
        best = ".".join(parts[:n])
    return f"{best}.{cls.__qualname__}"


def _types_section() -> str:
    lines = [
        "## Types\n",
        "The kvspec types the methods above take or return, and the types of their fields.\n",
    ]
    for cls in _referenced_types():
        lines += [
            f'<a id="type-{cls.__name__.lower()}"></a>',
            f"### `{cls.__name__}`\n",
            f"`{_public_path(cls)}`\n",
            _markdown(_summary(inspect.getdoc(cls) or "")),
            "",
        ]
        if dataclasses.is_dataclass(cls):
            hints = _hints(cls)
            lines += ["| field | type | default |", "|---|---|---|"]
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                lines.append(
                    f"| `{f.name}` | {_type_cell(hints.get(f.name, f.type))} "
                    f"| {_field_default(f)} |"
                )
            lines.append("")
    return "\n".join(lines)


# -- pieces --------------------------------------------------------------------------------


def _signature(method: str, function: Callable[..., Any]) -> str:
    """``#### `name(arg: type, ...) -> type``` of a protocol method or hook, without
    ``self``."""
    hints = _hints(function)
    parts, star = [], False
    for param in list(inspect.signature(function).parameters.values())[1:]:
        if param.kind is param.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = f"{param.name}: {_type(hints.get(param.name, param.annotation))}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        parts.append(text)
    returns = _type(hints.get("return", inspect.signature(function).return_annotation))
    return f"#### `{method}({', '.join(parts)}) -> {returns}`"


def _arguments(function: Callable[..., Any]) -> list[str]:
    """The table of a method's arguments and return value, with the kvspec types each
    names (linked to their section)."""
    hints = _hints(function)
    rows = ["| argument | type | passed |", "|---|---|---|"]
    for param in list(inspect.signature(function).parameters.values())[1:]:
        hint = hints.get(param.name, param.annotation)
        passed = "always" if param.default is param.empty else "where it applies"
        if param.kind is param.KEYWORD_ONLY:
            passed += ", by keyword"
        rows.append(f"| `{param.name}` | {_type_cell(hint)} | {passed} |")
    rows.append(f"| *returns* | {_type_cell(hints.get('return', None))} | |")
    return rows


def _obligations(capability: str, mine: list[Check]) -> list[str]:
    """What the checks needing ``capability`` hold it to: what it must refuse (and with
    which exception), then every check, each with the obligations it covers."""
    if not mine:
        return ["No check needs this capability yet.", ""]
    obligations = all_obligations()
    refusals: dict[str, list[str]] = {}
    for check in mine:
        for o in check.covers:
            if obligations[o].kind == "negative" or o in REFUSAL_TYPES:
                refusals.setdefault(o, []).append(check.id)
    lines = []
    if refusals:
        lines += ["**Must refuse** (raise one of `refusal_types`, unless a type is named):", ""]
        for o in sorted(refusals, key=_obligation_order):
            kind = REFUSAL_TYPES.get(o)
            how = f" — raise `{kind.__name__}`" if kind else ""
            lines.append(f"- `{o}` {_markdown(obligations[o].text)}{how} ({_ids(refusals[o])})")
        lines.append("")
    lines += ["**Checked by:**", ""]
    for check in mine:
        also = [n for n in check.needs if n != capability]
        needs = f"; also needs {', '.join(f'`{n}`' for n in also)}" if also else ""
        lines.append(f"- `{check.id}`: {_markdown(check.title)} [{', '.join(check.covers)}]{needs}")
    lines.append("")
    return lines


def _referenced_types() -> list[type]:
    """Every kvspec class a protocol method or hook names, then the kvspec classes of
    their dataclass fields, in first-seen order."""
    seen: dict[type, None] = {}
    queue: list[Any] = []
    attributes = _hints(Adapter)
    queue += [attributes[name] for name in ATTRIBUTES if name in attributes]
    for name in HOOKS:
        queue += _hints(getattr(Adapter, name)).values()
    for protocol in PROTOCOLS:
        for method in protocol.methods:
            queue += _hints(getattr(protocol, method)).values()
    while queue:
        for cls in _kvspec_classes(queue.pop(0)):
            if cls in seen or _is_typed_dict(cls):
                continue
            seen[cls] = None
            if dataclasses.is_dataclass(cls):
                hints = _hints(cls)
                queue += [hints.get(f.name, f.type) for f in dataclasses.fields(cls) if f.init]
    return list(seen)


def _kvspec_classes(hint: Any) -> Iterator[type]:
    if isinstance(hint, type) and hint.__module__.startswith("kvspec."):
        yield hint
    for arg in hint if isinstance(hint, list) else typing.get_args(hint):  # Callable[[...], R]
        yield from _kvspec_classes(arg)


def _type_cell(hint: Any) -> str:
    """A type as a table cell: a link where it is one kvspec type (or a ``config``
    schema), else the type in code followed by links to the kvspec types it names."""
    if hint is ModelFacts:
        return f"[`ModelFacts`](#{_config_anchor('ModelFacts')})"
    if _is_typed_dict(hint):
        return f"[`{hint.__name__}`](#{_config_anchor(hint.__name__)})"
    if isinstance(hint, type) and hint.__module__.startswith("kvspec."):
        return f"[`{hint.__name__}`](#type-{hint.__name__.lower()})"
    found = [c for c in dict.fromkeys(_kvspec_classes(hint)) if not _is_typed_dict(c)]
    links = ", ".join(f"[{c.__name__}](#type-{c.__name__.lower()})" for c in found)
    return _cell(_type(hint)) + (f" ({links})" if links else "")


def _config_anchor(name: str) -> str:
    return f"config-{name.lower()}"


def _is_typed_dict(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__required_keys__")


def _hints(obj: Any) -> dict[str, Any]:
    """``obj``'s resolved type hints; its raw annotations where they cannot be resolved."""
    try:
        return typing.get_type_hints(obj)
    except Exception:
        return dict(getattr(obj, "__annotations__", {}))


def _type(hint: Any) -> str:
    """A type hint as it reads in code: ``Sequence[tuple[int, Payload]]``, ``int | None``."""
    if hint is None or hint is type(None):
        return "None"
    if hint is ModelFacts:
        return "ModelFacts"
    if isinstance(hint, str):
        return hint
    if hint is Any:
        return "Any"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        if origin is Callable or name == "Callable":
            params, result = args
            shown = "..." if params is Ellipsis else ", ".join(_type(p) for p in params)
            return f"Callable[[{shown}], {_type(result)}]"
        return f"{name}[{', '.join('...' if a is Ellipsis else _type(a) for a in args)}]"
    if isinstance(hint, type):
        if hint.__module__ == "torch":
            return f"torch.{hint.__name__}"
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default(value: Any) -> str:
    if isinstance(value, domain_module.Domain):
        for name, known in vars(domain_module).items():
            if known is value and name.isupper():
                return name
    if isinstance(value, types.MappingProxyType):
        return repr(dict(value))
    return repr(value)


def _field_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "*required*"


_ROLE = re.compile(r":(?:class|meth|attr|func|data|mod|exc):`~?([^`]+)`")


def _markdown(text: str) -> str:
    """A docstring's reST (````x````, ``:class:`~a.B```) as Markdown (```x```, ```B```)."""

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        short = target.rsplit(".", 1)[-1] if match.group(0).count("~") else target
        return f"`{short}`"

    return _ROLE.sub(role, text).replace("``", "`")


def _summary(doc: str) -> str:
    """A docstring's first paragraph."""
    return doc.split("\n\n", 1)[0]


def _after_summary(doc: str) -> str:
    """A docstring without its first paragraph."""
    parts = doc.split("\n\n", 1)
    return parts[1] if len(parts) > 1 else ""


def _cell(text: str, *, code: bool = True) -> str:
    """``text`` as a Markdown table cell (in code unless ``code`` is false), pipes escaped."""
    escaped = text.replace("|", "\\|")
    return f"`{escaped}`" if code and text else escaped


def _ids(ids: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in ids)


def _anchor(name: str) -> str:
    return f"cap-{name}"


def _obligation_order(obligation_id: str) -> tuple[int, ...]:
    order = list(all_obligations())
    return (order.index(obligation_id),)
