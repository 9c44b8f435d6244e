"""Which tokens of a request a rank holds: token sets and the context-parallel rules.

Context parallelism (CP) splits a request's KV *by tokens*: the ``n`` token shards of a
stage each hold a disjoint share of the request's tokens, and together all of them.
Which share is a named rule [CP-1], stated here exactly and cited from the engine that
runs it:

- ``contiguous:B`` — TensorRT-LLM's default: the request's ``ceil(N/B)`` blocks of ``B``
  tokens go to the shards in order, ``nb // n`` each, the first ``nb % n`` shards one
  more (``getBlockNumAccountingForCP`` / ``getGlobalBlockIdAccountingForCP`` in
  ``cpp/tensorrt_llm/executor/cache_transmission/cacheSplitConcat.cu``, commit 1a43c7d).
  ``contiguous`` alone is ``contiguous:1``: whole tokens, split the same way.
- ``round_robin_blocks:B`` — TensorRT-LLM's round-robin distribution (same file, the
  ``getEnvUseRoundRobinBlockDistForCP`` branch): block ``b`` goes to shard ``b % n``.
- ``interleave:I`` — vLLM's decode context parallelism (vLLM 0.33.0,
  ``vllm/config/parallel.py`` ``cp_kv_cache_interleave_size`` and the slot mapping of
  ``vllm/v1/worker/block_table.py``): token ``t`` goes to shard ``(t // I) % n``.
  As a set it equals ``round_robin_blocks:I``; the two differ in the cache block size
  they need [CP-2].
- ``zigzag`` — SGLang's zigzag split (SGLang 0.5.23, ``sglang/srt/layers/cp/zigzag.py``):
  the request is cut into ``2n`` segments, segment ``i`` of ``N // 2n`` tokens plus one
  when ``i < N % 2n``; shard ``s`` holds segments ``s`` and ``2n - 1 - s``.

A rank stores its tokens densely, in ascending token order: its ``k``-th local token is
the ``k``-th token of its set. A :class:`Tokens` is such a set, kept as sorted,
disjoint, non-adjacent ranges, so plans can intersect them [PLAN-6].
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int, show

CLAUSES = (
    Clause(
        "CP-1",
        "Token-distribution rules",
        "A stage with n token shards (n = cp * dcp [STAGE-2, CP-3]) gives each shard s a "
        "disjoint set of a request's N tokens, together all of them, by one named rule: "
        "contiguous:B (the ceil(N/B) blocks of B tokens in order, nb // n per shard and one "
        "more to each of the first nb % n shards; contiguous = contiguous:1) [TensorRT-LLM "
        "cacheSplitConcat.cu]; round_robin_blocks:B (block b to shard b % n) [TensorRT-LLM]; "
        "interleave:I (token t to shard (t // I) % n) [vLLM 0.33 cp_kv_cache_interleave_size]; "
        "zigzag (2n segments of N // 2n tokens, one more for each of the first N % 2n; shard "
        "s holds segments s and 2n-1-s) [SGLang 0.5.23 layers/cp/zigzag.py]. A rank stores "
        "its tokens in ascending order. An unknown rule or a size below 1 is refused.",
        obligations=(
            must(
                "contiguous:B gives shard s its nb // n blocks (one more for the first nb % n "
                "shards) in order"
            ),
            must("interleave:I gives token t to shard (t // I) % n"),
            must("round_robin_blocks:B gives block b (tokens b*B .. b*B+B-1) to shard b % n"),
            must("zigzag gives shard s segments s and 2n-1-s of the 2n segments"),
            refuses("an unknown rule name, or a rule size below 1 or not an integer"),
        ),
    ),
    Clause(
        "CP-2",
        "A rule must fit the request and the cache",
        "zigzag needs N >= 2n tokens (every segment non-empty) [SGLang zigzag.py]; "
        "interleave:I needs the rank's cache block size to be a multiple of I [vLLM "
        "config/parallel.py]; round_robin_blocks:B and contiguous:B with B > 1 distribute "
        "cache blocks, so B must be the cache block size [TensorRT-LLM]. Anything else is "
        "refused with the values. Shards of other rules may hold no token of a short request.",
        obligations=(
            refuses("a zigzag request of fewer than 2n tokens"),
            refuses("interleave:I with a cache block size that is not a multiple of I"),
            refuses(
                "round_robin_blocks:B or contiguous:B (B > 1) with a cache block size other than B"
            ),
        ),
    ),
)

_EXAMPLES = "contiguous, contiguous:16, interleave:16, round_robin_blocks:16, zigzag"


@dataclass(frozen=True)
class Tokens:
    """A set of a request's token positions: sorted, disjoint, non-adjacent ranges of step 1.

    Build one with :meth:`of` (which normalizes) or :meth:`span`; iterate :attr:`ranges`.

    >>> Tokens.of([range(4, 6), range(0, 2), range(2, 3)]).describe()
    '0-2, 4-5'
    >>> len(Tokens.span(0, 8).intersect(Tokens.of([range(6, 12)])))
    2
    """

    ranges: tuple[range, ...] = ()

    def __post_init__(self) -> None:
        previous = -1
        for r in self.ranges:
            if not isinstance(r, range) or r.step != 1 or r.start < 0 or len(r) == 0:
                raise ValueError(f"token ranges are non-empty ranges of step 1 from 0, got {r!r}")
            if r.start <= previous:
                raise ValueError(f"token ranges must be sorted, disjoint and apart: {self.ranges}")
            previous = r.stop

    @classmethod
    def of(cls, ranges: Iterable[range]) -> Tokens:
        """The set of the given ranges (any order, overlapping or adjacent), normalized."""
        merged: list[range] = []
        for r in sorted((r for r in ranges if len(r)), key=lambda r: r.start):
            if r.step != 1 or r.start < 0:
                raise ValueError(f"token ranges are ranges of step 1 from 0, got {r!r}")
            if merged and r.start <= merged[-1].stop:
                merged[-1] = range(merged[-1].start, max(merged[-1].stop, r.stop))
            else:
                merged.append(r)
        return cls(tuple(merged))

    @classmethod
    def span(cls, start: int, stop: int) -> Tokens:
        """Tokens ``start .. stop-1`` (empty when ``stop <= start``)."""
        return cls.of([range(start, stop)])

    @classmethod
    def from_list(cls, data: object) -> Tokens:
        """Parse ``[[start, stop], ...]`` (sorted, disjoint, apart), refusing anything else."""
        if not isinstance(data, list | tuple):
            raise ValueError(f"tokens must be a list of [start, stop] pairs, got {show(data)}")
        ranges = []
        for i, pair in enumerate(data):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise ValueError(f"tokens[{i}] must be a [start, stop] pair, got {show(pair)}")
            start = require_int(f"tokens[{i}] start", pair[0], minimum=0)
            stop = require_int(f"tokens[{i}] stop", pair[1], minimum=start + 1)
            ranges.append(range(start, stop))
        return cls(tuple(ranges))

    def to_list(self) -> list[list[int]]:
        """``[[start, stop], ...]``: the JSON form."""
        return [[r.start, r.stop] for r in self.ranges]

    def __len__(self) -> int:
        return sum(len(r) for r in self.ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __contains__(self, token: object) -> bool:
        if not isinstance(token, int):
            return False
        i = bisect.bisect_right([r.start for r in self.ranges], token) - 1
        return i >= 0 and token in self.ranges[i]

    def tokens(self) -> list[int]:
        """Every token, ascending."""
        return [t for r in self.ranges for t in r]

    def intersect(self, other: Tokens) -> Tokens:
        """The tokens in both sets."""
        out, i, j = [], 0, 0
        a, b = self.ranges, other.ranges
        while i < len(a) and j < len(b):
            start, stop = max(a[i].start, b[j].start), min(a[i].stop, b[j].stop)
            if start < stop:
                out.append(range(start, stop))
            if a[i].stop < b[j].stop:
                i += 1
            else:
                j += 1
        return Tokens(tuple(out))

    def positions_in(self, outer: Tokens) -> Tokens:
        """Where this set's tokens sit in ``outer``'s ascending order (their local positions
        on a rank that holds ``outer``); refused unless this set lies inside ``outer``."""
        out, j, before = [], 0, 0
        for r in self.ranges:
            while j < len(outer.ranges) and outer.ranges[j].stop <= r.start:
                before += len(outer.ranges[j])
                j += 1
            if (
                j == len(outer.ranges)
                or r.start < outer.ranges[j].start
                or (r.stop > outer.ranges[j].stop)
            ):
                raise ValueError(
                    f"tokens {_compact(r)} are not all held by the set {outer.describe()}"
                )
            offset = before + r.start - outer.ranges[j].start
            out.append(range(offset, offset + len(r)))
        return Tokens.of(out)

    def describe(self, limit: int = 4) -> str:
        """A short form: ``0-7``, ``0-3, 8-11``, or ``0-1, 4-5, ... (64 runs of 2, every 4)``."""
        if not self.ranges:
            return "none"
        if len(self.ranges) <= limit:
            return ", ".join(_compact(r) for r in self.ranges)
        lengths = {len(r) for r in self.ranges[:-1]}
        gaps = {b.start - a.start for a, b in zip(self.ranges, self.ranges[1:], strict=False)}
        head = ", ".join(_compact(r) for r in self.ranges[:2])
        if len(lengths) == 1 and len(gaps) == 1:
            return (
                f"{head}, ... {_compact(self.ranges[-1])} ({len(self.ranges)} runs of "
                f"{lengths.pop()}, every {gaps.pop()}; {len(self)} tokens)"
            )
        return (
            f"{head}, ... {_compact(self.ranges[-1])} ({len(self.ranges)} runs, {len(self)} tokens)"
        )


def _compact(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}"


class RuleKind:
    """One named token-distribution rule: everything the spec knows about it lives in its
    class — its name and size, the tokens of a shard [CP-1], what it needs to fit [CP-2],
    and the facts the suite asks of it: the obligation its tokens are checked under, the
    sizes drawn, the near-miss names a parser must refuse and the cache blocks it must
    refuse. To change a rule, change its class; ``kvspec clauses --map CP`` lists the rest.
    """

    name: ClassVar[str]
    size_letter: ClassVar[str | None] = None
    """The letter of its size in messages (``B``, ``I``); None: the rule takes no size."""
    size_required: ClassVar[bool] = False
    obligation: ClassVar[str]
    """The CP-1 obligation that states its tokens (``CP-1.2``)."""
    sample_sizes: ClassVar[tuple[int, ...]] = (1,)
    """The sizes drawn: small, so that a few tokens span several runs and blocks."""
    near_misses: ClassVar[tuple[str, ...]] = ()
    """Spellings one typo or one missing or wrong size away from the rule, each refused
    [CP-1.5]."""
    unfit_blocks: ClassVar[tuple[tuple[int, int], ...]] = ()
    """(size, cache block size) pairs the rule cannot live in, each refused under
    :attr:`fit_obligation` [CP-2]."""
    fit_obligation: ClassVar[str | None] = None
    """The CP-2 obligation its cache-block refusal answers to; None: any block fits."""

    def describe(self, size: int) -> str:
        """The rule's name with its size: ``interleave:16``."""
        return f"{self.name}:{size}"

    def tokens(self, size: int, shard: int, shards: int, seq_len: int) -> Tokens:
        """The tokens shard ``shard`` of ``shards > 1`` holds of ``seq_len`` tokens."""
        raise NotImplementedError

    def min_tokens(self, shards: int) -> int:
        """The fewest tokens a request over ``shards`` shards may have [CP-2]."""
        return 0

    def check_request(self, shards: int, seq_len: int) -> None:
        """Refuse a request the rule cannot split [CP-2]."""

    def check_block_size(self, size: int, block_size: int) -> None:
        """Refuse a cache block size the rule cannot live in [CP-2]."""

    def block_sizes(self, size: int, count: int) -> tuple[int, ...] | None:
        """The ``count`` smallest cache block sizes the rule lives in [CP-2], each one
        :meth:`check_block_size` accepts; None when it ties the cache block to nothing (any
        block size fits). What a caller drawing a cache for the rule draws from."""
        return None


def _blocks_in_turn(size: int, shard: int, shards: int, seq_len: int) -> Tokens:
    """Runs of ``size`` tokens, every ``shards``-th from run ``shard``."""
    blocks = -(-seq_len // size)
    return Tokens(
        tuple(range(b * size, min((b + 1) * size, seq_len)) for b in range(shard, blocks, shards))
    )


def _cache_blocks_of(kind: RuleKind, size: int, block_size: int) -> None:
    """A rule that distributes cache blocks of ``size`` tokens needs that block size [CP-2]."""
    if size > 1 and block_size != size:
        raise ValueError(
            f"{kind.describe(size)} distributes cache blocks of {size} tokens, but the cache "
            f"block size is {block_size}; use {kind.name}:{block_size} [CP-2]"
        )


class Contiguous(RuleKind):
    """``contiguous:B``: the blocks of ``B`` tokens in order, ``nb // n`` a shard and one
    more for the first ``nb % n`` [TensorRT-LLM cacheSplitConcat.cu]."""

    name = "contiguous"
    size_letter = "B"
    obligation = "CP-1.1"
    sample_sizes = (1, 2, 4)
    near_misses = ("contiguous:0",)
    unfit_blocks = ((2, 4), (4, 2), (16, 32))
    fit_obligation = "CP-2.3"

    def describe(self, size: int) -> str:
        return self.name if size == 1 else super().describe(size)

    def tokens(self, size: int, shard: int, shards: int, seq_len: int) -> Tokens:
        blocks = -(-seq_len // size)
        each, extra = divmod(blocks, shards)
        first = shard * each + min(shard, extra)
        count = each + (1 if shard < extra else 0)
        return Tokens.span(first * size, min((first + count) * size, seq_len))

    def check_block_size(self, size: int, block_size: int) -> None:
        _cache_blocks_of(self, size, block_size)

    def block_sizes(self, size: int, count: int) -> tuple[int, ...] | None:
        return (size,) if size > 1 else None


class Interleave(RuleKind):
    """``interleave:I``: token ``t`` to shard ``(t // I) % n`` [vLLM 0.33
    cp_kv_cache_interleave_size]; the cache block size must be a multiple of ``I``."""

    name = "interleave"
    size_letter = "I"
    size_required = True
    obligation = "CP-1.2"
    sample_sizes = (1, 2, 3, 4)
    near_misses = ("Interleave:4", "interleave", "interleave:0", "interleave:-2", "interleave:1.5")
    unfit_blocks = ((2, 3), (4, 6), (16, 24), (3, 1))
    fit_obligation = "CP-2.2"

    def tokens(self, size: int, shard: int, shards: int, seq_len: int) -> Tokens:
        return _blocks_in_turn(size, shard, shards, seq_len)

    def check_block_size(self, size: int, block_size: int) -> None:
        if block_size % size:
            bigger = -(-block_size // size) * size
            smaller = max(i for i in range(1, size) if block_size % i == 0)
            raise ValueError(
                f"interleave:{size} needs a cache block size that is a multiple of "
                f"{size}; the block size is {block_size} ({block_size} % {size} = "
                f"{block_size % size}): use a block size of {bigger}, or "
                f"interleave:{smaller} [CP-2]"
            )

    def block_sizes(self, size: int, count: int) -> tuple[int, ...] | None:
        """Multiples of ``I``, ``interleave:1`` included: an interleaved cache is paged."""
        return tuple(size * k for k in range(1, count + 1))


class RoundRobinBlocks(RuleKind):
    """``round_robin_blocks:B``: cache block ``b`` to shard ``b % n`` [TensorRT-LLM]."""

    name = "round_robin_blocks"
    size_letter = "B"
    size_required = True
    obligation = "CP-1.3"
    sample_sizes = (1, 2, 4)
    near_misses = ("round_robin_blocks", "round_robin_blocks:0")
    unfit_blocks = ((2, 4), (4, 2), (16, 32))
    fit_obligation = "CP-2.3"

    def tokens(self, size: int, shard: int, shards: int, seq_len: int) -> Tokens:
        return _blocks_in_turn(size, shard, shards, seq_len)

    def check_block_size(self, size: int, block_size: int) -> None:
        _cache_blocks_of(self, size, block_size)

    def block_sizes(self, size: int, count: int) -> tuple[int, ...] | None:
        return (size,) if size > 1 else None


class Zigzag(RuleKind):
    """``zigzag``: ``2n`` segments, shard ``s`` holding segments ``s`` and ``2n-1-s``, so a
    request needs ``2n`` tokens [SGLang 0.5.23 layers/cp/zigzag.py]."""

    name = "zigzag"
    obligation = "CP-1.4"
    near_misses = ("zigzag:2",)

    def describe(self, size: int) -> str:
        return self.name

    def tokens(self, size: int, shard: int, shards: int, seq_len: int) -> Tokens:
        self.check_request(shards, seq_len)
        segments = 2 * shards
        base, extra = divmod(seq_len, segments)

        def segment(i: int) -> range:
            start = i * base + min(i, extra)
            return range(start, start + base + (1 if i < extra else 0))

        return Tokens.of([segment(shard), segment(segments - 1 - shard)])

    def min_tokens(self, shards: int) -> int:
        return 2 * shards if shards > 1 else 0

    def check_request(self, shards: int, seq_len: int) -> None:
        if seq_len < (needed := self.min_tokens(shards)):
            raise ValueError(
                f"zigzag over {shards} token shards cuts a request into {needed} segments, "
                f"so it needs at least {needed} tokens; this request has {seq_len} [CP-2]"
            )


_KINDS: dict[str, RuleKind] = {
    kind.name: kind() for kind in (Contiguous, Interleave, RoundRobinBlocks, Zigzag)
}
RULE_KINDS: tuple[str, ...] = tuple(_KINDS)
"""The named token-distribution rules [CP-1]."""


def rule_kind(name: str) -> RuleKind:
    """The rule kind called ``name`` (one of :data:`RULE_KINDS`) [CP-1]."""
    if name not in _KINDS:
        raise ValueError(
            f"unknown context-parallel rule {show(name)}; the rules are {_EXAMPLES} [CP-1]"
        )
    return _KINDS[name]


@dataclass(frozen=True)
class CPRule:
    """A token-distribution rule and its size [CP-1]: ``str(rule)`` is its name. What each
    kind does is its :class:`RuleKind`; this is the named, sized value stages carry.

    >>> CPRule.parse("interleave:16").tokens(1, 2, 40).describe()
    '16-31'
    >>> CPRule.parse("zigzag").tokens(0, 2, 8).describe()
    '0-1, 6-7'
    """

    kind: str = "contiguous"
    size: int = 1

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:  # a tuple: an unhashable kind is refused, not a crash
            raise ValueError(
                f"unknown context-parallel rule {show(self.kind)}; the rules are {_EXAMPLES} [CP-1]"
            )
        try:
            require_int(f"the size of {self.kind}", self.size, minimum=1)
        except ValueError as error:
            raise ValueError(f"{error} (cp_rule {self.kind}:{self.size}) [CP-1]") from None
        if self.rule_kind.size_letter is None and self.size != 1:
            raise ValueError(f"{self.kind} takes no size, got {self.kind}:{self.size} [CP-1]")

    @property
    def rule_kind(self) -> RuleKind:
        return _KINDS[self.kind]

    @classmethod
    def parse(cls, text: object) -> CPRule:
        """``contiguous``, ``contiguous:B``, ``interleave:I``, ``round_robin_blocks:B`` or
        ``zigzag``; anything else is refused [CP-1]."""
        if isinstance(text, CPRule):
            return text
        if not isinstance(text, str) or len(text) > 64:
            raise ValueError(
                f"a context-parallel rule is a name such as {_EXAMPLES}; got {show(text)} [CP-1]"
            )
        name, colon, size = text.partition(":")
        kind = _KINDS.get(name)
        if kind is None:
            raise ValueError(
                f"unknown context-parallel rule {show(text)}; the rules are {_EXAMPLES} [CP-1]"
            )
        letter = kind.size_letter
        if not colon:
            if kind.size_required:
                raise ValueError(f"{name} needs its size: {name}:{letter}, e.g. {name}:16 [CP-1]")
            return cls(name)
        if letter is None or not size.isdigit() or len(size) > 9 or size != str(int(size)):
            raise ValueError(
                f"context-parallel rule {show(text)}: expected {name}"
                + ("" if letter is None else f":{letter} with {letter} a positive integer")
                + " [CP-1]"
            )
        return cls(name, int(size))

    def __str__(self) -> str:
        return self.rule_kind.describe(self.size)

    def tokens(self, shard: int, shards: int, seq_len: int) -> Tokens:
        """The tokens shard ``shard`` of ``shards`` holds of a request of ``seq_len`` [CP-1]."""
        require_int("shards", shards, minimum=1)
        require_int("shard", shard, minimum=0, maximum=shards - 1)
        require_int("seq_len", seq_len, minimum=0)
        if shards == 1:
            return Tokens.span(0, seq_len)
        return self.rule_kind.tokens(self.size, shard, shards, seq_len)

    def min_tokens(self, shards: int) -> int:
        """The fewest tokens a request split over ``shards`` shards may have [CP-2]: ``2n``
        under ``zigzag`` (every one of its 2n segments non-empty), else none."""
        return self.rule_kind.min_tokens(shards)

    def check_request(self, shards: int, seq_len: int) -> None:
        """Refuse a request the rule cannot split over ``shards`` shards [CP-2]."""
        self.rule_kind.check_request(shards, seq_len)

    def check_block_size(self, block_size: int) -> None:
        """Refuse a cache block size the rule cannot live in [CP-2]."""
        require_int("block_size", block_size, minimum=1)
        self.rule_kind.check_block_size(self.size, block_size)

    def block_sizes(self, count: int = 1) -> tuple[int, ...] | None:
        """The ``count`` smallest cache block sizes the rule lives in, or None when any
        fits [CP-2] (:meth:`RuleKind.block_sizes`).

        >>> CPRule.parse("interleave:4").block_sizes(2), CPRule.parse("zigzag").block_sizes()
        ((4, 8), None)
        """
        require_int("count", count, minimum=1)
        return self.rule_kind.block_sizes(self.size, count)


def as_tokens(value: Tokens | range | Sequence[range] | Any) -> Tokens:
    """A :class:`Tokens` from a Tokens, a range or a sequence of ranges (an adapter's answer)."""
    if isinstance(value, Tokens):
        return value
    if isinstance(value, range):
        return Tokens.of([value])
    if isinstance(value, Iterable):
        items = list(value)
        if all(isinstance(v, range) for v in items):
            return Tokens.of(items)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return Tokens.of(range(v, v + 1) for v in items)
    raise ValueError(f"expected token ranges, got {show(value)}")
