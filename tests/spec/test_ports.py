"""PORT-1..3: the port formula, its collision-free domain, and whole-deployment proofs."""

import json
from collections import Counter

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from kvspec.cli import main
from kvspec.naming.ports import (
    COMPATIBLE,
    PURPOSES,
    DeployedStage,
    Deployment,
    PortScheme,
    check_deployment,
    port,
    port_map,
    raw_port,
)
from kvspec.testing.strategies import deployments, port_schemes
from kvspec.topology.stage import StageLayout

TWO_REPLICAS = Deployment(
    50000, (DeployedStage(0, StageLayout(2), replicas=2), DeployedStage(1, replicas=2))
)
FIVE_TP8_STAGES = Deployment(50000, tuple(DeployedStage(i, StageLayout(8)) for i in range(5)))
"""Forwarding of stage 4, rank 6 lands on KV of stage 0, rank 0: offsets 0 and 100 are
4 apart modulo the rank stride 16."""


def kv_zmq_port(base_port: int, from_stage: int, local_rank: int = 0, replica_id=None) -> int:
    """The field's KV port formula, as the implementation this project grew from has it."""
    return base_port + 100 + (replica_id or 0) * 1024 + local_rank * 16 + from_stage


@given(st.integers(1, 30000), st.integers(0, 15), st.integers(0, 63), st.integers(0, 3))
def test_compatible_with_the_field(base: int, stage: int, rank: int, replica: int) -> None:
    """PORT-1: the default scheme is the field's KV, forwarding and orchestrator formulas."""
    assert port("kv", base, stage, rank, replica) == kv_zmq_port(base, stage, rank, replica)
    assert port("forward", base, stage, rank) == base + 0 + stage + rank * 16
    assert port("orchestrator", base, stage) == base + 200 + stage


@st.composite
def two_endpoints(draw: st.DrawFn):
    scheme = draw(port_schemes())
    purpose = draw(st.sampled_from(PURPOSES))

    def endpoint():
        stage = draw(st.integers(0, scheme.rank_stride - 1))
        rank = 0
        if purpose != "orchestrator":
            rank = draw(st.integers(0, (scheme.replica_stride - 1 - stage) // scheme.rank_stride))
        if scheme.dp_stride is None:
            return stage, rank, draw(st.integers(0, 40)), 0
        span = rank * scheme.rank_stride + stage
        replica = draw(st.integers(0, (scheme.dp_stride - 1 - span) // scheme.replica_stride))
        return stage, rank, replica, draw(st.integers(0, 3))

    return scheme, purpose, endpoint(), endpoint()


@given(two_endpoints())
def test_one_purpose_is_injective_on_its_domain(drawn) -> None:
    """PORT-2: distinct (dp, replica, rank, stage) in the domain get distinct ports."""
    scheme, purpose, a, b = drawn
    base = 1
    assume(all(raw_port(scheme, purpose, base, *e) <= 65535 for e in (a, b)))
    port_a, port_b = (port(purpose, base, *e, scheme=scheme) for e in (a, b))
    assert (port_a == port_b) == (a == b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: port("kv", 50000, 16), r"stage 16 is out of range.*0\.\.15.*\[PORT-2\]"),
        (lambda: port("kv", 50000, 0, rank=64), r"rank 64 is out of range.*1024 must be <"),
        (lambda: port("kv", 50000, 0, dp_rank=1), r"dp_rank 1 needs a scheme with a dp_stride"),
        (lambda: port("kv", 65000, 0, replica=1), r"would be 66124; ports must be in 1\.\.65535"),
        (lambda: port("forward", 0, 0), r"would be 0; ports must be in 1\.\.65535"),
        (lambda: port("orchestrator", 50000, 0, rank=1), r"rank must be 0, got 1"),
        (lambda: port("kv", 50000, -1), r"stage must be >= 0, got -1 \[PORT-2\]"),
        (lambda: port("zmq", 50000, 0), r"purpose must be one of 'kv', 'forward'"),
        (
            lambda: port("kv", 1, 0, replica=4, scheme=PortScheme(dp_stride=4096)),
            r"replica 4 is out of range.*must be < dp_stride 4096",
        ),
    ],
)
def test_outside_the_domain_is_refused(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def _equal_port_pairs(ports) -> int:
    """How many pairs of endpoints share a port, counted independently of port_map."""
    return sum(k * (k - 1) // 2 for k in Counter(e.port for e in ports.endpoints).values())


@given(deployments(), port_schemes())
@example(TWO_REPLICAS, COMPATIBLE)
@example(FIVE_TP8_STAGES, COMPATIBLE)
def test_the_deployment_check_is_exact(deployment: Deployment, scheme: PortScheme) -> None:
    """PORT-3: accepted iff every endpoint is in the domain and no two share a port."""
    ports = port_map(deployment, scheme=scheme)
    index = {e: i for i, e in enumerate(ports.endpoints)}
    named = {tuple(sorted((index[a], index[b]))) for a, b in ports.collisions}
    assert all(a.port == b.port and a != b for a, b in ports.collisions)
    assert len(named) == len(ports.collisions) == _equal_port_pairs(ports)
    in_domain = 0
    for e in ports.endpoints:
        try:
            assert (
                port(
                    e.purpose, deployment.base, e.stage, e.rank, e.replica, e.dp_rank, scheme=scheme
                )
                == e.port
            )
            in_domain += 1
        except ValueError:
            pass
    assert len(ports.problems) == len(ports.endpoints) - in_domain
    assert ports.ok == (not named and not ports.problems)
    if ports.ok:
        assert check_deployment(deployment, scheme=scheme) == ports
    else:
        with pytest.raises(ValueError, match=r"\[PORT-3\]"):
            check_deployment(deployment, scheme=scheme)
    tuples = {(e.purpose, e.dp_rank, e.replica, e.rank, e.stage) for e in ports.endpoints}
    assert len(tuples) == len(ports.endpoints)


def test_two_replicas_are_distinct() -> None:
    ports = check_deployment(TWO_REPLICAS)
    assert len(ports.endpoints) == 16
    kv = sorted(e.port for e in ports.endpoints if e.purpose == "kv")
    assert kv == [50100, 50101, 50116, 51124, 51125, 51140]


def test_many_stages_collide_and_each_pair_is_named() -> None:
    with pytest.raises(ValueError) as raised:
        check_deployment(FIVE_TP8_STAGES)
    message = str(raised.value)
    assert "3 colliding pair(s)" in message
    assert (
        "port 50100: kv (stage 0, replica 0, rank 0) and forward (stage 4, replica 0, rank 6)"
        in message
    )
    assert (
        "port 50200: orchestrator (stage 0, replica 0, rank 0) and kv (stage 4, replica 0, rank 6)"
        in message
    )


def test_a_data_parallel_term_is_expressible() -> None:
    """PORT-1: dp groups collide without a dp stride and are distinct with one."""
    deployment = Deployment(20000, (DeployedStage(0, StageLayout(4), dp=2),))
    assert not port_map(deployment).ok
    assert check_deployment(deployment, scheme=PortScheme(dp_stride=4096)).ok


def test_cli_prints_the_map_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["ports", "--base", "50000", "--stage", "tp=2,replicas=2", "--stage", "tp=1,replicas=2"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert "      0        1     1    (0,1)   51140    51040             -" in out
    assert "verdict   16 ports, all distinct and in 1..65535 [PORT-3]" in out


def test_cli_refuses_collisions_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ports", *[w for _ in range(5) for w in ("--stage", "tp=8")]])
    out, err = capsys.readouterr()
    assert code == 2
    assert "50100*" in out
    assert "kvspec ports: refused: 3 colliding pair(s)" in err


def test_cli_json_and_bad_specs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ports", "--stage", "tp=2,dp=2", "--dp-stride", "4096", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr()[0])
    assert report["ok"] and len(report["endpoints"]) == 10
    assert main(["ports", "--stage", "tp=2,color=red"]) == 2
    assert "got 'color=red'" in capsys.readouterr()[1]
    assert main(["ports", "--stage", "id=1", "--stage", "id=1"]) == 2
    assert "stage ids must be distinct; repeated: [1]" in capsys.readouterr()[1]
