"""A data path sees its rank through ports only (issue 41): a read-only view, the outbound
port the sender implements and the inbound port the receiver implements; never a role's
own state (:mod:`sim.paths.datapath`)."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from sim.paths.datapath import Inbound, Outbound, PathPorts, RankView
from sim.rank.receiver import Receiver
from sim.rank.sender import Sender
from tests.paths import ROOT

PORTS = {field.name for field in dataclasses.fields(PathPorts)}


def _protocol_methods(protocol: type) -> list[str]:
    return [
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    ]


@pytest.mark.parametrize(("protocol", "role"), [(Outbound, Sender), (Inbound, Receiver)])
def test_each_role_implements_its_port(protocol: type, role: type) -> None:
    """Every method of the port is the role's, with the same parameters."""
    methods = _protocol_methods(protocol)
    assert len(methods) >= 4
    for name in methods:
        wanted = list(inspect.signature(getattr(protocol, name)).parameters)
        assert list(inspect.signature(getattr(role, name)).parameters) == wanted, name


def test_the_view_is_read_only() -> None:
    assert PathPorts.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert RankView.__dataclass_params__.frozen  # type: ignore[attr-defined]
    hints = {field.name: str(field.type) for field in dataclasses.fields(RankView)}
    assert hints["requests"].startswith("Mapping")
    assert not any(hint.startswith(("dict[", "set[", "list[")) for hint in hints.values())


def _path_modules() -> list[str]:
    return sorted(
        path.name for path in (ROOT / "sim" / "paths").glob("*.py") if path.name != "datapath.py"
    )


def _port_uses(source: str) -> set[str]:
    """What a path reads of what it was given: the names after ``ep.`` / ``self.ep.``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "ep") or (
                isinstance(base, ast.Attribute)
                and base.attr == "ep"
                and isinstance(base.value, ast.Name)
                and base.value.id == "self"
            ):
                found.add(node.attr)
    return found


def test_the_paths_touch_only_their_ports() -> None:
    used: dict[str, set[str]] = {}
    for name in _path_modules():
        used[name] = _port_uses((ROOT / "sim" / "paths" / name).read_text())
    assert set().union(*used.values()) <= PORTS, used
    assert used["push.py"] and used["pull.py"] and used["onesided.py"]


def test_the_finder_sees_a_role_s_state() -> None:
    """A path reaching into the sender's books is found (the check above can fail)."""
    planted = "def f(self, ep):\n    ep.sent_keys[0].append('k')\n    self.ep.peers.clear()\n"
    assert _port_uses(planted) == {"sent_keys", "peers"}
    assert not _port_uses(planted) <= PORTS
