"""One simulated run, fully described as plain data (it travels to every rank as JSON)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from kvspec.core.forms import build, form_list, read_form
from kvspec.memory.cache_layout import PRESETS, CacheLayout, get_layout, require_layout
from kvspec.memory.records import carrier_model, cell_bytes
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.run.content import ContentKind, content_kind
from sim.run.faults import FaultSpec, check_rank_faults, parse_faults

_LAYOUT = re.compile(r"^(?:PP(\d{1,5})X)?TP(\d{1,5})$")

TRANSFERS: tuple[str, ...] = ("push", "pull", "write")
LIFECYCLE_KINDS: tuple[str, ...] = ("restart", "fail-nth")
"""Rank faults that exercise a receiver's block pool [LIFE-1..7]: push only."""
"""``push``: senders send payloads [PAYLOAD-1]; ``pull``: receivers read byte ranges from
the senders' caches [DESC-1] (:mod:`sim.paths.pull`); ``write``: senders write byte ranges from
their caches into the receivers' (:mod:`sim.paths.write`), the zero-copy path."""

TRANSPORTS: tuple[str, ...] = ("tcp", "inproc", "gloo", "nccl", "nixl", "mooncake")
"""``tcp``: ZMQ between rank processes; ``inproc``: ZMQ between threads of one process;
``gloo``/``nccl``: control and headers over ZMQ on TCP, the tensor frames over
torch.distributed point-to-point send/recv (:mod:`sim.net.p2p`); ``nixl``/``mooncake``:
control over ZMQ on TCP, the bytes one-sided through NIXL over UCX or the Mooncake
transfer engine over TCP (:mod:`sim.paths.onesided`)."""
P2P_TRANSPORTS: tuple[str, ...] = ("gloo", "nccl")
ONE_SIDED: tuple[str, ...] = ("nixl", "mooncake")
ONE_SIDED_LIBRARIES: dict[str, tuple[str, str]] = {
    "nixl": ("nixl_cu12", "pip install 'kvspec[nixl]'"),
    "mooncake": (
        "mooncake.engine",
        "pip install 'kvspec[mooncake]' (and apt-get install libibverbs1)",
    ),
}
"""Each one-sided transport's module, and how to install it."""
UNAUTHENTICATED: dict[str, str] = {
    "mooncake": "the Mooncake transfer engine authenticates no peer and listens on every "
    "interface (its RPC port on 0.0.0.0, its TCP data port on *): anyone who reaches that "
    "port, any local user included, can read and write every rank's registered cache "
    "without the run's metadata (get_first_buffer_address, then batch_transfer_sync_read or "
    "_write)",
}
"""The one-sided engines that let a stranger in, and how [sim.paths.mooncake]: a run over
one is refused unless asked for with ``--allow-unauthenticated-transport``
(:func:`sim.paths.onesided_checks.check_unauthenticated`)."""


ENGINE_NAMES: dict[str, str] = {
    "nixl": "NIXL over UCX (TCP loopback)",
    "mooncake": "the Mooncake transfer engine (TCP loopback)",
}

PORT_MODES: tuple[str, ...] = ("spec", "os")
"""``spec``: every sender binds the port of [PORT-1] (the run's ports are proven distinct
first, [PORT-3]); ``os``: the operating system assigns each sender a free port, which
the sender reports to the parent and the parent hands to its receivers."""


@dataclass(frozen=True)
class Limits:
    """The largest run the sim accepts; beyond them a run is refused before it starts."""

    ranks: int = 1024  # across every stage and replica group
    requests: int = 100_000
    seq_len: int = 1 << 20
    chunks: int = 1024
    replicas: int = 64
    block_size: int = 1 << 16
    timeout_s: float = 86_400.0
    ranks_per_process: int = 1024
    layer_compute_ms: float = 10_000.0


LIMITS = Limits()


def parse_stage(text: str) -> StageLayout:
    """``TP4`` or ``PP2xTP2`` (as ``StageLayout.describe`` writes them) -> a layout."""
    match = _LAYOUT.match(text.strip().upper())
    if not match:
        raise ValueError(f"stage {text!r}: expected TP<n> or PP<n>xTP<n>, e.g. TP4 or PP2xTP2")
    return StageLayout(tp=int(match.group(2)), pp=int(match.group(1) or 1))


_SEQ_LEN = re.compile(r"([0-9]{1,12})(?::([0-9]{1,12}))?")


def parse_seq_len(text: str) -> tuple[int, int]:
    """``MIN:MAX`` or ``N`` -> (min, max), both >= 1."""
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
    match = _SEQ_LEN.fullmatch(text)
    if not match:  # "3:" and " 3" too: what is used is what was written
        raise ValueError(f"--seq-len {shown}: expected MIN:MAX or N, e.g. 16:256")
    low, high = match.group(1), match.group(2)
    bounds = (int(low), int(high or low))
    if not 1 <= bounds[0] <= bounds[1] <= LIMITS.seq_len:
        raise ValueError(f"--seq-len {shown}: need 1 <= MIN <= MAX <= {LIMITS.seq_len}")
    return bounds


@dataclass(frozen=True)
class SimConfig:
    """Everything a run needs. ``stages`` is the chain: stage i sends to stage i+1."""

    stages: tuple[StageLayout, ...]
    model: ModelShape
    src_layout: CacheLayout = PRESETS["flash_attn"]
    """The source stage's cache layout, a value: a name or file is resolved where it is
    read (the command line, :meth:`from_dict`) [LAYOUT-1, LAYOUT-5]."""
    dst_layout: CacheLayout = PRESETS["flash_attn"]
    src_block_size: int = 16
    dst_block_size: int = 16
    requests: int = 8
    seq_len: tuple[int, int] = (16, 128)
    chunks: int = 1
    replicas: int = 1
    slicing: str = "sender"
    policy: str = "lowest"
    device: str = "cpu"
    host: str = "127.0.0.1"
    require_loopback: bool = False
    """Refuse a run any of whose ports would listen beyond loopback, naming the interface."""
    allow_unauthenticated_transport: bool = False
    """Run a one-sided engine that authenticates no peer (Mooncake's), which anyone who
    reaches its port can read and write through; refused without it
    (:mod:`sim.paths.onesided_checks`), and the report's first lines then say so."""
    ports: str = "spec"
    base_port: int = 20000
    faults: FaultSpec = field(default_factory=FaultSpec)
    seed: int = 0
    timeout: float = 60.0
    ranks_per_process: int = 1
    transport: str = "tcp"
    checksum: bool = True
    require_checksum: bool = False
    hold: int = 2
    unsafe_reuse: bool = False
    verify_after: bool = False
    transfer: str = "push"
    stream: str = "off"
    """``off``; ``whole``: compute every layer, then send the request; ``layers`` or
    ``chunks:N``: send each layer group as soon as it is computed [STREAM-1]."""
    layer_compute_ms: float = 1.0
    """Simulated compute per layer a sender holds, when ``stream`` is not ``off``."""

    def __post_init__(self) -> None:
        require_layout("SimConfig.src_layout", self.src_layout)
        require_layout("SimConfig.dst_layout", self.dst_layout)
        if len(self.stages) < 2:
            raise ValueError("a run needs at least two stages (a sender and a receiver)")
        for name, value, low, high in (
            ("--requests", self.requests, 1, LIMITS.requests),
            ("--chunks", self.chunks, 1, LIMITS.chunks),
            ("--replicas", self.replicas, 1, LIMITS.replicas),
            ("--src-block-size", self.src_block_size, 1, LIMITS.block_size),
            ("--dst-block-size", self.dst_block_size, 1, LIMITS.block_size),
            ("--ranks-per-process", self.ranks_per_process, 1, LIMITS.ranks_per_process),
            ("--hold", self.hold, 0, LIMITS.requests),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")
        ranks = sum(s.world_size for s in self.stages) * self.replicas
        if ranks > LIMITS.ranks:
            raise ValueError(
                f"the run has {ranks} ranks (stages {', '.join(s.describe() for s in self.stages)}"
                f" x {self.replicas} replica group(s)); the sim runs at most {LIMITS.ranks}"
            )
        if self.chunks > self.seq_len[0]:
            raise ValueError(
                f"--chunks {self.chunks} exceeds the shortest request ({self.seq_len[0]} tokens); "
                "every chunk needs at least one token"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"--transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}"
            )
        if self.transfer not in TRANSFERS:
            raise ValueError(
                f"--transfer must be one of {', '.join(TRANSFERS)}, got {self.transfer!r}"
            )
        if self.transfer != "push" and self.slicing != "sender":
            raise ValueError(
                f"--transfer {self.transfer} with --slicing receiver: a {self.transfer} moves "
                "exactly the receiver's share [DESC-1]; there is no whole shard to slice"
            )
        if self.transfer == "write" and self.transport in P2P_TRANSPORTS:
            raise ValueError(
                f"--transfer write with --transport {self.transport}: a write's frames are "
                "byte runs of the caches, framed for ZMQ; use --transport tcp or inproc"
            )
        if self.transfer == "write" and self.device != "cpu":
            raise ValueError(
                f"--transfer write with --device {self.device}: the write path frames CPU cache "
                "memory; use --transfer push or pull on a device"
            )
        if self.transfer != "push":
            lifecycle = [
                name
                for name, on in (
                    ("abort", self.faults.abort),
                    ("late", self.faults.late),
                    *((f.kind, True) for f in self.faults.ranks if f.kind in LIFECYCLE_KINDS),
                    ("--unsafe-reuse", self.unsafe_reuse),
                )
                if on
            ]
            if lifecycle:
                raise ValueError(
                    f"--transfer {self.transfer} with {', '.join(lifecycle)}: these act on "
                    "payloads pushed into a receiver's block pool [LIFE-1..7]; a pull or write "
                    "receiver holds its blocks from the start (use --transfer push)"
                )
        self._check_reuse()
        self._check_stream()
        self._check_groups()
        if self.ports not in PORT_MODES:
            raise ValueError(f"--ports must be one of {', '.join(PORT_MODES)}, got {self.ports!r}")
        if not 0 < self.timeout <= LIMITS.timeout_s:  # NaN fails this too
            raise ValueError(
                f"--timeout must be a number of seconds in (0, {LIMITS.timeout_s:g}], "
                f"got {self.timeout}"
            )
        if self.require_checksum and not self.checksum:
            raise ValueError(
                "--require-checksum with --no-checksum: every message would be refused"
            )
        check_rank_faults(self.faults, tuple(s.world_size for s in self.stages))

    def _check_reuse(self) -> None:
        """``reuse=P`` is observed by the oracle alone [ORACLE-5]: a request that fails for
        another reason first is never verified, so its stale blocks could not be counted
        where they are observed; the faults that fail requests are refused beside it."""
        f = self.faults
        if not f.reuse:
            return
        failing = [
            name
            for name, on in (
                ("drop", f.drop),
                ("corrupt", f.corrupt),
                ("abort", f.abort),
                *((r.kind, True) for r in f.ranks),
            )
            if on
        ]
        if failing:
            raise ValueError(
                f"--faults reuse={f.reuse:g} with {', '.join(dict.fromkeys(failing))}: a "
                "request failed for another reason is never verified, so its reused blocks "
                "would go unseen; run reuse=P with dup, reorder, garbage, late or delay only"
            )

    def _check_groups(self) -> None:
        """A hybrid model moves as layer-group parts [GROUP-3] over TP and PP stages: one
        stage pair, whole requests (or streamed by layer groups), pushed or pulled, over
        ZMQ on the CPU, with the wire and rank faults; what acts on a paged block pool or on
        token shards is refused by name."""
        if self.content != "groups":
            return
        f = self.faults
        refused = [
            name
            for name, on in (
                (f"{len(self.stages)} stages", len(self.stages) != 2),
                (
                    "token shards or attention-DP groups",
                    any(s.token_shards > 1 or s.dp > 1 for s in self.stages),
                ),
                (f"--chunks {self.chunks}", self.chunks > 1),
                ("--slicing receiver", self.slicing != "sender"),
                (f"--transfer {self.transfer}", self.transfer == "write"),
                (f"--transport {self.transport}", self.transport not in ("tcp", "inproc")),
                (f"--device {self.device}", self.device != "cpu"),
                ("--unsafe-reuse", self.unsafe_reuse),
                ("fp8 scales", self.model.scale_format is not None),
                *(
                    (f"--faults {name}", on)
                    for name, on in (
                        ("abort", f.abort),
                        ("late", f.late),
                        ("reuse", f.reuse),
                        *((r.kind, True) for r in f.ranks if r.kind in LIFECYCLE_KINDS),
                    )
                ),
            )
            if on
        ]
        if refused:
            raise ValueError(
                f"{self.model.describe()} with {', '.join(dict.fromkeys(refused))}: a hybrid "
                "model moves as layer-group parts [GROUP-3] between two TP/PP stages, whole "
                "or streamed, pushed or pulled, over tcp or inproc on the CPU; its receivers "
                "land parts in group regions, not in a paged block pool [LIFE-1..7]"
            )

    def _check_stream(self) -> None:
        groups = self.stream_groups  # refuses an unknown mode or a bad N
        if self.stream == "off":
            return
        if not 0 <= self.layer_compute_ms <= LIMITS.layer_compute_ms:  # NaN fails this too
            raise ValueError(
                f"--layer-compute-ms must be in 0..{LIMITS.layer_compute_ms:g}, "
                f"got {self.layer_compute_ms}"
            )
        clashes = [
            name
            for name, on in (
                (f"--chunks {self.chunks}", self.chunks > 1),
                (f"--transfer {self.transfer}", self.transfer != "push"),
            )
            if on
        ]
        if clashes and groups:
            raise ValueError(
                f"--stream {self.stream} with {', '.join(clashes)}: a streamed request moves "
                "as layer groups of one token chunk, pushed [STREAM-1]"
            )

    @property
    def stream_groups(self) -> int:
        """Layer groups per request [STREAM-1.1]: 0 when the request moves whole."""
        if self.stream in ("off", "whole"):
            return 0
        if self.stream == "layers":
            return self.model.num_layers
        match = re.fullmatch(r"chunks:([0-9]{1,6})", self.stream)
        if match is None:
            raise ValueError(
                f"--stream must be off, whole, layers or chunks:N, got {self.stream!r}"
            )
        n = int(match.group(1))
        if not 1 <= n <= self.model.num_layers:
            raise ValueError(
                f"--stream {self.stream}: N must be in 1..{self.model.num_layers} (the model's "
                "layers) [STREAM-1]"
            )
        return n

    @property
    def compute_s(self) -> float:
        """Simulated compute time per layer, in seconds (none unless streaming is on)."""
        return 0.0 if self.stream == "off" else self.layer_compute_ms / 1000

    @property
    def p2p(self) -> bool:
        """Whether tensor frames travel over torch.distributed (:mod:`sim.net.p2p`)."""
        return self.transport in P2P_TRANSPORTS

    @property
    def last_stage(self) -> int:
        return len(self.stages) - 1

    @cached_property
    def content(self) -> ContentKind:
        """What the run's caches hold, chosen once per run (:mod:`sim.run.content`)."""
        return content_kind(self.model, self.src_layout, self.dst_layout)

    @property
    def records(self) -> bool:
        """Whether the caches' cells are records with inline scales or a fixed format, whose
        every field the oracle fills and the receiver checks [LAYOUT-6, ORACLE-6]."""
        return self.content == "records"

    @property
    def transfer_model(self) -> ModelShape:
        """The model pushed payloads are planned, cut and merged by: a record cache's
        requests travel as rows of bytes [LAYOUT-7]; every other cache's as the model's."""
        if self.records and self.transfer == "push":
            plain = self.src_layout.plain
            return carrier_model(self.model, self.dst_layout if plain else self.src_layout)
        return self.model

    @property
    def cell_bytes(self) -> int:
        """Bytes of one (layer, token, head) cell of the caches, every field [LAYOUT-6]."""
        return cell_bytes(self.src_layout, self.model)

    def layout_of(self, stage: int) -> tuple[CacheLayout, int]:
        """(cache layout, block size) of a stage: stage 0 the source's, others the target's."""
        if stage == 0:
            return self.src_layout, self.src_block_size
        return self.dst_layout, self.dst_block_size

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [s.to_dict() for s in self.stages]
        data["model"] = self.model.to_dict()
        data["faults"] = self.faults.describe()
        for key in ("src_layout", "dst_layout"):  # a preset's name, or its file's path
            data[key] = getattr(self, key).ref
        return data

    @classmethod
    def from_dict(cls, data: object) -> SimConfig:
        """Inverse of :meth:`to_dict` (how a rank process receives its run's
        configuration); anything else is refused with :class:`~kvspec.core.errors.FormError`."""
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        required = ("stages", "model", "faults", "seq_len")
        form = read_form("SimConfig", data, required=required, optional=fields - set(required))
        stages = form_list("SimConfig.stages", form["stages"])
        return build(
            "SimConfig",
            lambda: cls(
                **{
                    **form,
                    "stages": tuple(
                        StageLayout.from_dict(s, where=f"SimConfig.stages[{i}]")
                        for i, s in enumerate(stages)
                    ),
                    "model": ModelShape.from_dict(form["model"], where="SimConfig.model"),
                    "faults": parse_faults(form["faults"]),
                    "seq_len": form_list("SimConfig.seq_len", form["seq_len"]),
                    **_read_layouts(form),
                }
            ),
        )


def _read_layouts(form: dict[str, Any]) -> dict[str, CacheLayout]:
    """The layouts of a configuration's form: each travels as its preset name or its file's
    path and is read here, where the form is parsed [LAYOUT-1, LAYOUT-5]."""
    return {key: get_layout(form[key]) for key in ("src_layout", "dst_layout") if key in form}
