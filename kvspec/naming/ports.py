"""Ports: which TCP port each (purpose, replica, rank, stage) binds, and proof they differ.

Every endpoint's port is one formula [PORT-1]::

    base + offset[purpose] + dp_rank*dp_stride + replica*replica_stride + rank*rank_stride + stage

with the compatible defaults offset = 100 (KV transfer), 0 (request forwarding),
200 (orchestrator), rank_stride 16, replica_stride 1024 and no data-parallel term. For
replica 0 this is exactly the field's ``base + 100 + rank*16 + stage`` (KV),
``base + 0 + stage + rank*16`` (forwarding) and ``base + 200 + stage`` (orchestrator);
the field's forwarding and orchestrator formulas name no replica, so the spec adds the
same replica term to them — otherwise two replicas on one host would share them.

:func:`port` refuses arguments outside the domain on which one purpose's ports are
distinct (mixed-radix digits that fit their strides) and ports outside 1..65535
[PORT-2]. Different purposes can still meet (with the defaults, forwarding for
stage s+4, rank r+6 is KV for stage s, rank r), so a whole deployment is checked by
enumeration: :func:`check_deployment` lists every endpoint and either proves every
port distinct or names each colliding pair [PORT-3].
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_choice, require_int
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "PORT-1",
        "The port formula",
        "The port of (purpose, dp_rank, replica, rank, stage) is base + offset[purpose] + "
        "dp_rank*dp_stride + replica*replica_stride + rank*rank_stride + stage, rank being "
        "the stage-local rank [STAGE-1]. Compatible defaults: offsets kv 100, forward 0, "
        "orchestrator 200; rank_stride 16; replica_stride 1024; no dp term. An orchestrator "
        "has one port per (dp_rank, replica, stage): its rank is 0. A rank of a stage with "
        "attention-DP groups [STAGE-2] enters the formula, with a dp_stride, as its DP rank "
        "and its rank within its group (pp_rank * tp / dp + its index in the group); without "
        "one, as its stage-local rank (which carries the group) and dp_rank 0.",
        obligations=(
            must("the KV port is base + 100 + replica*1024 + rank*16 + stage"),
            must(
                "a rank of a stage with attention DP [STAGE-2] takes, with a dp_stride, its DP "
                "rank as dp_rank and its rank within its DP group as rank; without one, its "
                "stage-local rank"
            ),
        ),
    ),
    Clause(
        "PORT-2",
        "The collision-free domain of one purpose",
        "port() accepts integers with 0 <= stage < rank_stride, rank*rank_stride + stage < "
        "replica_stride, replica >= 0, dp_rank = 0 without a dp_stride, and "
        "replica*replica_stride + rank*rank_stride + stage < dp_stride with one; orchestrator "
        "rank 0; and only results in 1..65535. On this domain one purpose's ports are "
        "distinct. Anything else is refused with the value and its limit.",
        obligations=(
            refuses("a stage >= rank_stride"),
            refuses("rank*rank_stride + stage >= replica_stride"),
            refuses("a port outside 1..65535"),
            refuses("a negative base, stage, rank or replica"),
            refuses("a base, stage, rank or replica that is not an integer"),
            refuses(
                "with a dp_stride, replica*replica_stride + rank*rank_stride + stage >= "
                "dp_stride (a replica's ports running into the next DP rank's)"
            ),
        ),
    ),
    Clause(
        "PORT-3",
        "A deployment's ports are all distinct",
        "A deployment (base port; stages with their id, TP x PP, replicas and dp size) has "
        "one endpoint per (purpose, dp_rank, replica, rank, stage), orchestrators at rank 0. "
        "It is accepted only when every endpoint lies in the domain of PORT-2 and no two "
        "endpoints share a port; otherwise every problem and every colliding pair is named.",
        obligations=(
            must("every KV endpoint of a deployment (stages, ranks, replicas) gets its own port"),
        ),
    ),
)

PURPOSES: tuple[str, ...] = ("kv", "forward", "orchestrator")
"""KV transfer (the sender binds), request forwarding, orchestrator [PORT-1]."""

MIN_PORT, MAX_PORT = 1, 65535


@dataclass(frozen=True)
class PortScheme:
    """Offsets and strides of the port formula [PORT-1]; the defaults are compatible."""

    kv_offset: int = 100
    forward_offset: int = 0
    orchestrator_offset: int = 200
    rank_stride: int = 16
    replica_stride: int = 1024
    dp_stride: int | None = None

    def __post_init__(self) -> None:
        for name in ("kv_offset", "forward_offset", "orchestrator_offset"):
            require_int(name, getattr(self, name), minimum=0)
        require_int("rank_stride", self.rank_stride, minimum=1)
        require_int("replica_stride", self.replica_stride, minimum=1)
        if self.dp_stride is not None:
            require_int("dp_stride", self.dp_stride, minimum=1)

    def offset(self, purpose: str) -> int:
        require_choice("purpose", purpose, PURPOSES)
        return getattr(self, f"{purpose}_offset")

    def describe(self) -> str:
        """The formula with this scheme's numbers."""
        offsets = ", ".join(f"{p} {self.offset(p)}" for p in PURPOSES)
        dp = "" if self.dp_stride is None else f" + dp_rank*{self.dp_stride}"
        return (
            f"port = base + offset ({offsets}){dp} + replica*{self.replica_stride} + "
            f"rank*{self.rank_stride} + stage"
        )


COMPATIBLE = PortScheme()
"""The field's defaults [PORT-1]."""


def raw_port(
    scheme: PortScheme, purpose: str, base: int, stage: int, rank: int, replica: int, dp_rank: int
) -> int:
    """The formula of [PORT-1] without the domain checks of [PORT-2]."""
    dp = 0 if scheme.dp_stride is None else dp_rank * scheme.dp_stride
    return (
        base
        + scheme.offset(purpose)
        + dp
        + replica * scheme.replica_stride
        + rank * scheme.rank_stride
        + stage
    )


def _field(name: str, value: object) -> int:
    try:
        return require_int(name, value, minimum=0)
    except ValueError as error:
        raise ValueError(f"{error} [PORT-2]") from None


def port(
    purpose: str,
    base: int,
    stage: int,
    rank: int = 0,
    replica: int = 0,
    dp_rank: int = 0,
    *,
    scheme: PortScheme = COMPATIBLE,
) -> int:
    """The port of one endpoint, refused outside the collision-free domain [PORT-1, PORT-2]."""
    require_choice("purpose", purpose, PURPOSES)
    for name, value in (
        ("base", base),
        ("stage", stage),
        ("rank", rank),
        ("replica", replica),
        ("dp_rank", dp_rank),
    ):
        _field(name, value)
    if stage >= scheme.rank_stride:
        raise ValueError(
            f"stage {stage} is out of range: with rank_stride {scheme.rank_stride} stages must "
            f"be 0..{scheme.rank_stride - 1}, or stage {stage} of rank r would share a port "
            f"with stage {stage - scheme.rank_stride} of rank r+1 [PORT-2]"
        )
    if purpose == "orchestrator" and rank != 0:
        raise ValueError(
            f"an orchestrator has one port per stage and replica; rank must be 0, got {rank} "
            "[PORT-1]"
        )
    within_replica = rank * scheme.rank_stride + stage
    if within_replica >= scheme.replica_stride:
        raise ValueError(
            f"rank {rank} is out of range: rank*{scheme.rank_stride} + stage = {within_replica} "
            f"must be < replica_stride {scheme.replica_stride}, or it would share a port with "
            f"the next replica [PORT-2]"
        )
    if scheme.dp_stride is None:
        if dp_rank != 0:
            raise ValueError(
                f"dp_rank {dp_rank} needs a scheme with a dp_stride; this scheme has none, so "
                "dp_rank must be 0 [PORT-2]"
            )
    elif replica * scheme.replica_stride + within_replica >= scheme.dp_stride:
        span = replica * scheme.replica_stride + within_replica
        raise ValueError(
            f"replica {replica} is out of range: replica*{scheme.replica_stride} + "
            f"rank*{scheme.rank_stride} + stage = {span} must be < dp_stride "
            f"{scheme.dp_stride}, or it would share a port with the next dp rank [PORT-2]"
        )
    number = raw_port(scheme, purpose, base, stage, rank, replica, dp_rank)
    if not MIN_PORT <= number <= MAX_PORT:
        raise ValueError(
            f"{purpose} port of stage {stage}, rank {rank}, replica {replica} would be "
            f"{number}; ports must be in {MIN_PORT}..{MAX_PORT} [PORT-2]"
        )
    return number


def port_coords(layout: StageLayout, rank: int, scheme: PortScheme = COMPATIBLE) -> tuple[int, int]:
    """``(dp_rank, rank)`` a stage-local rank enters the formula with [PORT-1, STAGE-2]:
    with a dp_stride, its attention-DP rank and its rank within the group; else
    ``(0, rank)``."""
    if scheme.dp_stride is None or layout.dp == 1:
        layout.coords(rank)  # refuses a rank outside the stage
        return 0, rank
    where = layout.locate(rank)
    width = layout.tp // layout.dp
    return where.dp_rank, where.pp_rank * width + where.tp_rank - where.dp_rank * width


def rank_port(
    purpose: str,
    base: int,
    stage: int,
    layout: StageLayout,
    rank: int,
    replica: int = 0,
    *,
    scheme: PortScheme = COMPATIBLE,
) -> int:
    """The port of stage-local ``rank`` of ``layout`` [PORT-1, PORT-2]: its attention-DP
    group is the formula's dp term when the scheme has a dp_stride."""
    require_int("rank", rank, minimum=0)
    dp_rank, local = port_coords(layout, rank, scheme)
    return port(purpose, base, stage, local, replica, dp_rank, scheme=scheme)


@dataclass(frozen=True)
class DeployedStage:
    """One stage of a deployment: its id (the ``stage`` of the formula) and its size."""

    stage_id: int
    layout: StageLayout = field(default_factory=StageLayout)
    replicas: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        _field("stage_id", self.stage_id)
        if not isinstance(self.layout, StageLayout):
            raise ValueError(f"layout must be a StageLayout, got {self.layout!r}")
        require_int("replicas", self.replicas, minimum=1)
        require_int("dp", self.dp, minimum=1)
        if self.dp > 1 and self.layout.dp > 1:
            raise ValueError(
                f"stage {self.stage_id}: give data parallelism either as the layout's attention "
                f"DP groups (dp={self.layout.dp}) or as dp={self.dp} copies of the layout, not "
                "both [PORT-3]"
            )

    def describe(self) -> str:
        extra = "" if self.replicas == 1 else f" x{self.replicas} replicas"
        extra += "" if self.dp == 1 else f" x DP{self.dp}"
        return f"stage {self.stage_id} {self.layout.describe()}{extra}"


@dataclass(frozen=True)
class Deployment:
    """Stages sharing one host's ports from ``base`` [PORT-3]."""

    base: int
    stages: tuple[DeployedStage, ...]

    def __post_init__(self) -> None:
        _field("base", self.base)
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise ValueError("a deployment needs at least one stage [PORT-3]")
        ids = [s.stage_id for s in self.stages]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"stage ids must be distinct; repeated: {repeated} [PORT-3]")


@dataclass(frozen=True)
class Endpoint:
    """One bound port: its purpose and coordinates [PORT-1]."""

    purpose: str
    stage: int
    dp_rank: int
    replica: int
    rank: int
    port: int

    def describe(self) -> str:
        dp = f"dp {self.dp_rank}, " if self.dp_rank else ""
        return f"{self.purpose} (stage {self.stage}, {dp}replica {self.replica}, rank {self.rank})"


@dataclass(frozen=True)
class PortMap:
    """Every endpoint of a deployment, its problems and its collisions [PORT-3]."""

    deployment: Deployment
    scheme: PortScheme
    endpoints: tuple[Endpoint, ...]
    problems: tuple[str, ...]
    collisions: tuple[tuple[Endpoint, Endpoint], ...]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.collisions

    def verdict(self) -> str:
        """One line when distinct, else every problem and colliding pair."""
        if self.ok:
            return (
                f"{len(self.endpoints)} ports, all distinct and in {MIN_PORT}..{MAX_PORT} [PORT-3]"
            )
        lines = [
            f"{len(self.collisions)} colliding pair(s) and {len(self.problems)} endpoint(s) "
            f"outside the domain among {len(self.endpoints)} ports [PORT-3]:"
        ]
        lines += [f"  {problem}" for problem in self.problems]
        lines += [f"  port {a.port}: {a.describe()} and {b.describe()}" for a, b in self.collisions]
        return "\n".join(lines)


def endpoints_of(deployment: Deployment) -> list[tuple[str, int, int, int, int]]:
    """``(purpose, stage, dp_rank, replica, rank)`` of every endpoint, in table order."""
    found = []
    for stage in deployment.stages:
        for dp_rank in range(stage.dp):
            for replica in range(stage.replicas):
                for rank in stage.layout.ranks():
                    for purpose in PURPOSES:
                        if purpose != "orchestrator" or rank == 0:
                            found.append((purpose, stage.stage_id, dp_rank, replica, rank))
    return found


def port_map(deployment: Deployment, *, scheme: PortScheme = COMPATIBLE) -> PortMap:
    """Every endpoint's port, with domain problems and colliding pairs listed [PORT-3]."""
    endpoints, problems = [], []
    layouts = {s.stage_id: s.layout for s in deployment.stages}
    for purpose, stage, dp_rank, replica, rank in endpoints_of(deployment):
        if layouts[stage].dp > 1:  # attention DP inside the layout [STAGE-2]
            dp_rank, rank = port_coords(layouts[stage], rank, scheme)
        number = raw_port(scheme, purpose, deployment.base, stage, rank, replica, dp_rank)
        endpoint = Endpoint(purpose, stage, dp_rank, replica, rank, number)
        try:
            port(purpose, deployment.base, stage, rank, replica, dp_rank, scheme=scheme)
        except ValueError as error:
            problems.append(f"{endpoint.describe()}: {error}")
        endpoints.append(endpoint)
    by_port: dict[int, list[Endpoint]] = defaultdict(list)
    for endpoint in endpoints:
        by_port[endpoint.port].append(endpoint)
    collisions = tuple(
        pair for number in sorted(by_port) for pair in combinations(by_port[number], 2)
    )
    return PortMap(deployment, scheme, tuple(endpoints), tuple(problems), collisions)


def check_deployment(deployment: Deployment, *, scheme: PortScheme = COMPATIBLE) -> PortMap:
    """The port map of a deployment whose ports are all distinct; refused otherwise [PORT-3]."""
    ports = port_map(deployment, scheme=scheme)
    if not ports.ok:
        described = ", ".join(s.describe() for s in deployment.stages)
        raise ValueError(f"deployment at base {deployment.base} ({described}): {ports.verdict()}")
    return ports
