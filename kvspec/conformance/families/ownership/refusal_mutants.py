"""Mutants of refusing invalid parallel sizes, attention groups, layer partitions and
token rules [STAGE-1, STAGE-2, HEAD-1, HEAD-2, LAYER-1, LAYER-2, CP-1..3].

Each validates like the reference but lets one kind of invalid configuration through,
the way a validator written for the common case does.
"""

from __future__ import annotations

import copy
import math
from typing import Literal, TypeGuard

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.transfer_config import TransferConfig, attention_tp, sides
from kvspec.topology.tokens import CPRule

Config = TransferConfig


Side = Literal["source", "target"]


# Each side's keys of a TransferConfig, spelled out so they stay literal keys.
_BLOCK_SIZE_KEYS: tuple[tuple[Side, Literal["source_block_size", "target_block_size"]], ...] = (
    ("source", "source_block_size"),
    ("target", "target_block_size"),
)


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
        for side in sides(given):
            side["tp"] = side.get("tp") or 1
            side["pp"] = side.get("pp") or 1
        super().validate_sizes(given)


@mutant("HEAD-1.2")
class HeadsFloorDivided(ReferenceAdapter):
    """With H > tp, gives each rank H // tp heads and never checks H % tp (the rest is lost)."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        heads = given["model"]["num_kv_heads"]
        tps = [
            attention_tp(s)
            for s in sides(given)
            if isinstance(s["tp"], int) and 0 < attention_tp(s) < heads
        ]
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
        for side in sides(given):
            tp = side["tp"]
            attn = attention_tp(side)
            if isinstance(tp, int) and heads < attn and attn % heads:
                side["tp"] = (attn - attn % heads) * (tp // attn)
        super().validate_model(given)


@mutant("HEAD-1.2", "HEAD-2.2", unclear=True)
class HeadSplitRefusedWithoutNumbers(ReferenceAdapter):
    """Refuses a head split that satisfies neither HEAD-1 nor HEAD-2 with "invalid head
    split", naming neither H nor tp, where the clause asks for both numbers."""

    def validate_model(self, config: Config) -> None:
        heads = config["model"].get("num_kv_heads")
        for side in sides(config):
            tp = attention_tp(side)
            if not (_positive(heads) and _positive(tp)):
                continue  # another rule's refusal, as the reference words it
            if heads % tp if heads >= tp else tp % heads:
                raise ValueError(
                    "invalid head split: the KV heads must divide evenly over the "
                    "tensor-parallel ranks, or the ranks over the heads"
                )
        super().validate_model(config)


def _positive(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@mutant("LAYER-1.2")
class EmptyPipelineStagesAccepted(ReferenceAdapter):
    """Partitions fewer layers than PP ranks by leaving the last stages empty."""

    def validate_partition(self, config: Config) -> None:
        given = copy.deepcopy(config)
        layers = given["model"]["num_layers"]
        for side in sides(given):
            pp = side.get("pp", 1)
            if isinstance(pp, int) and pp > layers and side.get("layer_partition") is None:
                side["pp"] = layers
        super().validate_partition(given)


def _with_partition(config: Config, fix) -> Config:
    given = copy.deepcopy(config)
    for side in sides(given):
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


@mutant("STAGE-2.3")
class GroupsFloorDivided(ReferenceAdapter):
    """Sizes the attention groups as tp // (dp * cp), never checking the remainder."""

    def validate_sizes(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for side in sides(given):
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
        for side in sides(given):
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
        for side in sides(given):
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
        for side in sides(given):
            dcp = side.get("dcp", 1)
            if isinstance(dcp, int) and dcp > 1:
                side["dcp"] = math.gcd(dcp, attention_tp(side))
        super().validate_topology(given)


@mutant("CP-3.4")
class DcpChecksTpOnly(ReferenceAdapter):
    """Checks that dcp divides the attention TP, not that every head has dcp ranks to share
    its tokens (H * dcp <= attn_tp)."""

    def validate_topology(self, config: Config) -> None:
        given = copy.deepcopy(config)
        heads = given["model"].get("num_kv_heads", 1)
        for side in sides(given):
            dcp = side.get("dcp", 1)
            attn = attention_tp(side)
            if isinstance(dcp, int) and dcp > 1 and attn % dcp == 0 and heads * dcp > attn:
                side["dcp"] = 1
        super().validate_topology(given)
