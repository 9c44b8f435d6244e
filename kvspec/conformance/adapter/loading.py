"""Loading an adapter from a built-in name or ``MODULE:ATTR`` (:func:`load_adapter`),
and the errors that say why one cannot be loaded: a module not on ``sys.path`` (and
where it might be), a module named without its ``:ATTR``, an import that raised (and
where)."""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from kvspec.conformance.adapter.base import Adapter
from kvspec.conformance.adapter.capabilities import check_adapter
from kvspec.conformance.adapter.contract import AdapterError

BUILTIN: dict[str, str] = {
    "reference": "kvspec.conformance.reference:ReferenceAdapter",
    # Engines in the field: each imports the engine's installed package when created and
    # refuses with what to install when it is missing (kvspec/adapters, `make field`).
    "vllm-omni": "kvspec.adapters.vllm_omni:VllmOmniAdapter",
    "vllm-nixl": "kvspec.adapters.vllm_nixl:VllmNixlAdapter",
    "vllm-mooncake": "kvspec.adapters.vllm_mooncake:VllmMooncakeAdapter",
    "vllm-moriio": "kvspec.adapters.vllm_moriio:VllmMoriioAdapter",
    "vllm-canonical": "kvspec.adapters.vllm_canonical:VllmCanonicalAdapter",
    "vllm-layouts": "kvspec.adapters.vllm_layouts:VllmLayoutsAdapter",
    "sglang": "kvspec.adapters.sglang:SglangAdapter",
    "sglang-mooncake": "kvspec.adapters.sglang_mooncake:SglangMooncakeAdapter",
    "sglang-nixl": "kvspec.adapters.sglang_nixl:SglangNixlAdapter",
}
"""Adapters reachable by a built-in name."""


def load_adapter(spec: str) -> Adapter:
    """Load ``spec``: a built-in name or ``MODULE:ATTR`` (an adapter or a factory).

    The current directory is importable, so ``my_adapter:adapter`` finds
    ``./my_adapter.py``. Every failure raises :class:`AdapterError` with the reason.
    """
    target = BUILTIN.get(spec, spec)
    module_name, _, attr = target.partition(":")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        parts = [p for p in re.split(r"[/\\]", module_name.removesuffix(".py")) if p != "."]
        dotted = ".".join(parts)
        raise AdapterError(
            f"{spec!r} names a file; name the module as Python imports it: "
            f"{dotted}:{attr or _first_adapter(dotted)} (run from the directory that holds it)"
        )
    if not module_name or not attr:
        raise AdapterError(_not_module_attr(spec, module_name))
    module = _import(module_name, attr)
    try:
        obj: Any = getattr(module, attr)
    except AttributeError:
        found = adapter_names(module)
        close = difflib.get_close_matches(attr, [*found, *dir(module)], n=1, cutoff=0.6)
        hint = f"; did you mean {module_name}:{close[0]}?" if close else ""
        raise AdapterError(
            f"module {module_name!r} has no attribute {attr!r}{hint}{_holding(found)}"
        ) from None
    if inspect.isclass(obj) or (callable(obj) and not isinstance(obj, Adapter)):
        try:
            obj = obj()
        except AdapterError:
            raise
        except Exception as error:
            raise AdapterError(f"calling {target} with no arguments failed: {error!r}") from error
    check_adapter(obj, where=target)
    return obj


def _import(module_name: str, attr: str) -> ModuleType:
    """``module_name`` imported with the current directory on the path; a module that is
    not there is refused with where it was looked for and how to make it findable."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name + ".").startswith(error.name + "."):
            raise AdapterError(_not_found(module_name, error.name, attr)) from None
        cause: Exception = error
    except Exception as error:
        cause = error
    what = f"SyntaxError: {cause.msg}" if isinstance(cause, SyntaxError) else repr(cause)
    raise AdapterError(f"cannot import {module_name!r}: {what}{_raised_at(cause)}") from cause


SHOWN_PATH_ENTRIES = 4
"""How many sys.path entries a module-not-found message shows."""


def _not_found(module_name: str, missing: str, attr: str) -> str:
    """Why ``module_name`` is not importable (its part ``missing`` is nowhere on sys.path),
    where Python looked, and the two ways to make it findable."""
    cwd = Path.cwd()
    parent, _, leaf = missing.rpartition(".")
    if parent:
        where = getattr(sys.modules.get(parent), "__path__", None)
        first = f"package {parent!r} ({', '.join(where or [])}) has no module {leaf!r}"
    else:
        first = f"no module {missing!r} on sys.path"
    if missing != module_name:
        first += f" (needed for {module_name!r})"
    lines = [f"cannot import {module_name!r}: {first}"]
    if parent:  # the package is there: the module's name is wrong, not the path
        inside = sorted(m.name for m in pkgutil.iter_modules(where or []))
        lines.append(f"  modules in {parent}: {', '.join(inside) or 'none'}")
        return "\n".join(lines)
    entries = [e or str(cwd) for e in sys.path]
    more = len(entries) - SHOWN_PATH_ENTRIES
    holds = f"{missing}/" if "." in module_name else f"{missing}.py"
    lines += [
        f"  current directory: {cwd}",
        f"  sys.path: {', '.join(entries[:SHOWN_PATH_ENTRIES])}"
        + (f" (+{more} more)" if more > 0 else ""),
        f"  fix: run from the directory that holds {holds}, or name that directory in "
        f"PYTHONPATH (PYTHONPATH=DIR ... {module_name}:{attr or 'ATTR'})",
    ]
    nearby = _nearby(holds)
    if nearby:
        lines.append(
            f"  found nearby: {', '.join(nearby)} (PYTHONPATH={Path(nearby[0]).parent} ...)"
        )
    return "\n".join(lines)


def _first_adapter(module_name: str) -> str:
    """The first of :func:`adapter_names` in ``module_name``, or ``ATTR`` when it cannot
    be imported or holds none."""
    try:
        found = adapter_names(_import(module_name, ""))
    except Exception:
        return "ATTR"
    return found[0] if found else "ATTR"


def _nearby(holds: str, limit: int = 3) -> list[str]:
    """Up to ``limit`` paths, one or two directories below the current one, named
    ``holds`` (``mine.py`` or ``pkg/``): where a module the user meant may be."""
    name = holds.rstrip("/")
    found: list[str] = []
    for pattern in (f"*/{name}", f"*/*/{name}"):
        for path in sorted(Path.cwd().glob(pattern)):
            if any(part.startswith(".") for part in path.parts[-3:]):
                continue
            found.append(str(path.relative_to(Path.cwd())))
            if len(found) == limit:
                return found
    return found


def _not_module_attr(spec: str, module_name: str) -> str:
    """Why ``spec`` without ``:ATTR`` names no adapter: a built-in name misspelt, or a
    module whose adapters it does not name (``did you mean mine:adapter?``)."""
    builtins = f"neither a built-in adapter ({', '.join(BUILTIN)}) nor MODULE:ATTR"
    close = difflib.get_close_matches(spec, BUILTIN, n=1)
    if close:
        return f"{spec!r} is {builtins}; did you mean {close[0]}?"
    if not all(part.isidentifier() for part in module_name.split(".")):
        return f"{spec!r} is {builtins}"
    try:
        module = _import(module_name, "")
    except AdapterError as error:
        return f"{spec!r} is {builtins}; as a module, {error}"
    found = adapter_names(module)
    if not found:
        return (
            f"{spec!r} names a module, not the adapter in it: give MODULE:ATTR; "
            f"{module_name} holds no Adapter instance or subclass"
        )
    return (
        f"{spec!r} names a module, not the adapter in it; did you mean "
        f"{module_name}:{found[0]}?{_holding(found)}"
    )


def adapter_names(module: ModuleType) -> list[str]:
    """Names in ``module`` that ``MODULE:ATTR`` could take: Adapter instances first
    (``adapter`` foremost), then Adapter subclasses defined in the module."""
    instances, classes = [], []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, Adapter):
            instances.append(name)
        elif (
            inspect.isclass(value)
            and issubclass(value, Adapter)
            and value is not Adapter
            and value.__module__ == module.__name__
        ):
            classes.append(name)
    instances.sort(key=lambda n: n != "adapter")
    return instances + classes


def _holding(names: list[str]) -> str:
    return f" (Adapter objects in it: {', '.join(names)})" if names else ""


def _raised_at(error: BaseException) -> str:
    """`` at FILE:LINE``: where ``error`` was raised (the line a SyntaxError points at, or
    the last frame outside Python's import machinery and this module); ``""`` when there
    is none."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if "importlib" not in f.filename
        and not f.filename.startswith("<frozen")
        and f.filename != __file__
    ]
    if isinstance(error, SyntaxError):
        return f" at {error.filename}:{error.lineno}"
    if not frames:
        return ""
    return f" at {frames[-1].filename}:{frames[-1].lineno}"
