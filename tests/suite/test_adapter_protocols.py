"""An adapter's capabilities are the protocols it implements, found by type: each protocol
is declared in its family's folder and owns its capability's name and methods; the base
holds none of them; a protocol named but half-implemented is refused at load; an older
adapter that overrides a capability's methods without naming its protocol is still found,
with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

from kvspec.conformance import Adapter, AdapterError, FullAdapter, load_adapter
from kvspec.conformance.adapter import (
    CAPABILITIES,
    DECLARED,
    PROTOCOLS,
    AdapterProtocol,
    check_adapter,
    protocol_capabilities,
    protocol_for,
)
from kvspec.conformance.adapter.protocols import (
    LayoutsProtocol,
    RoutingProtocol,
    SizesProtocol,
    WireProtocol,
)
from kvspec.conformance.checks import all_checks
from kvspec.conformance.families import FAMILIES
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import NOT_PROVIDED, PASSED, get_check, run_check
from tests.import_graph import graph

FAMILY_PREFIX = "kvspec.conformance.families."


class Mine(Adapter, RoutingProtocol, LayoutsProtocol):
    """Routing and layer reads, by the reference's methods."""

    plan = ReferenceAdapter.plan
    sources = ReferenceAdapter.sources
    targets = ReferenceAdapter.targets
    read_layer = ReferenceAdapter.read_layer

    def encode_frames(self, payload):  # a helper of its own, no capability
        return []


def test_capabilities_are_the_protocols_an_adapter_is_an_instance_of() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # naming its protocols, it is never warned

        class Quiet(Mine):
            pass

    adapter = Quiet()
    assert isinstance(adapter, RoutingProtocol) and isinstance(adapter, LayoutsProtocol)
    assert not isinstance(adapter, WireProtocol)
    assert protocol_capabilities(adapter) == {"routing", "layouts"}
    check_adapter(adapter, where="mine")
    assert protocol_capabilities(ReferenceAdapter()) == set(CAPABILITIES)
    assert isinstance(ReferenceAdapter(), FullAdapter)


def test_each_protocol_is_declared_in_its_family_folder_and_owns_its_methods() -> None:
    """The base holds no capability method; every method belongs to one protocol; the
    checks need only capabilities a protocol (or the domain) owns."""
    methods = [m for p in PROTOCOLS for m in p.methods]
    assert len(methods) == len(set(methods))  # no method in two protocols
    assert not [m for m in methods if hasattr(Adapter, m)]
    for protocol in PROTOCOLS:
        family = protocol.__module__.removeprefix(FAMILY_PREFIX).split(".")[0]
        assert protocol.__module__ == f"{FAMILY_PREFIX}{family}.protocol", protocol
        assert family in FAMILIES and protocol_for(protocol.capability) is protocol
        assert CAPABILITIES[protocol.capability] == protocol.methods
    needed = {n for c in all_checks() for n in c.needs}
    assert needed <= set(CAPABILITIES) | set(DECLARED)
    assert needed >= set(CAPABILITIES)  # and no protocol without a check
    with pytest.raises(KeyError, match=r"'routng'; known: ownership, tokens"):
        protocol_for("routng")


def test_every_family_protocol_is_gathered() -> None:
    """A protocol declared in a family folder and missing from PROTOCOLS would be found
    by no adapter: the registry holds every one."""
    declared = []
    for family in FAMILIES:
        try:
            module = importlib.import_module(f"{FAMILY_PREFIX}{family}.protocol")
        except ModuleNotFoundError:
            continue
        declared += [
            v
            for v in vars(module).values()
            if isinstance(v, type)
            and issubclass(v, AdapterProtocol)
            and v.__module__ == module.__name__
        ]
    assert sorted(p.__name__ for p in declared) == sorted(p.__name__ for p in PROTOCOLS)


def test_a_protocol_module_imports_only_shared_modules() -> None:
    """A family's protocols import the contract, the protocol base and the spec's types:
    never another family, never the adapter package (which gathers them)."""
    edges = graph("kvspec")
    modules = [m for m in edges if m.startswith(FAMILY_PREFIX) and m.endswith(".protocol")]
    assert len(modules) == len({p.__module__ for p in PROTOCOLS})
    for module in modules:
        for imported in edges[module]:
            assert not imported.startswith(FAMILY_PREFIX), (module, imported)
            assert imported not in ("kvspec.conformance.adapter", "kvspec.conformance.adapter.base")
            assert not imported.startswith("kvspec.conformance.checks"), (module, imported)


def test_a_protocol_named_but_half_implemented_is_refused() -> None:
    class Half(Adapter, RoutingProtocol):
        def targets(self, case, src):
            return []

        def source(self, case, dst):  # sources, misspelled
            return []

    with pytest.raises(
        AdapterError,
        match=r"mine subclasses RoutingProtocol but does not override sources \(did you mean "
        r"sources for source\?\): the routing capability is sources \+ targets",
    ):
        check_adapter(Half(), where="mine")


def test_a_half_implemented_protocol_is_refused_when_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "half_adapter.py").write_text(
        "from kvspec.conformance import Adapter\n"
        "from kvspec.conformance.adapter.protocols import LayoutsProtocol, WireProtocol\n\n\n"
        "class Half(Adapter, LayoutsProtocol, WireProtocol):\n"
        "    def read_layer(self, cache, layout):\n"
        "        return ()\n\n"
        "    def encode(self, payload):\n"
        "        return []\n\n\n"
        "adapter = Half()\n"
    )
    with pytest.raises(AdapterError, match="subclasses WireProtocol but does not override decode"):
        load_adapter("half_adapter:adapter")


def test_a_signature_is_bound_against_the_protocols_method() -> None:
    class NoConfig(Adapter, SizesProtocol):
        def validate_sizes(self):
            pass

    with pytest.raises(
        AdapterError, match=r"NoConfig.validate_sizes\(self\) cannot take .* SizesProtocol"
    ):
        check_adapter(NoConfig(), where="mine")


def test_an_older_adapter_is_found_by_its_methods_with_a_deprecation() -> None:
    """Written before the protocols (methods only): still found, still checked, warned."""
    with pytest.deprecated_call(match=r"Older implements RoutingProtocol by its methods alone"):

        class Older(Adapter):
            plan = ReferenceAdapter.plan
            sources = ReferenceAdapter.sources
            targets = ReferenceAdapter.targets

    assert isinstance(Older(), RoutingProtocol)
    assert protocol_capabilities(Older()) == {"routing"}
    check_adapter(Older(), where="older")
    result = run_check(get_check("PLAN-3/inverse"), Older(), max_examples=5, profile="ci")
    assert result.verdict == PASSED, result.reason


def test_the_full_adapter_must_override_every_protocol() -> None:
    class Forgot(ReferenceAdapter):
        decode = FullAdapter.decode  # the protocol's own, raising NotProvided

    with pytest.raises(AdapterError, match="subclasses WireProtocol but does not override decode"):
        check_adapter(Forgot(), where="forgot")


def test_a_protocol_declares_methods() -> None:
    with pytest.raises(TypeError, match="declares no methods"):

        class Empty(AdapterProtocol, capability="empty"):
            pass


def test_a_check_of_a_capability_not_provided_asks_the_adapter_nothing() -> None:
    """Every check runs on an adapter of routing alone: those needing more are "not
    provided", and none calls a method the adapter lacks (a check's own ``missing`` probe
    included: the token-pool check asked for ``read_layer`` and raised AttributeError)."""

    class RoutingOnly(Adapter, RoutingProtocol):
        plan = ReferenceAdapter.plan
        sources = ReferenceAdapter.sources
        targets = ReferenceAdapter.targets

    adapter = RoutingOnly()
    for check in all_checks():
        if set(check.needs) <= {"routing"}:
            continue
        result = run_check(check, adapter, max_examples=1)
        assert result.verdict == NOT_PROVIDED, (check.id, result.verdict, result.reason)
