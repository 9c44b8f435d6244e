"""Checks that invalid parallel sizes, ranks, attention groups, head splits, layer
partitions and token rules are refused [STAGE-1, STAGE-2, HEAD-1, HEAD-2, LAYER-1,
LAYER-2, CP-1..3]: ``validate_sizes``, ``validate_model``, ``validate_partition`` and
``validate_topology``, each probe one fact outside the spec's domain
(:mod:`kvspec.conformance.refusals`).
"""

from __future__ import annotations

import copy

from hypothesis import strategies as st

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.checks import Example
from kvspec.conformance.families.ownership.errors import ERROR_CASES
from kvspec.conformance.refusals import (
    Variant,
    mha_model,
    needs_axis,
    pinned,
    refusal_check,
    tp_pp_only,
    valid_configs,
)
from kvspec.conformance.transfer_config import attention_tp
from kvspec.topology.tokens import RULE_KINDS, CPRule, rule_kind


@st.composite
def _uneven_split(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = tp_pp_only(
        draw(valid_configs(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 1))
    )
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 1]))
    tp = config[side]["tp"]
    heads = draw(st.integers(tp + 1, 4 * tp).filter(lambda h: h % tp))
    config["model"] = mha_model(num_layers=config["model"]["num_layers"], heads=heads)
    return config


@st.composite
def _uneven_replication(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = tp_pp_only(
        draw(valid_configs(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 2))
    )
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 2]))
    tp = config[side]["tp"]
    heads = draw(st.integers(2, tp - 1).filter(lambda h: tp % h))
    config["model"] = mha_model(num_layers=config["model"]["num_layers"], heads=heads)
    return config


def _head_split(config: Example) -> tuple[object, ...]:
    """The numbers a refused head split must name: H and the attention-TP size of each side
    whose split satisfies neither HEAD-1 nor HEAD-2 ("with both numbers in the error")."""
    heads = config["model"]["num_kv_heads"]
    found: list[object] = []
    for side in ("source", "target"):
        tp = attention_tp(config[side])
        if (heads >= tp and heads % tp) or (heads < tp and tp % heads):
            found += [heads, tp]
    return tuple(found)


@st.composite
def _rank_out_of_range(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(valid_configs(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    layout = config[side]
    size = layout["tp"] * layout["pp"]
    rank = draw(st.sampled_from([size, size + 1, -1, size * 2, -size]))
    return {**config, "rank": {"side": side, "rank": rank}}


def _empty_stages(adapter: Adapter, config: Example) -> list[Variant]:
    """Every way to give one side a TP or PP size below 1 [STAGE-1] — PP only when the
    adapter's domain has PP: a fact its domain pins to 1 may have no way in at all."""
    fields = ("tp", "pp") if max(adapter.domain.pp_sizes) > 1 else ("tp",)
    found = []
    for side in ("source", "target"):
        for field in fields:
            for value in (0, -1):
                changed = copy.deepcopy(config)
                changed[side] = {**changed[side], field: value, "layer_partition": None}
                found.append(("STAGE-1.3", f"{side} {field} {value}", changed))
    return found


@st.composite
def _fewer_layers_than_pp(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(valid_configs(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    layers = config["model"]["num_layers"]
    config[side] = {**config[side], "pp": layers + draw(st.integers(1, 2)), "layer_partition": None}
    return config


def _bad_partitions(adapter: Adapter, config: Example) -> list[Variant]:
    """A valid explicit partition with one defect each: a sum off by one, a count of 0 or
    -1, one entry more or less than pp [LAYER-2]."""
    layers = max(config["model"]["num_layers"], 4)
    base = copy.deepcopy(config)
    base["model"] = {**base["model"], "num_layers": layers}
    pp = min(4, layers - 1)
    good = _split(layers, pp)
    defects: list[tuple[str, str, list[int]]] = [
        ("LAYER-2.2", "a count one too many", [good[0] + 1, *good[1:]]),
        ("LAYER-2.2", "a count one too few", [*good[:-1], good[-1] - 1]),
        ("LAYER-2.3", "a count of 0", [0, *good[1:-1], good[-1] + good[0]]),
        ("LAYER-2.3", "a count of -1", [-1, *good[1:-1], good[-1] + good[0] + 1]),
        ("LAYER-2.4", "one entry more than pp", _split(layers, pp + 1)),
        ("LAYER-2.4", "one entry fewer than pp", _split(layers, pp - 1)),
    ]
    found = []
    for side in ("source", "target"):
        for obligation, what, counts in defects:
            if obligation == "LAYER-2.2" and min(counts) < 1:
                continue
            changed = copy.deepcopy(base)
            for other in ("source", "target"):
                changed[other] = {**changed[other], "layer_partition": None}
            kept = {k: changed[side][k] for k in ("dp",) if k in changed[side]}  # its DP rank
            changed[side] = {"tp": changed[side]["tp"], "pp": pp, "layer_partition": counts, **kept}
            found.append((obligation, f"{side} partition {counts} ({what})", changed))
    return found


def _split(layers: int, parts: int) -> list[int]:
    """``layers`` as ``parts`` positive counts."""
    counts = [layers // parts] * parts
    counts[-1] += layers - sum(counts)
    return counts


def _needs_pipeline(adapter: Adapter) -> str | None:
    return None if max(adapter.domain.pp_sizes) > 1 else "the adapter's domain has no PP"


refusal_check(
    "HEAD-1",
    "refuses-uneven-split",
    "H >= tp needs H % tp == 0",
    ("HEAD-1.2",),
    _uneven_split,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 1 else "only TP1",
    method="validate_model",
    pins=pinned(ERROR_CASES, "HEAD-1"),
    offending=_head_split,
)


refusal_check(
    "HEAD-2",
    "refuses-uneven-replication",
    "H < tp needs tp % H == 0",
    ("HEAD-2.2",),
    _uneven_replication,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 2 else "no TP above 2",
    method="validate_model",
    pins=pinned(ERROR_CASES, "HEAD-2"),
    offending=_head_split,
)


refusal_check(
    "STAGE-1",
    "refuses-rank-out-of-range",
    "ranks are 0..tp*pp-1",
    ("STAGE-1.2",),
    _rank_out_of_range,
    method="validate_sizes",
    pins=pinned(ERROR_CASES, "STAGE-1"),
)


refusal_check(
    "STAGE-1",
    "refuses-empty-stage",
    "tp >= 1 and pp >= 1",
    ("STAGE-1.3",),
    valid_configs,
    pins=(),
    variants=_empty_stages,
    method="validate_sizes",
)


refusal_check(
    "LAYER-1",
    "refuses-fewer-layers-than-pp",
    "n >= pp",
    ("LAYER-1.2",),
    _fewer_layers_than_pp,
    missing=_needs_pipeline,
    method="validate_partition",
    pins=pinned(ERROR_CASES, "LAYER-1"),
)


refusal_check(
    "LAYER-2",
    "refuses-bad-partition",
    "one positive count per PP rank, summing to n",
    ("LAYER-2.2", "LAYER-2.3", "LAYER-2.4"),
    valid_configs,
    pins=(),
    variants=_bad_partitions,
    missing=lambda a: (
        None
        if max(a.domain.pp_sizes) > 1 and a.domain.explicit_partitions
        else "the adapter's domain has no explicit layer partitions"
    ),
    method="validate_partition",
)


UNKNOWN_RULES: tuple[str, ...] = (
    "ring",
    *(miss for kind in RULE_KINDS for miss in rule_kind(kind).near_misses),
    "strided:2",
    "",
)
"""Names of no rule, and each rule's near misses (one typo or one missing or wrong size
away from it, :attr:`~kvspec.topology.tokens.RuleKind.near_misses`) [CP-1]."""


def _bad_rules(adapter: Adapter, config: Example) -> list[Variant]:
    """One side with each malformed rule; with token shards so the rule matters [CP-1]."""
    found = []
    for side in ("source", "target"):
        layout = config[side]
        shards = layout.get("cp", 1) * layout.get("dcp", 1)
        changed_side = {**layout, "cp_rule": None}
        if shards == 1:
            changed_side = {"tp": 2 * layout["tp"], "pp": layout["pp"], "layer_partition": None}
            changed_side.update(cp=2, dcp=1)
        for rule in UNKNOWN_RULES:
            changed = copy.deepcopy(config)
            changed[side] = {**changed_side, "cp_rule": rule}
            changed["seq_len"] = changed.get("seq_len") or 8
            if f"{side}_dp" in changed:
                changed[f"{side}_dp"] = 0
            found.append(("CP-1.5", f"{side} rule {rule!r}", changed))
    return found


def _sharded_side(config: Example) -> str | None:
    for side in ("source", "target"):
        if config[side].get("cp", 1) * config[side].get("dcp", 1) > 1:
            return side
    return None


def _unfit_rules(adapter: Adapter, config: Example) -> list[Variant]:
    """A side with token shards given a request or a cache its rule cannot fit [CP-2]."""
    side = _sharded_side(config)
    if side is None:
        return []
    layout = config[side]
    shards = layout.get("cp", 1) * layout.get("dcp", 1)
    found = []
    for n in (0, CPRule("zigzag").min_tokens(shards) - 1):
        changed = copy.deepcopy(config)
        changed[side] = {**layout, "cp_rule": "zigzag"}
        changed["seq_len"] = n
        found.append(("CP-2.1", f"zigzag over {shards} shards, {n} tokens", changed))
    for kind in map(rule_kind, RULE_KINDS):
        for size, block in kind.unfit_blocks:
            changed = copy.deepcopy(config)
            changed[side] = {**layout, "cp_rule": kind.describe(size)}
            changed[f"{side}_block_size"] = block
            what = f"{kind.describe(size)} with cache blocks of {block}"
            found.append((kind.fit_obligation or "CP-2", what, changed))
    return found


def _bad_dcp(adapter: Adapter, config: Example) -> list[Variant]:
    """A side whose DCP does not divide its attention-TP size, or exceeds the ranks that
    hold each head [CP-3]."""
    found = []
    heads = config["model"]["num_kv_heads"]
    for side in ("source", "target"):
        layout = config[side]
        attn = layout["tp"] // (layout.get("dp", 1) * layout.get("cp", 1))
        base = {**layout, "cp_rule": layout.get("cp_rule", "contiguous")}
        changed = copy.deepcopy(config)
        changed[side] = {**base, "dcp": attn + 1}
        changed["seq_len"] = changed.get("seq_len") or 8
        found.append(("CP-3.3", f"{side} dcp {attn + 1} over attention-TP {attn}", changed))
        over = [d for d in range(2, attn + 1) if attn % d == 0 and heads * d > attn]
        if over:
            changed = copy.deepcopy(config)
            changed[side] = {**base, "dcp": over[0]}
            changed["seq_len"] = changed.get("seq_len") or 8
            found.append(
                ("CP-3.4", f"{side} dcp {over[0]}, {heads} heads over {attn} ranks", changed)
            )
    return found


def _bad_groups(adapter: Adapter, config: Example) -> list[Variant]:
    """A side whose dp * cp does not divide tp [STAGE-2]."""
    found = []
    for side in ("source", "target"):
        tp = config[side]["tp"]
        for field in ("dp", "cp"):
            changed = copy.deepcopy(config)
            changed[side] = {**changed[side], field: tp + 1, "dcp": 1}
            changed["seq_len"] = changed.get("seq_len") or 8
            found.append(("STAGE-2.3", f"{side} {field} {tp + 1} over tp {tp}", changed))
    return found


def _rule_facts(config: Example) -> tuple[object, ...]:
    """What a pinned CP-2 case's refusal must name ("refused with the values"): the token
    rule of each sharded side, its block size and the request's length."""
    found: list[object] = []
    for side in ("source", "target"):
        if config[side].get("cp", 1) * config[side].get("dcp", 1) > 1:
            found.append(config[side].get("cp_rule"))
            found.append(config.get(f"{side}_block_size"))
    found.append(config.get("seq_len"))
    return tuple(v for v in found if v is not None)


def _dcp_facts(config: Example) -> tuple[object, ...]:
    """What a pinned CP-3 case's refusal must name ("refused with the values"): each side's
    dcp and attention-TP size, and the heads."""
    found: list[object] = []
    for side in ("source", "target"):
        if config[side].get("dcp", 1) > 1:
            found += [config[side]["dcp"], attention_tp(config[side])]
    return (*found, config["model"]["num_kv_heads"]) if found else ()


def _with_shards(adapter: Adapter) -> st.SearchStrategy[Example]:
    return valid_configs(adapter).filter(lambda e: _sharded_side(e) is not None)


refusal_check(
    "CP-1",
    "refuses-unknown-rule",
    "an unknown token rule or a size below 1",
    ("CP-1.5",),
    valid_configs,
    method="validate_topology",
    variants=_bad_rules,
    missing=lambda a: None if a.domain.token_shards else "the adapter's domain has no CP",
    pins=pinned(ERROR_CASES, "CP-1"),
)


refusal_check(
    "CP-2",
    "refuses-unfit-rule",
    "a request or a cache block size the rule cannot fit",
    ("CP-2.1", "CP-2.2", "CP-2.3"),
    _with_shards,
    method="validate_topology",
    variants=_unfit_rules,
    missing=lambda a: None if a.domain.token_shards else "the adapter's domain has no CP",
    pins=pinned(ERROR_CASES, "CP-2"),
    offending=_rule_facts,
)


refusal_check(
    "CP-3",
    "refuses-bad-dcp",
    "DCP that does not divide attention TP or outnumbers each head's ranks",
    ("CP-3.3", "CP-3.4"),
    valid_configs,
    method="validate_topology",
    variants=_bad_dcp,
    missing=needs_axis("dcp_sizes", "the adapter's domain has no decode context parallelism"),
    pins=pinned(ERROR_CASES, "CP-3"),
    offending=_dcp_facts,
)


refusal_check(
    "STAGE-2",
    "refuses-bad-groups",
    "dp * cp must divide tp",
    ("STAGE-2.3",),
    valid_configs,
    method="validate_sizes",
    variants=_bad_groups,
    missing=lambda a: (
        None
        if max(a.domain.dp_sizes) > 1 or max(a.domain.cp_sizes) > 1
        else "the adapter's domain has no attention groups"
    ),
    pins=pinned(ERROR_CASES, "STAGE-2"),
)
