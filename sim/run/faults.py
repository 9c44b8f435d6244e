"""Fault injection: what can go wrong on the wire and in the ranks, parsed from one string.

``--faults drop=0.05,dup=0.05,reorder=0.1,delay=5ms,corrupt=0.01,kill=sender:1@0.5``

=============  ==========================================================================
``drop=P``     a data message is not sent (probability P per message)
``dup=P``      a data message is sent twice
``reorder=P``  a data message is held back and sent after the sender's next one to the
               same receiver (at the end of the stream it goes out in order)
``delay=T``    every data message waits T first (``5ms``, ``0.2s``; at most 10 s)
``corrupt=P``  one bit of one payload frame of a data message is flipped (the envelope,
               which names the key, is left intact so the receiver can account for it)
``garbage=P``  a frame of random bytes is sent to the receiver before a data message
``kill=R``     rank R dies abruptly part way: ``sender:1@0.5`` = sender rank 1 after half
               its messages; ``receiver:0@0.3``; in a chain ``stage1:2@0.5``. Several
               with ``+``: ``kill=sender:1@0.5+receiver:0@0.8``
``hang=R``     rank R stops responding (same syntax): the run's deadline must end it
``abort=P``    a receiver aborts a request part way (probability P per request); it keeps
               the request's blocks until each sender acknowledges [LIFE-4]
``late=P``     a copy of a data message is held back and lands after the sender's next
               message on that edge: a write after its transfer completed or was
               aborted [LIFE-4]
``restart=R``  rank R restarts part way (``sender:1@0.5``): a new epoch, the old epoch's
               held writes still landing after it [LIFE-6]
``fail-nth=R`` the N-th send of rank R fails at the sender (``sender:1@5``) [LIFE-1]
``reuse=P``    a first-stage rank frees a request's blocks before their transfer is done
               and its allocator hands them to another request, whose KV overwrites them
               (probability P per request a rank sends): every descriptor a reader or
               writer holds for them is stale [LIFE-3, on the sender's side]
=============  ==========================================================================

Every decision is drawn from a generator seeded by (seed, replica, stage, rank), so a
run is reproducible. Faults touch data messages only; control messages (hello,
end-of-stream) are reliable, as a real transport's connection state is. Each fault is
counted where it is injected and where it is observed (:mod:`sim.books.accounting`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from kvspec.console.args import decimal

PROBABILITIES = ("drop", "dup", "reorder", "corrupt", "garbage", "late", "abort", "reuse")
RANK_KINDS = ("kill", "hang", "restart", "fail-nth")
MAX_DELAY_S = 10.0
MAX_SPEC_CHARS = 4096
_NUMBER = r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
_DURATION = re.compile(rf"({_NUMBER})(ms|s|us)", re.ASCII)
_RANK = re.compile(rf"(sender|receiver|stage(\d{{1,4}})):(\d{{1,6}})@({_NUMBER})", re.ASCII)


@dataclass(frozen=True)
class RankFault:
    """A rank that dies (``kill``) or hangs (``hang``) after ``fraction`` of its work."""

    kind: str
    role: str  # "sender", "receiver" or "stageN"
    rank: int
    fraction: float  # for fail-nth: N, the send that fails (1 = the first)

    def stage(self, last_stage: int) -> int:
        """The stage of the chain this fault's role names."""
        if self.role == "sender":
            return 0
        if self.role == "receiver":
            return last_stage
        return int(self.role.removeprefix("stage"))

    def applies_to(self, stage: int, last_stage: int, rank: int, *, sending: bool) -> bool:
        """Whether this fault is for (stage, rank) in the given role of a chain."""
        if self.rank != rank or self.stage(last_stage) != stage:
            return False
        if self.role == "sender":
            return sending
        if self.role == "receiver":
            return not sending
        return True

    def describe(self) -> str:
        return f"{self.kind}={self.role}:{self.rank}@{self.fraction!r}"

    @property
    def nth(self) -> int:
        """For ``fail-nth``: which send fails (1 = the first)."""
        return int(self.fraction)


@dataclass(frozen=True)
class FaultSpec:
    """The parsed ``--faults`` string; the default injects nothing."""

    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    garbage: float = 0.0
    late: float = 0.0
    abort: float = 0.0
    reuse: float = 0.0
    delay_s: float = 0.0
    ranks: tuple[RankFault, ...] = field(default=())

    @property
    def any(self) -> bool:
        return self != FaultSpec()

    def describe(self) -> str:
        parts = [f"{name}={getattr(self, name):g}" for name in PROBABILITIES if getattr(self, name)]
        if self.delay_s:
            parts.append(f"delay={self.delay_s!r}s")  # repr: parses back to the same float
        parts += [r.describe() for r in self.ranks]
        return ",".join(parts) or "none"


def _number(name: str, text: str) -> float:
    """A number of a fault spec, as written (:func:`kvspec.console.args.decimal`)."""
    try:
        return decimal(text)
    except ValueError as error:
        raise ValueError(f"{name}=: {error}") from None


def parse_faults(text: str | None) -> FaultSpec:
    """Parse ``--faults``; every malformed part is an error naming it and the syntax."""
    if not text or text == "none":
        return FaultSpec()
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(f"--faults is {len(text)} characters; at most {MAX_SPEC_CHARS}")
    values: dict[str, float] = {}
    ranks: list[RankFault] = []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ValueError(f"fault {_quote(part)} must be NAME=VALUE (see --help for the names)")
        if name in PROBABILITIES:
            try:
                probability = decimal(value)
            except ValueError as error:
                raise ValueError(f"{name}=: expected a probability 0..1: {error}") from None
            if not 0 <= probability <= 1:  # NaN fails this too
                raise ValueError(f"{name}={value}: a probability must be in 0..1")
            values[name] = probability
        elif name == "delay":
            match = _DURATION.fullmatch(value)
            if not match:
                raise ValueError(
                    f"delay={_quote(value)}: expected a duration such as 5ms, 0.2s, 300us"
                )
            scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[match.group(2)]
            delay = _number(name, match.group(1)) * scale
            if not delay <= MAX_DELAY_S:
                raise ValueError(f"delay={value}: at most {MAX_DELAY_S:g}s per message")
            values["delay_s"] = delay
        elif name in RANK_KINDS:
            for item in value.split("+"):
                match = _RANK.fullmatch(item)
                if not match:
                    raise ValueError(
                        f"{name}={_quote(item)}: expected ROLE:RANK@FRACTION with ROLE sender, "
                        "receiver or stageN, e.g. sender:1@0.5"
                    )
                fraction = _number(name, match.group(4))
                if name == "fail-nth":
                    if fraction != int(fraction) or not 1 <= fraction <= 1e9:
                        raise ValueError(
                            f"{name}={item}: after @ comes N, the send that fails (1, 2, ...)"
                        )
                elif not 0 <= fraction <= 1:
                    raise ValueError(f"{name}={item}: the fraction must be in 0..1")
                ranks.append(RankFault(name, match.group(1), int(match.group(3)), fraction))
        else:
            known = ", ".join([*PROBABILITIES, "delay", *RANK_KINDS])
            raise ValueError(f"unknown fault {_quote(name)}; known: {known}")
    return FaultSpec(**values, ranks=tuple(ranks))


def _quote(text: str, limit: int = 40) -> str:
    """``text`` quoted, cut to ``limit`` characters: an error names a bad value, not all of it."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def check_rank_faults(spec: FaultSpec, world_sizes: tuple[int, ...]) -> None:
    """Refuse a ``kill``/``hang`` naming a stage or rank the run does not have."""
    last = len(world_sizes) - 1
    for fault in spec.ranks:
        stage = fault.stage(last)
        if stage > last:
            raise ValueError(
                f"{fault.describe()}: the chain has stages 0..{last}, no stage {stage}"
            )
        if fault.rank >= world_sizes[stage]:
            raise ValueError(
                f"{fault.describe()}: stage {stage} has ranks 0..{world_sizes[stage] - 1}"
            )


class FaultInjector:
    """Per-rank decisions for one sender, reproducible from the seed."""

    def __init__(self, spec: FaultSpec, seed: int, replica: int, stage: int, rank: int) -> None:
        self.spec = spec
        self.rng_seed = f"{seed}:{replica}:{stage}:{rank}"
        self.rng = random.Random(self.rng_seed)

    def hit(self, name: str) -> bool:
        """Whether the fault ``name`` strikes the next data message."""
        probability = getattr(self.spec, name)
        return probability > 0 and self.rng.random() < probability

    def abort_point(self, request: str, shards: int) -> int | None:
        """After how many of its ``shards`` a receiver aborts ``request`` (``abort=P``),
        or None; drawn per request, so timing never changes the decision."""
        if not self.spec.abort:
            return None
        rng = random.Random(f"{self.rng_seed}:abort:{request}")
        return rng.randrange(max(1, shards)) if rng.random() < self.spec.abort else None

    def corrupt(
        self, frames: list[bytes | memoryview], *, first: int = 0
    ) -> list[bytes | memoryview]:
        """A copy of ``frames`` with one bit of one non-empty frame from ``first`` on flipped."""
        candidates = [i for i, f in enumerate(frames) if i >= first and len(f)]
        if not candidates:
            return frames
        i = self.rng.choice(candidates)
        damaged = bytearray(frames[i])
        damaged[self.rng.randrange(len(damaged))] ^= 1 << self.rng.randrange(8)
        return [*frames[:i], bytes(damaged), *frames[i + 1 :]]

    def garbage(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 64))
