"""The ``config`` an adapter's ``validate_*`` methods are handed, as data.

Engines refuse a bad configuration in different places (process groups, pipeline set-up,
the transfer code, model loading, a handshake), so the suite has five refusal methods;
all five are handed the same plain-data form: a :class:`TransferConfig`. Its keys, their
types (the TypedDicts below), what each means and an example (:data:`TRANSFER_KEYS`,
:data:`STAGE_KEYS`, :data:`RANK_KEYS`; the model facts are :class:`ModelShape`'s fields)
are the one statement of the schema: the suite passes every configuration through
:func:`handed` before an adapter sees it, which refuses a key documented nowhere here as
a bug of kvspec's, and ``docs/adapter-api.md`` is rendered from the same data.

Refusal probes change one fact at a time to step outside the spec (a size of 0, a count
of another type), so a value may break its type on purpose; the keys never do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, NewType, TypedDict, TypeVar

from kvspec.topology.model import ModelShape

ModelFacts = NewType("ModelFacts", dict[str, Any])
"""A model's facts as :meth:`ModelShape.to_dict` writes them: a plain dict of its fields
by name (:data:`MODEL_KEYS`)."""


class _StageRequired(TypedDict):
    tp: int


class StageConfig(_StageRequired, total=False):
    """One stage's parallel layout, as :meth:`StageLayout.to_dict` writes it (every key
    but ``tp`` may be missing: :meth:`StageLayout.from_dict` gives the defaults)."""

    pp: int
    layer_partition: list[int] | None
    dp: int
    cp: int
    dcp: int
    cp_rule: str


class RankConfig(TypedDict):
    """One rank of one side, for the refusals that ask whether a rank exists."""

    side: Literal["source", "target"]
    rank: int


class _TransferRequired(TypedDict):
    source: StageConfig
    target: StageConfig
    model: ModelFacts


class TransferConfig(_TransferRequired, total=False):
    """A whole transfer configuration: both stages, the model and the facts some clauses
    add. What every ``validate_*`` method of an adapter is handed."""

    policy: str
    rank: RankConfig
    target_model: ModelFacts
    seq_len: int
    source_dp: int
    target_dp: int
    source_block_size: int
    target_block_size: int


@dataclass(frozen=True)
class Key:
    """What one key of a configuration means, an example value and its clauses."""

    meaning: str
    example: Any
    clauses: tuple[str, ...] = ()


STAGE_KEYS: Mapping[str, Key] = {
    "tp": Key("tensor-parallel size: ranks per pipeline stage", 4, ("STAGE-1",)),
    "pp": Key("pipeline-parallel size (missing: 1)", 2, ("STAGE-1", "LAYER-1")),
    "layer_partition": Key(
        "layers each pipeline stage holds, first to last; None: the default split",
        [3, 2],
        ("LAYER-2",),
    ),
    "dp": Key("attention data-parallel groups sharing the tp ranks (missing: 1)", 2, ("STAGE-2",)),
    "cp": Key("context-parallel groups sharing the tp ranks (missing: 1)", 2, ("STAGE-2", "CP-3")),
    "dcp": Key(
        "decode-context-parallel ranks sharing each head's tokens (missing: 1)", 2, ("CP-3",)
    ),
    "cp_rule": Key(
        "how tokens are split over the cp * dcp token shards (missing: contiguous)",
        "interleave:16",
        ("CP-1",),
    ),
}
"""The keys of a :class:`StageConfig`."""

RANK_KEYS: Mapping[str, Key] = {
    "side": Key("which stage the rank is of", "target", ("STAGE-1",)),
    "rank": Key("a stage-local rank, which must be inside 0..tp*pp-1", 3, ("STAGE-1",)),
}
"""The keys of a :class:`RankConfig`."""

TRANSFER_KEYS: Mapping[str, Key] = {
    "source": Key(
        "the sending stage's layout",
        {"tp": 4, "pp": 1, "layer_partition": None},
        ("STAGE-1", "PLAN-1"),
    ),
    "target": Key(
        "the receiving stage's layout",
        {"tp": 2, "pp": 1, "layer_partition": None},
        ("STAGE-1", "PLAN-1"),
    ),
    "model": Key(
        "the model's facts (the sender's, when target_model is given)",
        {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"},
        ("MODEL-1", "MODEL-2", "DTYPE-1", "HEAD-1", "HEAD-2", "GROUP-1"),
    ),
    "policy": Key(
        "the replica policy; only golden vectors pass it (kvspec vectors check): the "
        "conformance checks ask routing, through case.policy, to refuse an unknown one",
        "lowest",
        ("PLAN-4",),
    ),
    "rank": Key(
        "a rank whose existence is in question", {"side": "target", "rank": 3}, ("STAGE-1",)
    ),
    "target_model": Key(
        "the receiver's model facts, when they may differ from the sender's",
        {"num_layers": 32, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16"},
        ("MODEL-3",),
    ),
    "seq_len": Key(
        "the request's length in tokens, where token shards make it matter",
        9,
        ("CP-1", "CP-2", "PLAN-6"),
    ),
    "source_dp": Key("the sender's attention-DP group the router chose", 1, ("DP-1",)),
    "target_dp": Key("the receiver's attention-DP group the router chose", 0, ("DP-1",)),
    "source_block_size": Key(
        "tokens per block of the sender's cache, which a token rule must fit", 16, ("CP-2",)
    ),
    "target_block_size": Key(
        "tokens per block of the receiver's cache, which a token rule must fit", 16, ("CP-2",)
    ),
}
"""The keys of a :class:`TransferConfig`."""

MODEL_KEYS: tuple[str, ...] = tuple(f.name for f in fields(ModelShape))
"""The keys of :data:`ModelFacts`: the fields of :class:`ModelShape`."""


_Config = TypeVar("_Config", bound=Mapping[str, Any])


class ConfigDrift(RuntimeError):
    """The suite was about to hand an adapter a key this module does not document: a bug
    of kvspec's, not of the implementation under test."""


def undocumented(config: Mapping[str, Any]) -> list[str]:
    """The keys of ``config`` (``source.cp``-style for nested ones) that the schema does
    not document, and required keys it lacks (as ``missing source``)."""
    found = [k for k in config if k not in TRANSFER_KEYS]
    found += [f"missing {k}" for k in TransferConfig.__required_keys__ if k not in config]
    nested: tuple[tuple[str, Any], ...] = (
        ("source", STAGE_KEYS),
        ("target", STAGE_KEYS),
        ("rank", RANK_KEYS),
        ("model", MODEL_KEYS),
        ("target_model", MODEL_KEYS),
    )
    for key, known in nested:
        value = config.get(key)
        if isinstance(value, Mapping):
            found += [f"{key}.{k}" for k in value if k not in known]
    return found


def handed(config: _Config) -> _Config:
    """``config``, after refusing (:class:`ConfigDrift`) one whose keys the schema does not
    document; every configuration the suite hands a ``validate_*`` method passes here."""
    strays = undocumented(config)
    if strays:
        raise ConfigDrift(
            f"kvspec would hand an adapter a configuration with {strays}, which "
            "kvspec/conformance/transfer_config.py does not document; document them there "
            f"(and regenerate docs/adapter-api.md): {dict(config)!r:.300}"
        )
    return config


def sides(config: TransferConfig) -> list[StageConfig]:
    """The two stages of ``config``: source, then target."""
    return [config["source"], config["target"]]


def models(config: TransferConfig) -> list[ModelFacts]:
    """The model facts ``config`` names: the sender's, then the receiver's where it names
    its own (``target_model``)."""
    return [m for m in (config.get("model"), config.get("target_model")) if m is not None]


def attention_tp(side: StageConfig) -> int:
    """The attention-TP size of a stage given as plain data, ``tp // (dp * cp)``; its
    ``tp`` where the groups do not divide it or a size is not a positive integer (a probe
    may hand any value) [STAGE-2]."""
    groups = side.get("dp", 1) * side.get("cp", 1)
    if not all(isinstance(v, int) and v > 0 for v in (side["tp"], groups)):
        return side["tp"]
    return side["tp"] // groups if side["tp"] % groups == 0 else side["tp"]
