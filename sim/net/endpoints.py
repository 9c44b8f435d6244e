"""Where each rank listens: the spec's ports, as ZMQ endpoints, checked for the whole run.

With ``--ports spec`` every KV port comes from :func:`kvspec.naming.ports.port` and the run's
deployment is checked with :func:`kvspec.naming.ports.check_deployment` before any process
starts, so a run whose ports would collide is refused with the spec's reasons
[PORT-1..3]. With ``--ports os`` the operating system assigns them; either way each
sender reports the endpoint it really bound, and receivers connect to that.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

from kvspec.naming.ports import DeployedStage, Deployment, PortMap, check_deployment, port
from sim.run.config import SimConfig


@dataclass(frozen=True)
class RankId:
    """One simulated rank: replica group, stage of the chain, stage-local rank."""

    replica: int
    stage: int
    rank: int

    @property
    def name(self) -> str:
        return f"replica {self.replica} stage {self.stage} rank {self.rank}"

    @property
    def tag(self) -> str:
        """A compact identifier for sockets and file names: ``r0s1k3``."""
        return f"r{self.replica}s{self.stage}k{self.rank}"


def deployment(config: SimConfig) -> Deployment:
    """The run as a deployment of the spec: every stage of the chain, every replica."""
    return Deployment(
        config.base_port,
        tuple(
            DeployedStage(stage_id=i, layout=layout, replicas=config.replicas)
            for i, layout in enumerate(config.stages)
        ),
    )


def check_ports(config: SimConfig) -> PortMap:
    """Refuse a run whose ports collide or leave 1..65535 [PORT-3]."""
    return check_deployment(deployment(config))


def bind_endpoint(config: SimConfig, who: RankId, run_id: str) -> str:
    """Where sender ``who`` binds its KV socket: the port of [PORT-1] on the run's host
    (``--ports spec``), any free port there (``--ports os``), or for in-process runs an
    ``inproc://`` name unique to this run, so concurrent runs never share one."""
    if config.transport == "inproc":
        return f"inproc://kvspec-{run_id}-kv-{who.tag}"
    if config.ports == "os":
        return f"tcp://{config.host}:*"
    return f"tcp://{config.host}:{port('kv', config.base_port, who.stage, who.rank, who.replica)}"


def kv_ports(config: SimConfig) -> list[int]:
    """Every KV port the run's senders bind [PORT-1]."""
    return [port("kv", config.base_port, w.stage, w.rank, w.replica) for w in all_ranks(config)]


def port_is_free(host: str, number: int) -> bool:
    """Whether a listener could bind ``host:number`` now (connections in TIME_WAIT aside)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, number))
            probe.listen()
        except OSError:
            return False
    return True


def find_free_base(config: SimConfig, *, start: int = 20000, stop: int = 32768) -> int:
    """A base port, from ``start`` in steps of 256, whose every KV port is free and below
    ``stop`` (where the usual ephemeral port range begins)."""
    base, numbers = start, []
    while base < stop:
        candidate = replace(config, base_port=base)
        numbers = kv_ports(candidate)
        if max(numbers) < stop and all(port_is_free(config.host, n) for n in numbers):
            return base
        base += 256
    raise ValueError(f"no base port in {start}..{stop} has all {len(numbers)} KV ports free")


def all_ranks(config: SimConfig) -> list[RankId]:
    return [
        RankId(replica, stage, rank)
        for replica in range(config.replicas)
        for stage, layout in enumerate(config.stages)
        for rank in layout.ranks()
    ]
