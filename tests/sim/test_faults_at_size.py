"""The fault matrix at a real size (issue 45.5): every fault each transport takes, on
every transport, at 2,048 tokens a request (TP4 -> TP2, 4 KV heads of 128, 4 layers:
16 MiB a request), with the books balanced [sim.books.accounting].

A fault a transport has no use for is refused before anything starts (tested where the
refusals are); every other (transport, transfer, fault) is in :data:`MATRIX`, read from
what the sim accepts, so a fault a transport learns to take joins it by itself. Each run:
the fault struck, injected and observed alike key by key, every request verified or
failed with its reason, and a fault that loses nothing (a copy, a reordering, junk
ahead of the real message) costs no request. A library's own error is booked as what
it is, never as a fault nobody injected (issue 46: Mooncake's failed batches read as
drops).

``make faults`` runs the whole matrix (about 60 runs); ``make test`` one sample per
transport family, :data:`SAMPLE`.
"""

from __future__ import annotations

import os

import pytest

from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.harness.cluster import run_simulation
from sim.harness.validation import validate
from sim.paths.onesided_checks import unloadable
from sim.run.config import ONE_SIDED_LIBRARIES, SimConfig
from sim.run.faults import parse_faults
from tests.sim.runs import FAULT_SPECS, assert_booked_alike

TOKENS = 2048
MODEL = ModelShape(num_layers=4, num_kv_heads=4, head_dim=128)
TRANSPORTS = [
    ("tcp", "push"),
    ("tcp", "pull"),
    ("tcp", "write"),
    ("gloo", "push"),
    ("nixl", "write"),
    ("nixl", "pull"),
    ("mooncake", "write"),
    ("mooncake", "pull"),
]
LOSSLESS = ("dup", "reorder", "garbage")
"""Faults a receiver recovers from by the rules: no request may fail of them."""
SEED = 3


def config_of(transport: str, transfer: str, kind: str) -> SimConfig:
    return SimConfig(
        stages=(StageLayout(4), StageLayout(2)),
        model=MODEL,
        requests=3,
        seq_len=(TOKENS, TOKENS),
        ports="os",
        timeout=180.0,
        transport=transport,
        transfer=transfer,
        faults=parse_faults(FAULT_SPECS[kind]),
        seed=SEED,
        allow_unauthenticated_transport=transport == "mooncake",
    )


def _accepted(transport: str, transfer: str, kind: str) -> bool:
    try:
        validate(config_of(transport, transfer, kind))
    except ValueError as error:  # refused for the pair, or its engine is absent
        return "not installed" in str(error) or "does not load" in str(error)
    return True


def _param(transport: str, transfer: str, kind: str) -> object:
    module = ONE_SIDED_LIBRARIES.get(transport, (None, ""))[0]
    why = unloadable(module) if module else None
    marks = [pytest.mark.skipif(why is not None, reason=f"{module} {why}")] if why else []
    return pytest.param(transport, transfer, kind, marks=marks, id=f"{transport}-{transfer}-{kind}")


MATRIX = [
    (transport, transfer, kind)
    for transport, transfer in TRANSPORTS
    for kind in FAULT_SPECS
    if _accepted(transport, transfer, kind)
]
"""Every (transport, transfer, fault) the sim accepts."""
SAMPLE = [
    ("tcp", "pull", "reuse"),
    ("mooncake", "write", "drop"),
]
"""What ``make test`` runs: a receiver's blocks reused under a pull, and the one-sided
write whose library errors once read as drops (issue 46)."""
FULL = os.environ.get("KVSPEC_FAULT_MATRIX") == "1"


def test_the_matrix_holds_every_transport_and_the_sample() -> None:
    assert {(t, x) for t, x, _ in MATRIX} == set(TRANSPORTS)
    assert set(SAMPLE) <= set(MATRIX)
    assert len(MATRIX) >= 50, len(MATRIX)


@pytest.mark.parametrize(
    ("transport", "transfer", "kind"), [_param(*c) for c in (MATRIX if FULL else SAMPLE)]
)
def test_a_fault_at_a_real_size_keeps_the_books(transport: str, transfer: str, kind: str) -> None:
    config = config_of(transport, transfer, kind)
    report = run_simulation(config)
    counts = report.fault_counts()
    assert counts.get(kind, {}).get("injected", 0) >= 1, f"{kind} never struck: {counts}"
    assert_booked_alike(report, kind, SEED)
    assert report.verified + report.failed == config.requests, report.render()
    failed = [o for o in report.outcomes if not o.ok]
    assert all(o.reasons for o in failed), report.render()
    if kind in LOSSLESS:
        assert not failed, report.render()
    if not failed:
        assert report.edge_bytes == report.planned_bytes
