"""What a capability protocol is: a small mixin class an adapter subclasses to say it
implements one capability, holding that capability's name (``capability``), its methods
(``methods``, each raising :class:`~kvspec.conformance.adapter.contract.NotProvided` until
the adapter overrides it, with the clause ids its docstring cites) and the older names an
adapter may still give a method (``older``).

Each clause family declares its protocols beside its checks
(``kvspec/conformance/families/<family>/protocol.py``); an adapter's capabilities are the
protocols it is an instance of
(:func:`~kvspec.conformance.adapter.capabilities.provided_capabilities`).
"""

from __future__ import annotations

from abc import ABCMeta
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar


class AdapterProtocol(metaclass=ABCMeta):  # noqa: B024  # ABCMeta for register(), no abstracts
    """Base of every capability protocol (never of an adapter directly).

    A protocol is declared with its capability's name, and its public methods are the
    capability's: ``class RoutingProtocol(AdapterProtocol, capability="routing")``. An
    adapter implements it by subclassing it beside
    :class:`~kvspec.conformance.adapter.base.Adapter` and overriding every one of its
    methods. ``ABCMeta`` lets an older adapter that overrides the methods without naming
    the protocol be registered as implementing it
    (:meth:`~kvspec.conformance.adapter.base.Adapter.__init_subclass__`).
    """

    capability: ClassVar[str] = ""
    """The capability's name, as checks name it in ``needs`` (``routing``)."""
    methods: ClassVar[tuple[str, ...]] = ()
    """The capability's methods, in declaration order."""
    older: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
    """Method -> names an older adapter may provide it under."""

    def __init_subclass__(
        cls,
        *,
        capability: str | None = None,
        older: Mapping[str, tuple[str, ...]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if capability is None:  # an adapter implementing protocols, not a protocol
            return
        cls.capability = capability
        cls.methods = tuple(
            name
            for name, value in vars(cls).items()
            if not name.startswith("_") and callable(value)
        )
        cls.older = MappingProxyType(dict(older or {}))
        if not cls.methods or set(cls.older) - set(cls.methods):
            raise TypeError(f"protocol {cls.__name__} declares no methods, or aliases unknown ones")


def is_protocol(cls: type) -> bool:
    """Whether ``cls`` declares a capability protocol (not an adapter implementing one)."""
    return isinstance(cls, ABCMeta) and "capability" in vars(cls) and cls is not AdapterProtocol
