"""Which capabilities an adapter provides: the protocols it implements, found by type
(:func:`implemented_protocols`), and those its domain declares; and the checks that
refuse a malformed adapter with what is wrong (:func:`check_adapter`): a protocol named
but not fully overridden, a capability's methods written in part without it, a method
spelled close to a protocol's, a signature that cannot take what the suite passes."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from kvspec.conformance.adapter.base import Adapter
from kvspec.conformance.adapter.contract import REPLICAS_WRITE, AdapterError
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.adapter.protocols import PROTOCOLS
from kvspec.conformance.domain import Domain
from kvspec.tensors.reshard import SLICING_MODES
from kvspec.topology.plan import POLICIES


def implemented_protocols(adapter: object) -> list[type[AdapterProtocol]]:
    """The capability protocols ``adapter`` is an instance of: those its class names among
    its bases, and (deprecated) those an older adapter was registered as implementing by
    its methods alone (:meth:`Adapter.__init_subclass__`)."""
    return [p for p in PROTOCOLS if isinstance(adapter, p)]


def protocol_capabilities(adapter: object) -> set[str]:
    """The capabilities of the protocols ``adapter`` implements."""
    return {p.capability for p in implemented_protocols(adapter)}


def provided_capabilities(adapter: Adapter) -> set[str]:
    """Capabilities by protocol, plus those its domain declares (:data:`DECLARED`)."""
    found = protocol_capabilities(adapter)
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
    _check_unfinished_protocols(type(obj), where)
    _check_partial_capabilities(type(obj), where)
    if not implemented_protocols(obj):
        raise AdapterError(
            f"{where} implements no capability protocol{_near_misses(type(obj))}; subclass "
            "at least one beside Adapter and override its methods: "
            + ", ".join(f"{p.__name__} ({', '.join(p.methods)})" for p in PROTOCOLS)
        )
    _check_signatures(type(obj))


def _capability_methods() -> list[str]:
    """Every method a protocol consists of, and their older names."""
    names = [m for p in PROTOCOLS for m in p.methods]
    return names + sorted({a for p in PROTOCOLS for older in p.older.values() for a in older})


def _near_misses(cls: type) -> str:
    """``" (did you mean sources for source?)"`` for public methods of ``cls`` that are
    neither the base's nor a protocol's but are spelled close to a protocol method; ``""``
    when there are none."""
    known = _capability_methods()
    guesses = []
    for name, value in vars(cls).items():
        if name.startswith("_") or not callable(value) or hasattr(Adapter, name):
            continue
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            guesses.append(f"{close[0]} for {name}")
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def _stub(protocol: type[AdapterProtocol], cls: type, method: str) -> bool:
    """Whether ``cls``'s ``method`` is still the protocol's own (raising NotProvided)."""
    return getattr(cls, method) is vars(protocol)[method]


def _check_unfinished_protocols(cls: type, where: str) -> None:
    """Refuse a protocol the adapter names among its bases but does not override every
    method of: its checks would run and report the rest not provided."""
    for protocol in PROTOCOLS:
        if protocol not in cls.__mro__:
            continue
        missing = [m for m in protocol.methods if _stub(protocol, cls, m)]
        if missing:
            raise AdapterError(
                f"{where} subclasses {protocol.__name__} but does not override "
                f"{', '.join(missing)}{_near_misses(cls)}: the {protocol.capability} "
                f"capability is {' + '.join(protocol.methods)}; override them all, or drop "
                f"{protocol.__name__} from its bases"
            )


def _check_partial_capabilities(cls: type, where: str) -> None:
    """Refuse a capability of several methods that an adapter naming no protocol for it
    defines only in part: the suite would skip it as not provided, and say nothing of the
    method written."""
    for protocol in PROTOCOLS:
        if issubclass(cls, protocol):
            continue
        done = [
            m
            for m in protocol.methods
            if any(callable(getattr(cls, n, None)) for n in (m, *protocol.older.get(m, ())))
        ]
        if done:
            rest = [m for m in protocol.methods if m not in done]
            raise AdapterError(
                f"{where} overrides {', '.join(done)} but not {', '.join(rest)}"
                f"{_near_misses(cls)}: the {protocol.capability} capability is "
                f"{' + '.join(protocol.methods)}; override the rest too (and name "
                f"{protocol.__name__} among its bases), or none of them"
            )


def _check_signatures(cls: type) -> None:
    """Refuse an overriding method that cannot take the arguments the suite always passes
    (the protocol method's required ones), before a check calls it and blames the
    implementation."""
    for protocol in PROTOCOLS:
        if not issubclass(cls, protocol):
            continue
        for name in protocol.methods:
            _check_signature(cls, protocol, name)


def _check_signature(cls: type, protocol: type[AdapterProtocol], name: str) -> None:
    """Refuse ``cls.name`` if it cannot take what the suite passes ``protocol.name``."""
    base = inspect.signature(getattr(protocol, name))
    mine = getattr(cls, name)
    try:
        theirs = inspect.signature(mine)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
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
            f"{protocol.__name__}.{name}{base} ({error})"
        ) from None
