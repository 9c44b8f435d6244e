"""Connector keys: the names under which one edge's KV is stored or sent, and their inverse.

Two key kinds exist [KEY-1, KEY-2]:

- rank-aware ``{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}``;
- legacy ``omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}``, for a transfer
  between two single-rank stages that is not chunked.

Joining fields with ``_`` is ambiguous in general; here it is not, because every field
but the request id is a canonical decimal integer, which contains no ``_`` [KEY-3].
A rank-aware key is read from the right (the last four fields are integers) and a
legacy key from the left (``omni_``, an integer, ``_to_``, an integer,
``_kv_cache_``); the request id is what remains, so it may contain ``_``.

The one real ambiguity is *between* the kinds: the legacy key of request ``5_0_0_0_0``
is ``omni_0_to_1_kv_cache_5_0_0_0_0``, which also reads as the rank-aware key of
request ``omni_0_to_1_kv_cache_5``. The spec removes it by refusing, in rank-aware
keys only, request ids that begin with a legacy key's head (``omni_<digits>_to_<digits>
_kv_cache`` followed by ``_`` or the end). Then no rank-aware key matches the legacy
pattern, so :func:`parse_key` knows the kind from the string alone: a string that
matches the legacy pattern is legacy, anything else is rank-aware [KEY-3].

Why this holds: if a rank-aware key ``rid + "_a_b_c_d"`` matched the legacy pattern
``omni_X_to_Y_kv_cache_...``, then either ``rid`` is at least as long as that head and
begins with it, or ``rid`` ends at one of the head's underscores; the only such
``rid`` after which ``_<int>_<int>...`` can continue the head is ``omni_X_to_Y_kv_cache``
itself. Both cases are exactly the refused request ids.

Keys are derived from the plan's edges, so a sender and its receiver compute the
same keys without talking [KEY-4].
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.require import require_int, show
from kvspec.topology.plan import TransferPlan
from kvspec.topology.stage import StageLayout

CLAUSES = (
    Clause(
        "KEY-1",
        "The rank-aware key",
        "The KV of one edge (from_rank -> to_rank, stage-local ranks [STAGE-1]) for one chunk "
        "of one request is named {request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}; "
        "the integers are written in canonical decimal (no sign, no leading zero). The key "
        "does not name the receiving stage: it is unique among the transfers of one request "
        "out of one stage to one next stage.",
        obligations=(
            must(
                "the rank-aware key is {request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
            ),
            must("its integers are canonical decimal: no sign, no leading zero"),
        ),
    ),
    Clause(
        "KEY-2",
        "The legacy key",
        "When both stages are a single rank (tp <= 1 and pp = 1) and the transfer is not "
        "chunked, the key is omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}. It names "
        "no rank and no chunk, so every other transfer uses the rank-aware key (with pp > 1 "
        "a TP1 stage has several ranks that a legacy key could not tell apart).",
        obligations=(
            must("the legacy key is omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}"),
            must(
                "only two single-rank stages (tp <= 1 and pp = 1) use the legacy key; a TP1 stage "
                "with pp > 1 uses rank-aware keys"
            ),
        ),
    ),
    Clause(
        "KEY-3",
        "Keys are injective and parse_key is their inverse",
        "Domain: request_id is a non-empty printable string (it may contain '_'); stage, "
        "chunk and rank numbers are integers >= 0. In a rank-aware key the request id must "
        "not begin with a legacy key's head (omni_<digits>_to_<digits>_kv_cache followed by "
        "'_' or the end). On this domain distinct keys are distinct strings, across both "
        "kinds, and parse_key(key) returns the fields: a string matching the legacy pattern "
        "is a legacy key, any other is read as rank-aware from the right. Inputs outside "
        "the domain, and strings that are no key, are refused.",
        obligations=(
            refuses("an empty or non-printable request id"),
            refuses(
                "a stage, chunk or rank that is not an integer >= 0 (negative, bool, float, or a "
                "string such as '0_5')"
            ),
            refuses("a rank-aware request id that begins with a legacy key's head"),
            must("distinct inputs of the domain give distinct keys, long request ids included"),
        ),
    ),
    Clause(
        "KEY-4",
        "Send keys equal receive keys",
        "For a plan, sender s sends under one key per edge s->t and receiver t listens on "
        "one key per edge s->t, both derived from the edge; so the keys s sends to t are "
        "exactly the keys t expects from s, for every valid plan (PP, replicated heads and "
        "MLA included), and all keys of one chunk of one request are distinct.",
        obligations=(
            must("the keys s sends t are exactly the keys t expects from s"),
            must("all keys of one chunk of one request are distinct"),
        ),
    ),
)

KeyKind = Literal["rank_aware", "legacy"]
KEY_KINDS: tuple[str, ...] = ("rank_aware", "legacy")

_INT = r"(0|[1-9][0-9]*)"
_LEGACY = re.compile(rf"omni_{_INT}_to_{_INT}_kv_cache_(.+)", re.DOTALL)
_RANK_AWARE = re.compile(rf"(.+)_{_INT}_{_INT}_{_INT}_{_INT}", re.DOTALL)
_LEGACY_HEAD = re.compile(r"omni_[0-9]+_to_[0-9]+_kv_cache(_|$)", re.DOTALL)


def check_request_id(request_id: object) -> str:
    """Return ``request_id`` if it is a non-empty printable string [KEY-3]."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {show(request_id)} [KEY-3]")
    if not request_id.isprintable():
        raise ValueError(
            f"request_id must be printable (no control characters, line breaks or lone "
            f"surrogates), got {show(request_id)} [KEY-3]"
        )
    return request_id


def _check_rank_aware_request_id(request_id: object) -> str:
    check_request_id(request_id)
    assert isinstance(request_id, str)
    if _LEGACY_HEAD.match(request_id):
        raise ValueError(
            f"request_id {show(request_id)} begins with a legacy key's head "
            "(omni_<digits>_to_<digits>_kv_cache); its rank-aware key would read as a legacy "
            "key, so such ids are refused in rank-aware keys [KEY-3]"
        )
    return request_id


def _check_field(name: str, value: object) -> int:
    try:
        return require_int(name, value, minimum=0)
    except ValueError as error:
        raise ValueError(f"{error} [KEY-3]") from None


@dataclass(frozen=True)
class RankAwareKey:
    """The fields of a rank-aware key [KEY-1]; ``str(key)`` is the key."""

    request_id: str
    from_stage: int
    chunk_id: int
    from_rank: int
    to_rank: int

    def __post_init__(self) -> None:
        _check_rank_aware_request_id(self.request_id)
        for name in ("from_stage", "chunk_id", "from_rank", "to_rank"):
            _check_field(name, getattr(self, name))

    @property
    def kind(self) -> KeyKind:
        return "rank_aware"

    def __str__(self) -> str:
        return (
            f"{self.request_id}_{self.from_stage}_{self.chunk_id}_{self.from_rank}_{self.to_rank}"
        )


@dataclass(frozen=True)
class LegacyKey:
    """The fields of a legacy key [KEY-2]; ``str(key)`` is the key."""

    request_id: str
    from_stage: int
    to_stage: int

    def __post_init__(self) -> None:
        check_request_id(self.request_id)
        _check_field("from_stage", self.from_stage)
        _check_field("to_stage", self.to_stage)

    @property
    def kind(self) -> KeyKind:
        return "legacy"

    def __str__(self) -> str:
        return f"omni_{self.from_stage}_to_{self.to_stage}_kv_cache_{self.request_id}"


Key = RankAwareKey | LegacyKey


def rank_aware_key(
    request_id: str, from_stage: int, chunk_id: int, from_rank: int, to_rank: int
) -> str:
    """``{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}`` [KEY-1, KEY-3]."""
    return str(RankAwareKey(request_id, from_stage, chunk_id, from_rank, to_rank))


def legacy_key(request_id: str, from_stage: int, to_stage: int) -> str:
    """``omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}`` [KEY-2, KEY-3]."""
    return str(LegacyKey(request_id, from_stage, to_stage))


def parse_key(text: object) -> Key:
    """The fields of a key; the exact inverse of both key builders [KEY-3].

    ``str(parse_key(s)) == s`` for every string it accepts, and
    ``parse_key(str(k)) == k`` for every key ``k`` of the domain.
    """
    if not isinstance(text, str):
        raise ValueError(f"a key is a string, got {show(text)} [KEY-3]")
    legacy = _LEGACY.fullmatch(text)
    if legacy:
        from_stage, to_stage, request_id = legacy.groups()
        return LegacyKey(request_id, int(from_stage), int(to_stage))
    rank_aware = _RANK_AWARE.fullmatch(text)
    if rank_aware is None:
        raise ValueError(
            f"{show(text)} is not a key: expected {{request_id}}_{{from_stage}}_{{chunk_id}}_"
            "{from_rank}_{to_rank} (four canonical decimal integers at the end) or "
            "omni_{from_stage}_to_{to_stage}_kv_cache_{request_id} [KEY-3]"
        )
    request_id, *numbers = rank_aware.groups()
    return RankAwareKey(request_id, *(int(n) for n in numbers))


def key_kind(source: StageLayout, target: StageLayout, *, chunked: bool = False) -> KeyKind:
    """Legacy keys for two single-rank stages and an unchunked transfer [KEY-2]."""
    single = source.world_size == 1 and target.world_size == 1
    return "legacy" if single and not chunked else "rank_aware"


def _edge_key(
    plan: TransferPlan,
    request_id: str,
    src: int,
    dst: int,
    *,
    from_stage: int,
    to_stage: int,
    chunk_id: int,
    chunked: bool,
) -> str:
    if key_kind(plan.source, plan.target, chunked=chunked) == "legacy":
        if chunk_id != 0:
            raise ValueError(
                f"chunk_id {chunk_id} for an unchunked transfer: a legacy key names no chunk; "
                "pass chunked=True to use rank-aware keys for every chunk [KEY-2]"
            )
        return legacy_key(request_id, from_stage, to_stage)
    _check_field("to_stage", to_stage)
    return rank_aware_key(request_id, from_stage, chunk_id, src, dst)


def send_keys(
    plan: TransferPlan,
    request_id: str,
    src: int,
    *,
    from_stage: int,
    to_stage: int,
    chunk_id: int = 0,
    chunked: bool = False,
) -> tuple[tuple[str, int], ...]:
    """``(key, target rank)`` for every edge sender ``src`` sends, ascending [KEY-4]."""
    stages = {"from_stage": from_stage, "to_stage": to_stage, "chunk_id": chunk_id}
    return tuple(
        (_edge_key(plan, request_id, e.src, e.dst, chunked=chunked, **stages), e.dst)
        for e in plan.edges_from(src)
    )


def recv_keys(
    plan: TransferPlan,
    request_id: str,
    dst: int,
    *,
    from_stage: int,
    to_stage: int,
    chunk_id: int = 0,
    chunked: bool = False,
) -> tuple[tuple[str, int], ...]:
    """``(key, source rank)`` for every edge receiver ``dst`` receives, ascending [KEY-4].

    Built by the same :func:`_edge_key` as :func:`send_keys`, from the same edges.
    """
    stages = {"from_stage": from_stage, "to_stage": to_stage, "chunk_id": chunk_id}
    return tuple(
        (_edge_key(plan, request_id, e.src, e.dst, chunked=chunked, **stages), e.src)
        for e in plan.edges_to(dst)
    )
