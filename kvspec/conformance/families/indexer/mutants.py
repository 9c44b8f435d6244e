"""Mutants of an MLA group's sparse indexer cache [INDEX-1]: each the reference with one
bug a connector writer makes from the rule text or from vLLM's cache spec."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter, case_group_plan
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.tensors.dtypes import itemsize
from kvspec.topology.case import TransferCase
from kvspec.topology.indexer import index_entry_bytes

Config = TransferConfig


def _with_entry(
    case: TransferCase, seq_len: int, block_size: int, entry: Callable[[int, TransferCase], int]
) -> dict:
    """The reference's bytes with each token's indexer entry counted as ``entry(d, case)``
    bytes instead of index_entry_bytes(d)."""
    plan = case_group_plan(case, seq_len, block_size=block_size)
    got = {}
    for e in plan.edges:
        width = case.model.layer_groups[e.group].index_head_dim  # type: ignore[union-attr]  # as written: a state group's raises
        n = e.nbytes
        if width:
            cells = len(e.layers) * (seq_len if e.tokens is None else len(e.tokens))
            n += cells * (entry(width, case) - index_entry_bytes(width))
        if n:
            got[(e.group, e.src, e.dst)] = n
    return got


@mutant("INDEX-1.1")
class IndexerForgotten(ReferenceAdapter):
    """Moves only the MLA latent: the indexer's separate cache is never registered for
    transfer, so the decoder's indexer selects over garbage."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _with_entry(case, seq_len, block_size, lambda d, c: 0)


@mutant("INDEX-1.1")
class IndexerScalesForgotten(ReferenceAdapter):
    """Moves the fp8 values of each entry but not their float32 scales (128, not 132
    bytes per token)."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _with_entry(case, seq_len, block_size, lambda d, c: d)


@mutant("INDEX-1.1")
class IndexerInModelDtype(ReferenceAdapter):
    """Sizes the indexer entry in the model's cache dtype, like the latent beside it, not
    as fp8 values and float32 scales."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _with_entry(case, seq_len, block_size, lambda d, c: d * itemsize(c.model.dtype))


@mutant("INDEX-1.2")
class IndexerSplitOverTp(ReferenceAdapter):
    """Gives each receiver rank its TP share of every indexer entry, as if the indexer had
    a head axis; right only when the target has one rank."""

    def group_bytes(self, case: TransferCase, seq_len: int, block_size: int) -> dict:
        return _with_entry(
            case, seq_len, block_size, lambda d, c: index_entry_bytes(d) // c.target.attn_tp
        )


def _groups(config: Config) -> list[dict[str, Any]]:
    model: Mapping[str, Any] = config.get("model") or {}
    return list(model.get("groups") or ())


@mutant("INDEX-1.3")
class IndexerOnMhaIgnored(ReferenceAdapter):
    """Drops an indexer from a group that is not MLA instead of refusing it."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for group in _groups(given):
            if group.get("attention", "mha") != "mla":
                group.pop("index_head_dim", None)
        super().validate_model(given)


@mutant("INDEX-1.3")
class IndexWidthRoundedToBlock(ReferenceAdapter):
    """Rounds an index_head_dim up to whole 128-value blocks instead of refusing it."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for group in _groups(given):
            width = group.get("index_head_dim")
            if isinstance(width, int) and not isinstance(width, bool):
                group["index_head_dim"] = max(128, -(-width // 128) * 128)
        super().validate_model(given)
