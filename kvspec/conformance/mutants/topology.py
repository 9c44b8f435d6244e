"""Mutants of refusing invalid parallel sizes, attention groups, layer partitions, stage
pairs and token rules [STAGE-1, STAGE-2, HEAD-1, HEAD-2, LAYER-1, LAYER-2, PLAN-1, CP-1..3,
DP-1].

Each validates like the reference but lets one kind of invalid configuration through,
the way a validator written for the common case does, or (PLAN-1.2) refuses one kind
of valid configuration, the way the field's engines do.
"""

from __future__ import annotations

import copy
import math
from typing import Literal

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.transfer_config import StageConfig, TransferConfig
from kvspec.topology.tokens import CPRule

Config = TransferConfig
Side = Literal["source", "target"]
# Each side's keys of a TransferConfig, spelled out so they stay literal keys.
_BLOCK_SIZE_KEYS: tuple[tuple[Side, Literal["source_block_size", "target_block_size"]], ...] = (
    ("source", "source_block_size"),
    ("target", "target_block_size"),
)
_DP_RANK_KEYS: tuple[tuple[Side, Literal["source_dp", "target_dp"]], ...] = (
    ("source", "source_dp"),
    ("target", "target_dp"),
)


def _sides(config: Config) -> list[StageConfig]:
    return [config["source"], config["target"]]


def _attn(side: StageConfig) -> int:
    """The attention-TP size of a side given as plain data [STAGE-2]."""
    groups = side.get("dp", 1) * side.get("cp", 1)
    if not all(isinstance(v, int) and v > 0 for v in (side["tp"], groups)):
        return side["tp"]
    return side["tp"] // groups if side["tp"] % groups == 0 else side["tp"]


@mutant("STAGE-1.2")
class AcceptsAnyRank(ReferenceAdapter):
    """Checks only that a rank is non-negative, never that it is below tp * pp."""

    def validate_sizes(self, config: Config) -> None:
        rank = config.get("rank", {}).get("rank", 0)
        if isinstance(rank, int) and rank < 0:
            raise ValueError("negative rank")
        given = config.copy()
        given.pop("rank", None)
        super().validate_sizes(given)


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
        tps = [_attn(s) for s in _sides(given) if isinstance(s["tp"], int) and 0 < _attn(s) < heads]
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
            attn = _attn(side)
            if isinstance(tp, int) and heads < attn and attn % heads:
                side["tp"] = (attn - attn % heads) * (tp // attn)
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
        for side in _sides(config):
            per_group = side["tp"] // max(1, side.get("dp", 1))
            if not (_power_of_two(per_group) and _power_of_two(side.get("cp", 1))):
                raise ValueError(f"TP per DP group {per_group} / CP must be powers of two")
        super().validate_topology(config)


@mutant("PLAN-1.2")
class DcpOnlyNoneOrFull(ReferenceAdapter):
    """Accepts decode context parallelism only of 1 or the whole TP size on either side
    (vLLM's NIXL connector: dcp_size in {1, tp_size})."""

    def validate_topology(self, config: Config) -> None:
        for side in _sides(config):
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


@mutant("STAGE-2.3")
class GroupsFloorDivided(ReferenceAdapter):
    """Sizes the attention groups as tp // (dp * cp), never checking the remainder."""

    def validate_sizes(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in _sides(given):
            groups = side.get("dp", 1) * side.get("cp", 1)
            tp = side["tp"]
            if isinstance(tp, int) and isinstance(groups, int) and groups > 0 and tp % groups:
                side["tp"] = max(groups, tp - tp % groups)
        super().validate_sizes(given)


@mutant("CP-1.5")
class UnknownRuleReadAsContiguous(ReferenceAdapter):
    """Reads any rule it does not know, or a size it cannot parse, as contiguous."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in _sides(given):
            try:
                CPRule.parse(side.get("cp_rule", "contiguous"))
            except ValueError:
                side["cp_rule"] = "contiguous"
        super().validate_topology(given)


@mutant("CP-2.1")
class ZigzagShortRequestAccepted(ReferenceAdapter):
    """Splits a request shorter than 2n tokens contiguously instead of refusing zigzag."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in _sides(given):
            shards = side.get("cp", 1) * side.get("dcp", 1)
            if side.get("cp_rule") == "zigzag" and (given.get("seq_len") or 0) < 2 * shards:
                side["cp_rule"] = "contiguous"
        super().validate_topology(given)


@mutant("CP-2.2")
class InterleaveBlockSizeUnchecked(ReferenceAdapter):
    """Never compares an interleave size with the cache block size."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for name, block_size in _BLOCK_SIZE_KEYS:
            if str(given[name].get("cp_rule", "")).startswith("interleave"):
                given.pop(block_size, None)
        super().validate_topology(given)


@mutant("CP-2.3")
class BlockRuleSizeUnchecked(ReferenceAdapter):
    """Takes round_robin_blocks:B and contiguous:B at their word, whatever the cache's
    block size."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for name, block_size in _BLOCK_SIZE_KEYS:
            if str(given[name].get("cp_rule", "")).startswith(("round_robin_blocks", "contiguous")):
                given.pop(block_size, None)
        super().validate_topology(given)


@mutant("CP-3.3")
class DcpRoundedToDivisor(ReferenceAdapter):
    """Uses gcd(dcp, attention TP) when dcp does not divide the attention-TP size."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in _sides(given):
            dcp = side.get("dcp", 1)
            if isinstance(dcp, int) and dcp > 1:
                side["dcp"] = math.gcd(dcp, _attn(side))
        super().validate_topology(given)


@mutant("CP-3.4")
class DcpChecksTpOnly(ReferenceAdapter):
    """Checks that dcp divides the attention TP, not that every head has dcp ranks to share
    its tokens (H * dcp <= attn_tp)."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        heads = given["model"].get("num_kv_heads", 1)
        for side in _sides(given):
            dcp = side.get("dcp", 1)
            attn = _attn(side)
            if isinstance(dcp, int) and dcp > 1 and attn % dcp == 0 and heads * dcp > attn:
                side["dcp"] = 1
        super().validate_topology(given)


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
