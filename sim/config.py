"""One simulated run, fully described as plain data (it travels to every rank as JSON)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvspec.model import ModelShape
from kvspec.stage import StageLayout
from sim.faults import FaultSpec, parse_faults

_LAYOUT = re.compile(r"^(?:PP(\d+)X)?TP(\d+)$")


def parse_stage(text: str) -> StageLayout:
    """``TP4`` or ``PP2xTP2`` (as ``StageLayout.describe`` writes them) -> a layout."""
    match = _LAYOUT.match(text.strip().upper())
    if not match:
        raise ValueError(f"stage {text!r}: expected TP<n> or PP<n>xTP<n>, e.g. TP4 or PP2xTP2")
    return StageLayout(tp=int(match.group(2)), pp=int(match.group(1) or 1))


def parse_seq_len(text: str) -> tuple[int, int]:
    """``MIN:MAX`` or ``N`` -> (min, max), both >= 1."""
    low, _, high = text.partition(":")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"--seq-len {text!r}: expected MIN:MAX or N, e.g. 16:256") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"--seq-len {text!r}: need 1 <= MIN <= MAX")
    return bounds


@dataclass(frozen=True)
class SimConfig:
    """Everything a run needs. ``stages`` is the chain: stage i sends to stage i+1."""

    stages: tuple[StageLayout, ...]
    model: ModelShape
    src_layout: str = "flash_attn"
    dst_layout: str = "flash_attn"
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
    base_port: int = 20000
    faults: FaultSpec = field(default_factory=FaultSpec)
    seed: int = 0
    timeout: float = 60.0
    ranks_per_process: int = 1
    transport: str = "tcp"
    checksum: bool = True
    verify_after: bool = False

    def __post_init__(self) -> None:
        if len(self.stages) < 2:
            raise ValueError("a run needs at least two stages (a sender and a receiver)")
        if self.chunks < 1 or self.requests < 1 or self.replicas < 1:
            raise ValueError(
                f"--chunks, --requests and --replicas must be >= 1; got {self.chunks}, "
                f"{self.requests}, {self.replicas}"
            )
        if self.chunks > self.seq_len[0]:
            raise ValueError(
                f"--chunks {self.chunks} exceeds the shortest request ({self.seq_len[0]} tokens); "
                "every chunk needs at least one token"
            )
        if self.transport not in ("tcp", "inproc"):
            raise ValueError(f"transport must be 'tcp' or 'inproc', got {self.transport!r}")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {self.timeout}")

    @property
    def last_stage(self) -> int:
        return len(self.stages) - 1

    def layout_of(self, stage: int) -> tuple[str, int]:
        """(cache layout name, block size) of a stage: stage 0 the source's, others the target's."""
        if stage == 0:
            return self.src_layout, self.src_block_size
        return self.dst_layout, self.dst_block_size

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [s.to_dict() for s in self.stages]
        data["model"] = self.model.to_dict()
        data["faults"] = self.faults.describe()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimConfig:
        return cls(
            **{
                **data,
                "stages": tuple(StageLayout.from_dict(s) for s in data["stages"]),
                "model": ModelShape.from_dict(data["model"]),
                "faults": parse_faults(data["faults"]),
                "seq_len": tuple(data["seq_len"]),
            }
        )
