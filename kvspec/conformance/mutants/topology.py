"""Mutants of refusing invalid parallel sizes, layer partitions and stage pairs [STAGE-1,
HEAD-1, HEAD-2, LAYER-1, LAYER-2, PLAN-1].

Each validates like the reference but lets one kind of invalid configuration through,
the way a validator written for the common case does.
"""

from __future__ import annotations

import copy
from typing import Any

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter

Config = dict[str, Any]


def _sides(config: Config) -> list[dict[str, Any]]:
    return [config["source"], config["target"]]


@mutant("STAGE-1.2")
class AcceptsAnyRank(ReferenceAdapter):
    """Checks only that a rank is non-negative, never that it is below tp * pp."""

    def validate_sizes(self, config: Config) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        if isinstance(rank, int) and rank < 0:
            raise ValueError("negative rank")
        super().validate_sizes({k: v for k, v in config.items() if k != "rank"})


@mutant("STAGE-1.2")
class RankBoundOffByOne(ReferenceAdapter):
    """Allows rank == tp * pp (``rank <= world_size``), one past the last rank."""

    def validate_sizes(self, config: Config) -> None:
        given = copy.deepcopy(config)
        if "rank" in given:
            side = given[given["rank"]["side"]]
            if given["rank"]["rank"] == side["tp"] * side.get("pp", 1):
                given["rank"]["rank"] -= 1
        super().validate_sizes(given)


@mutant("STAGE-1.3")
class EmptyStageReadAsOne(ReferenceAdapter):
    """Reads a missing or zero size as 1 (``tp = config.get("tp") or 1``)."""

    def validate_sizes(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in _sides(given):
            side["tp"] = side.get("tp") or 1
            side["pp"] = side.get("pp") or 1
        super().validate_sizes(given)


@mutant("HEAD-1.2")
class HeadsFloorDivided(ReferenceAdapter):
    """With H > tp, gives each rank H // tp heads and never checks H % tp (the rest is lost)."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        heads = given["model"]["num_kv_heads"]
        tps = [s["tp"] for s in _sides(given) if isinstance(s["tp"], int) and 0 < s["tp"] < heads]
        if tps and given["model"].get("attention", "mha") == "mha":
            for tp in tps:
                heads -= heads % tp
            given["model"]["num_kv_heads"] = max(heads, max(tps))
        super().validate_model(given)


@mutant("HEAD-2.2")
class ReplicationNotChecked(ReferenceAdapter):
    """With H < tp, replicates heads over tp // H ranks without checking tp % H."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        heads = given["model"]["num_kv_heads"]
        for side in _sides(given):
            tp = side["tp"]
            if isinstance(tp, int) and heads < tp and tp % heads:
                side["tp"] = tp - tp % heads
        super().validate_model(given)


@mutant("LAYER-1.2")
class EmptyPipelineStagesAccepted(ReferenceAdapter):
    """Partitions fewer layers than PP ranks by leaving the last stages empty."""

    def validate_partition(self, config: Config) -> None:
        given = copy.deepcopy(config)
        layers = given["model"]["num_layers"]
        for side in _sides(given):
            pp = side.get("pp", 1)
            if isinstance(pp, int) and pp > layers and side.get("layer_partition") is None:
                side["pp"] = layers
        super().validate_partition(given)


def _with_partition(config: Config, fix) -> Config:
    given = copy.deepcopy(config)
    for side in _sides(given):
        partition = side.get("layer_partition")
        if partition is not None:
            side["layer_partition"] = fix(list(partition), side.get("pp", 1))
            if side["layer_partition"] is None:
                side.pop("layer_partition")
    return given


@mutant("LAYER-2.2")
class PartitionSumUnchecked(ReferenceAdapter):
    """Takes an explicit partition as given, never comparing its sum with num_layers."""

    def validate_partition(self, config: Config) -> None:
        def fix(counts: list[int], pp: int) -> list[int] | None:
            ok = len(counts) == pp and all(isinstance(c, int) and c >= 1 for c in counts)
            return None if ok else counts

        super().validate_partition(_with_partition(config, fix))


@mutant("LAYER-2.3")
class PartitionZeroCountAccepted(ReferenceAdapter):
    """Checks an explicit partition's length and sum, not that every count is positive."""

    def validate_partition(self, config: Config) -> None:
        layers = config["model"]["num_layers"]

        def fix(counts: list[int], pp: int) -> list[int] | None:
            fine = len(counts) == pp and sum(counts) == layers
            return None if fine and min(counts) < 1 else counts

        super().validate_partition(_with_partition(config, fix))


@mutant("LAYER-2.4")
class PartitionLengthUnchecked(ReferenceAdapter):
    """Checks an explicit partition's sum, not that it has one entry per PP rank."""

    def validate_partition(self, config: Config) -> None:
        layers = config["model"]["num_layers"]

        def fix(counts: list[int], pp: int) -> list[int] | None:
            fine = sum(counts) == layers and all(c >= 1 for c in counts)
            return None if fine and len(counts) != pp else counts

        super().validate_partition(_with_partition(config, fix))


@mutant("PLAN-1.1")
class AcceptsNonDividingTp(ReferenceAdapter):
    """Plans TP3 -> TP2 anyway."""

    def validate_topology(self, config: Config) -> None:
        source, target = config["source"]["tp"], config["target"]["tp"]
        if source > 0 and target > 0 and source % target and target % source:
            return
        super().validate_topology(config)


@mutant("PLAN-1.2")
class RefusesFanOut(ReferenceAdapter):
    """Supports only prefill TP >= decode TP: refuses a target TP larger than the source's."""

    def validate_topology(self, config: Config) -> None:
        if config["target"]["tp"] > config["source"]["tp"]:
            raise ValueError("target TP must not exceed source TP")
        super().validate_topology(config)


@mutant("PLAN-1.2")
class RefusesReplicatedHeads(ReferenceAdapter):
    """Heads checked as ``num_kv_heads % tp == 0`` on every side, as an engine without GQA
    replication does: a TP larger than the head count is refused though valid [HEAD-2]."""

    def validate_model(self, config: Config) -> None:
        heads = config["model"]["num_kv_heads"]
        if config["model"].get("attention", "mha") == "mha":
            for side in _sides(config):
                if isinstance(side["tp"], int) and side["tp"] > heads:
                    raise ValueError(f"{heads} KV heads cannot be split over TP {side['tp']}")
        super().validate_model(config)


@mutant("PLAN-1.2")
class RankBoundedByTp(ReferenceAdapter):
    """A rank checked against ``tp`` alone: the ranks of every pipeline stage past the
    first (``rank >= tp`` when ``pp > 1``) are refused though valid [STAGE-1]."""

    def validate_sizes(self, config: Config) -> None:
        rank = config.get("rank")
        if rank is not None and rank["rank"] >= config[rank["side"]]["tp"]:
            raise ValueError(f"rank {rank['rank']} is not below tp {config[rank['side']]['tp']}")
        super().validate_sizes(config)


@mutant("PLAN-1.2")
class RefusesUnevenPipeline(ReferenceAdapter):
    """Partitions checked as ``num_layers % pp == 0``: the default partition's remainder
    [LAYER-1] is refused though valid."""

    def validate_partition(self, config: Config) -> None:
        layers = config["model"]["num_layers"]
        for side in _sides(config):
            pp = side.get("pp", 1)
            uneven = isinstance(pp, int) and pp > 0 and layers % pp
            if uneven and side.get("layer_partition") is None:
                raise ValueError(f"{layers} layers do not split evenly over PP {pp}")
        super().validate_partition(config)
