"""Which capabilities an adapter provides, and the checks that refuse a malformed
adapter with what is wrong (:func:`check_adapter`): a capability half-overridden, a
method spelled close to a capability's, a signature that differs from the base's."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from kvspec.conformance.adapter.base import Adapter, _overrides
from kvspec.conformance.adapter.contract import _ALIASES, CAPABILITIES, REPLICAS_WRITE, AdapterError
from kvspec.conformance.domain import Domain
from kvspec.tensors.reshard import SLICING_MODES
from kvspec.topology.plan import POLICIES


def method_capabilities(adapter: Adapter) -> set[str]:
    """Capabilities whose every method the adapter overrides (or an alias of it)."""
    cls = type(adapter)
    return {
        name
        for name, methods in CAPABILITIES.items()
        if all(any(_overrides(cls, m) for m in (n, *_ALIASES.get(n, ()))) for n in methods)
    }


def provided_capabilities(adapter: Adapter) -> set[str]:
    """Capabilities by method, plus those its domain declares (:data:`DECLARED`)."""
    found = method_capabilities(adapter)
    if adapter.domain.fp8:
        found.add("fp8-scales")
    return found


def check_adapter(obj: object, *, where: str) -> None:
    """Refuse an object that is not a well-formed adapter, saying what is wrong."""
    if not isinstance(obj, Adapter):
        raise AdapterError(
            f"{where} gave {type(obj).__name__}, not an instance of "
            "kvspec.conformance.Adapter (subclass it and override the capabilities you have)"
        )
    if not isinstance(obj.domain, Domain):
        raise AdapterError(
            f"{where}: domain must be a kvspec.conformance.Domain, got {type(obj.domain).__name__}"
        )
    rules = dict(obj.policy_rules)
    shadowing = sorted(set(rules) & set(POLICIES))
    if shadowing or not all(isinstance(n, str) and n and callable(r) for n, r in rules.items()):
        raise AdapterError(
            f"{where}: policy_rules must map new names (not {POLICIES}) to functions of a "
            f"ReplicaChoice; got {rules!r:.200}"
        )
    unknown_policies = set(obj.policies) - set(POLICIES) - set(rules)
    if unknown_policies:
        raise AdapterError(
            f"{where}: policies {sorted(unknown_policies)} are neither spec policies "
            f"{POLICIES} nor declared in policy_rules"
        )
    if obj.replicas_write not in REPLICAS_WRITE:
        raise AdapterError(
            f"{where}: replicas_write must be one of {REPLICAS_WRITE}, got {obj.replicas_write!r}"
        )
    unknown_modes = set(obj.slicing_modes) - set(SLICING_MODES)
    if unknown_modes or not obj.slicing_modes:
        raise AdapterError(
            f"{where}: slicing_modes must be a non-empty subset of {SLICING_MODES}, got "
            f"{obj.slicing_modes!r}"
        )
    _check_partial_capabilities(type(obj), where)
    if not method_capabilities(obj):
        raise AdapterError(
            f"{where} overrides no capability{_near_misses(type(obj))}; override at least one "
            "of " + ", ".join(f"{c} ({', '.join(m)})" for c, m in CAPABILITIES.items())
        )
    _check_signatures(type(obj))


def _capability_methods() -> list[str]:
    """Every method a capability consists of, and their older names."""
    names = [m for methods in CAPABILITIES.values() for m in methods]
    return names + sorted({a for aliases in _ALIASES.values() for a in aliases})


def _near_misses(cls: type) -> str:
    """``" (did you mean sources for source?)"`` for public methods of ``cls`` that are not
    the base's but are spelled close to a capability method; ``""`` when there are none."""
    known = _capability_methods()
    guesses = []
    for name, value in vars(cls).items():
        if name.startswith("_") or not callable(value) or hasattr(Adapter, name):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            guesses.append(f"{close[0]} for {name}")
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def _check_partial_capabilities(cls: type, where: str) -> None:
    """Refuse a capability of several methods that the adapter overrides only in part:
    the suite would skip it as not provided, and say nothing of the method written."""
    for capability, methods in CAPABILITIES.items():
        done = [m for m in methods if any(_overrides(cls, n) for n in (m, *_ALIASES.get(m, ())))]
        if done and len(done) < len(methods):
            rest = [m for m in methods if m not in done]
            raise AdapterError(
                f"{where} overrides {', '.join(done)} but not {', '.join(rest)}"
                f"{_near_misses(cls)}: the {capability} capability is "
                f"{' + '.join(methods)}; override the rest too, or none of them"
            )


def _check_signatures(cls: type) -> None:
    """Refuse an overriding method that cannot take the arguments the suite always passes
    (the base method's required ones), before a check calls it and blames the
    implementation."""
    for name in _capability_methods():
        if not _overrides(cls, name):
            continue
        base = inspect.signature(getattr(Adapter, name))
        mine = getattr(cls, name)
        try:
            theirs = inspect.signature(mine)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in list(base.parameters.values())[1:]:  # after self
            if param.default is not param.empty:
                continue  # passed only where it applies (a token pool's page size, ...)
            if param.kind is param.POSITIONAL_OR_KEYWORD:
                args.append(None)
            elif param.kind is param.KEYWORD_ONLY:
                kwargs[param.name] = None
        try:
            theirs.bind(None, *args, **kwargs)
        except TypeError as error:
            raise AdapterError(
                f"{cls.__name__}.{name}{theirs} cannot take what the suite passes, "
                f"Adapter.{name}{base} ({error})"
            ) from None
