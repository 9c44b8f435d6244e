"""Mutants of refusing invalid stage pairs and the router's DP ranks [PLAN-1, DP-1].

Each validates like the reference but lets one kind of invalid configuration through,
the way a validator written for the common case does, or (PLAN-1.2) refuses one kind
of valid configuration, the way the field's engines do.
"""

from __future__ import annotations

import copy
from typing import Literal

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.transfer_config import TransferConfig, attention_tp, sides

Config = TransferConfig


Side = Literal["source", "target"]


_DP_RANK_KEYS: tuple[tuple[Side, Literal["source_dp", "target_dp"]], ...] = (
    ("source", "source_dp"),
    ("target", "target_dp"),
)


@mutant("PLAN-1.1")
class TrustsTheSendersLayout(ReferenceAdapter):
    """Checks the heads against the receiving side only, trusting the sender's layout."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        source = given["source"]
        if isinstance(source.get("pp", 1), int) and source.get("pp", 1) >= 1:
            given["source"] = {
                "tp": 1,
                "pp": source.get("pp", 1),
                "layer_partition": source.get("layer_partition"),
            }
            given.pop("source_dp", None)
            if "rank" in given and given["rank"].get("side") == "source":
                given.pop("rank")
        super().validate_model(given)


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
            for side in sides(config):
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
        for side in sides(config):
            pp = side.get("pp", 1)
            uneven = isinstance(pp, int) and pp > 0 and layers % pp
            if uneven and side.get("layer_partition") is None:
                raise ValueError(f"{layers} layers do not split evenly over PP {pp}")
        super().validate_partition(config)


@mutant("PLAN-1.2")
class RefusesNonDividingTp(ReferenceAdapter):
    """Plans only TP sizes that divide one another, as every engine (and kvspec's first
    release) did: TP4 -> TP6 is refused even with 12 heads."""

    def validate_topology(self, config: Config) -> None:
        source, target = config["source"]["tp"], config["target"]["tp"]
        if source > 0 and target > 0 and source % target and target % source:
            raise ValueError(f"TP {source} and TP {target} do not divide one another")
        super().validate_topology(config)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@mutant("PLAN-1.2")
class PowerOfTwoOnly(ReferenceAdapter):
    """Checks that the TP size of each DP group and the CP size are powers of two on both
    sides (TensorRT-LLM's TLLM_CHECK(isPowerOfTwo) in cacheSplitConcat.cu)."""

    def validate_topology(self, config: Config) -> None:
        for side in sides(config):
            per_group = side["tp"] // max(1, side.get("dp", 1))
            if not (_power_of_two(per_group) and _power_of_two(side.get("cp", 1))):
                raise ValueError(f"TP per DP group {per_group} / CP must be powers of two")
        super().validate_topology(config)


@mutant("PLAN-1.2")
class DcpOnlyNoneOrFull(ReferenceAdapter):
    """Accepts decode context parallelism only of 1 or the whole TP size on either side
    (vLLM's NIXL connector: dcp_size in {1, tp_size})."""

    def validate_topology(self, config: Config) -> None:
        for side in sides(config):
            if side.get("dcp", 1) not in (1, side["tp"]):
                raise ValueError(f"dcp {side.get('dcp')} must be 1 or tp {side['tp']}")
        super().validate_topology(config)


@mutant("PLAN-1.2")
class RefusesCpConsumer(ReferenceAdapter):
    """Refuses a receiving stage with context-parallel ranks (vLLM #52779 takes PCP
    producers and rejects PCP consumers)."""

    def validate_topology(self, config: Config) -> None:
        if config["target"].get("cp", 1) > 1:
            raise ValueError("a context-parallel consumer is not supported")
        super().validate_topology(config)


@mutant("DP-1.3")
class DpRankWrapped(ReferenceAdapter):
    """Takes the router's DP rank modulo dp, so DP rank 2 of DP2 lands on group 0."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for name, dp_rank in _DP_RANK_KEYS:
            dp = given[name].get("dp", 1)
            if isinstance(given.get(dp_rank), int) and isinstance(dp, int) and dp > 0:
                given[dp_rank] %= dp
        super().validate_topology(given)


@mutant("PLAN-1.2")
class ComparesModelsByIdentity(ReferenceAdapter):
    """The handshake compares the two model records as objects (``is``), not by their
    facts: a receiver's identical but separately built record is refused [MODEL-3]."""

    def validate_agreement(self, config: Config) -> None:
        if "target_model" in config and config["target_model"] is not config["model"]:
            raise ValueError("the receiver's model is not the sender's")
        super().validate_agreement(config)


@mutant("PLAN-1.1", unclear=True)
class InvalidSideRefusedWithoutNamingIt(ReferenceAdapter):
    """Refuses a pair where one side cannot hold the model's heads, as it must, with "this
    deployment cannot hold the model", naming neither the side nor its TP size."""

    def validate_model(self, config: Config) -> None:
        heads = config["model"].get("num_kv_heads")
        for side in sides(config):
            tp = attention_tp(side)
            if not (isinstance(heads, int) and isinstance(tp, int)) or min(heads, tp) < 1:
                continue  # another rule's refusal, as the reference words it
            if heads % tp if heads >= tp else tp % heads:
                raise ValueError("this deployment cannot hold the model's KV heads")
        super().validate_model(config)
