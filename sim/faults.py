"""Fault injection: what can go wrong on the wire and in the ranks, parsed from one string.

``--faults drop=0.05,dup=0.05,reorder=0.1,delay=5ms,corrupt=0.01,kill=sender:1@0.5``

=============  ==========================================================================
``drop=P``     a data message is not sent (probability P per message)
``dup=P``      a data message is sent twice
``reorder=P``  a data message is held back and sent after the sender's next one
``delay=T``    every data message waits T first (``5ms``, ``0.2s``)
``corrupt=P``  one byte of one frame of a data message is flipped
``garbage=P``  a frame of random bytes is sent to the receiver before a data message
``kill=R``     rank R dies abruptly part way: ``sender:1@0.5`` = sender rank 1 after half
               its messages; ``receiver:0@0.3``; in a chain ``stage1:2@0.5``. Several
               with ``+``: ``kill=sender:1@0.5+receiver:0@0.8``
``hang=R``     rank R stops responding (same syntax): the run's deadline must end it
=============  ==========================================================================

Every decision is drawn from a generator seeded by (seed, replica, stage, rank), so a
run is reproducible. Faults touch data messages only; control messages (hello,
end-of-stream) are reliable, as a real transport's connection state is.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

PROBABILITIES = ("drop", "dup", "reorder", "corrupt", "garbage")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|us)$")
_RANK = re.compile(r"^(sender|receiver|stage(\d+)):(\d+)@(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class RankFault:
    """A rank that dies (``kill``) or hangs (``hang``) after ``fraction`` of its work."""

    kind: str
    role: str  # "sender", "receiver" or "stageN"
    rank: int
    fraction: float

    def applies_to(self, stage: int, last_stage: int, rank: int, *, sending: bool) -> bool:
        """Whether this fault is for (stage, rank) in the given role of a chain."""
        if self.rank != rank:
            return False
        if self.role == "sender":
            return stage == 0 and sending
        if self.role == "receiver":
            return stage == last_stage and not sending
        return self.role == f"stage{stage}"

    def describe(self) -> str:
        return f"{self.kind}={self.role}:{self.rank}@{self.fraction:g}"


@dataclass(frozen=True)
class FaultSpec:
    """The parsed ``--faults`` string; the default injects nothing."""

    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    garbage: float = 0.0
    delay_s: float = 0.0
    ranks: tuple[RankFault, ...] = field(default=())

    @property
    def any(self) -> bool:
        return self != FaultSpec()

    def describe(self) -> str:
        parts = [f"{name}={getattr(self, name):g}" for name in PROBABILITIES if getattr(self, name)]
        if self.delay_s:
            parts.append(f"delay={self.delay_s * 1000:g}ms")
        parts += [r.describe() for r in self.ranks]
        return ",".join(parts) or "none"


def parse_faults(text: str | None) -> FaultSpec:
    """Parse ``--faults``; every malformed part is an error naming it and the syntax."""
    if not text or text == "none":
        return FaultSpec()
    values: dict[str, object] = {}
    ranks: list[RankFault] = []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"fault {part!r} must be NAME=VALUE (see --help for the names)")
        if name in PROBABILITIES:
            try:
                probability = float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r}: expected a probability 0..1") from None
            if not 0 <= probability <= 1:
                raise ValueError(f"{name}={value}: a probability must be in 0..1")
            values[name] = probability
        elif name == "delay":
            match = _DURATION.match(value)
            if not match:
                raise ValueError(f"delay={value!r}: expected a duration such as 5ms, 0.2s, 300us")
            scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[match.group(2)]
            values["delay_s"] = float(match.group(1)) * scale
        elif name in ("kill", "hang"):
            for item in value.split("+"):
                match = _RANK.match(item)
                if not match:
                    raise ValueError(
                        f"{name}={item!r}: expected ROLE:RANK@FRACTION with ROLE sender, "
                        "receiver or stageN, e.g. sender:1@0.5"
                    )
                fraction = float(match.group(4))
                if not 0 <= fraction <= 1:
                    raise ValueError(f"{name}={item}: the fraction must be in 0..1")
                ranks.append(RankFault(name, match.group(1), int(match.group(3)), fraction))
        else:
            known = ", ".join([*PROBABILITIES, "delay", "kill", "hang"])
            raise ValueError(f"unknown fault {name!r}; known: {known}")
    return FaultSpec(**values, ranks=tuple(ranks))  # type: ignore[arg-type]


class FaultInjector:
    """Per-rank decisions for one sender, reproducible from the seed."""

    def __init__(self, spec: FaultSpec, seed: int, replica: int, stage: int, rank: int) -> None:
        self.spec = spec
        self.rng = random.Random(f"{seed}:{replica}:{stage}:{rank}")

    def hit(self, name: str) -> bool:
        """Whether the fault ``name`` strikes the next data message."""
        probability = getattr(self.spec, name)
        return probability > 0 and self.rng.random() < probability

    def corrupt(self, frames: list[bytes | memoryview]) -> list[bytes | memoryview]:
        """A copy of ``frames`` with one byte of one non-empty frame flipped."""
        candidates = [i for i, f in enumerate(frames) if len(f)]
        if not candidates:
            return frames
        i = self.rng.choice(candidates)
        damaged = bytearray(frames[i])
        damaged[self.rng.randrange(len(damaged))] ^= 1 << self.rng.randrange(8)
        return [*frames[:i], bytes(damaged), *frames[i + 1 :]]

    def garbage(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 64))
