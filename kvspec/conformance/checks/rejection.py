"""Checks that invalid transfer configurations are refused and valid ones accepted.

Five capabilities, one per place engines refuse a configuration: ``sizes``
(``validate_sizes``: TP and PP sizes, ranks, attention groups that fit TP [STAGE-1,
STAGE-2]), ``partitions`` (``validate_partition``: pipeline layer partitions [LAYER-1,
LAYER-2]), ``topology`` (``validate_topology``: the pair of stages, their token rules
and the caches and requests they need, DCP, the router's DP ranks [PLAN-1, CP-1..3,
DP-1]), ``models`` (``validate_model``: model facts, dtypes, heads over either side's TP
[MODEL-1, MODEL-2, DTYPE-1, HEAD-1, HEAD-2, PLAN-1.1]) and ``agreement``
(``validate_agreement``: the two stages' model facts agree [MODEL-3]).

Every refusal check starts from a valid configuration inside the adapter's domain and
changes one fact to step just outside the spec's domain — off by one, negative, of
another type or kind — and pins the matching ``transfer`` cases of
:data:`kvspec.error_cases.ERROR_CASES`. Any exception counts as a refusal: the suite
judges that nothing is accepted silently, not the wording.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

from hypothesis import strategies as st

from kvspec.conformance.adapter import VALIDATORS, Adapter
from kvspec.conformance.checks import Context, Example, OutsideDomain, check, within_domain
from kvspec.conformance.checks.expectations import changed_values, expect, expect_refused
from kvspec.conformance.draws import case_examples
from kvspec.conformance.families import error_cases
from kvspec.conformance.tiers import BREAKS
from kvspec.conformance.transfer_config import TransferConfig, handed
from kvspec.error_cases import OPERATIONS
from kvspec.strategies import TransferCase
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import CPRule


def _pins(clause: str) -> tuple[Example, ...]:
    return tuple(c.args for c in error_cases() if c.op == "transfer" and c.clause == clause)


def _mha(num_layers: int = 4, heads: int = 4, head_dim: int = 8, **extra: Any) -> dict[str, Any]:
    return {**ModelShape(num_layers, heads, head_dim).to_dict(), **extra}


def _config(source_tp: int, target_tp: int, model: dict[str, Any], **extra: Any) -> Example:
    return {
        "source": {"tp": source_tp, "pp": 1, "layer_partition": None},
        "target": {"tp": target_tp, "pp": 1, "layer_partition": None},
        "model": model,
        **extra,
    }


def _valid(adapter: Adapter) -> st.SearchStrategy[Example]:
    """Valid configurations of the adapter's domain (``policy`` dropped: routing's concern)."""
    return case_examples(adapter).map(lambda e: {k: v for k, v in e.items() if k != "policy"})


# -- transfer topology ---------------------------------------------------------------------


@st.composite
def _one_side_invalid(draw: st.DrawFn, adapter: Adapter) -> Example:
    """A valid configuration whose one side gets a TP size that cannot hold the model's
    heads, while the other side still can [PLAN-1]."""
    config = draw(
        _valid(adapter).filter(
            lambda e: e["model"]["attention"] == "mha" and e["model"]["num_kv_heads"] >= 2
        )
    )
    side = draw(st.sampled_from(["source", "target"]))
    heads = config["model"]["num_kv_heads"]
    bad = [t for t in range(2, 4 * heads + 2) if heads % t and t % heads]
    config[side] = {"tp": draw(st.sampled_from(bad)), "pp": 1, "layer_partition": None}
    if f"{side}_dp" in config:
        config[f"{side}_dp"] = 0
    return config


def _plain(config: Example) -> Example:
    """The configuration without attention groups, token shards or a request: both sides
    TP and PP only, so head rules apply to tp itself."""
    plain = {k: v for k, v in config.items() if k not in ("seq_len", "source_dp", "target_dp")}
    for side in ("source", "target"):
        plain[side] = {k: config[side][k] for k in ("tp", "pp", "layer_partition")}
    return plain


@st.composite
def _uneven_split(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = _plain(
        draw(_valid(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 1))
    )
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 1]))
    tp = config[side]["tp"]
    heads = draw(st.integers(tp + 1, 4 * tp).filter(lambda h: h % tp))
    config["model"] = _mha(num_layers=config["model"]["num_layers"], heads=heads)
    return config


@st.composite
def _uneven_replication(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = _plain(
        draw(_valid(adapter).filter(lambda e: max(e["source"]["tp"], e["target"]["tp"]) > 2))
    )
    side = draw(st.sampled_from([s for s in ("source", "target") if config[s]["tp"] > 2]))
    tp = config[side]["tp"]
    heads = draw(st.integers(2, tp - 1).filter(lambda h: tp % h))
    config["model"] = _mha(num_layers=config["model"]["num_layers"], heads=heads)
    return config


@st.composite
def _rank_out_of_range(draw: st.DrawFn, adapter: Adapter) -> Example:
    config = draw(_valid(adapter))
    side = draw(st.sampled_from(["source", "target"]))
    layout = config[side]
    size = layout["tp"] * layout["pp"]
    rank = draw(st.sampled_from([size, size + 1, -1, size * 2, -size]))
    return {**config, "rank": {"side": side, "rank": rank}}


Variant = tuple[str, str, Example]
"""(obligation, what was changed, the configuration)."""


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
    config = draw(_valid(adapter))
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


_ANY = Adapter()


def _refusal_check(
    clause: str,
    slug: str,
    title: str,
    covers: tuple[str, ...],
    strategy: Callable[[Adapter], st.SearchStrategy[Example]],
    *,
    method: str,
    missing: Callable[[Adapter], str | None] | None = None,
    pins: tuple[Example, ...] | None = None,
    variants: Callable[[Adapter, Example], list[Variant]] | None = None,
) -> None:
    """A check that ``method`` refuses each configuration, or (with ``variants``) every
    variant of each valid configuration, each one step outside the spec's domain."""

    @check(
        clause,
        slug,
        title,
        needs=(VALIDATORS[method],),
        strategy=strategy,
        examples=_pins(clause) if pins is None else pins,
        missing=missing,
        covers=covers,
    )
    def run(ctx: Context, config: Example) -> None:
        probes = variants(ctx.adapter, config) if variants else [(covers[0], title, config)]
        for obligation, what, probe in probes:
            handed(probe)

            def validate(probe: Example = probe) -> object:
                return getattr(ctx.adapter, method)(copy.deepcopy(probe))

            expect_refused(
                obligation,
                f"configuration {probe} ({what})",
                validate,
                # a variant names what it changed; a drawn invalid config: its type decides
                naming=changed_values(config, probe) if variants else (),
                accepted=probe,
            )


def _needs_pipeline(adapter: Adapter) -> str | None:
    return None if max(adapter.domain.pp_sizes) > 1 else "the adapter's domain has no PP"


_refusal_check(
    "PLAN-1",
    "refuses-one-invalid-side",
    "a pair where one side alone cannot hold the model is refused",
    ("PLAN-1.1",),
    _one_side_invalid,
    method="validate_model",  # heads over each side's TP: refused where the model loads
)
_refusal_check(
    "HEAD-1",
    "refuses-uneven-split",
    "H >= tp needs H % tp == 0",
    ("HEAD-1.2",),
    _uneven_split,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 1 else "only TP1",
    method="validate_model",
)
_refusal_check(
    "HEAD-2",
    "refuses-uneven-replication",
    "H < tp needs tp % H == 0",
    ("HEAD-2.2",),
    _uneven_replication,
    missing=lambda a: None if max(max(p) for p in a.domain.pairs()) > 2 else "no TP above 2",
    method="validate_model",
)
_refusal_check(
    "STAGE-1",
    "refuses-rank-out-of-range",
    "ranks are 0..tp*pp-1",
    ("STAGE-1.2",),
    _rank_out_of_range,
    method="validate_sizes",
)
_refusal_check(
    "STAGE-1",
    "refuses-empty-stage",
    "tp >= 1 and pp >= 1",
    ("STAGE-1.3",),
    _valid,
    pins=(),
    variants=_empty_stages,
    method="validate_sizes",
)
_refusal_check(
    "LAYER-1",
    "refuses-fewer-layers-than-pp",
    "n >= pp",
    ("LAYER-1.2",),
    _fewer_layers_than_pp,
    missing=_needs_pipeline,
    method="validate_partition",
)
_refusal_check(
    "LAYER-2",
    "refuses-bad-partition",
    "one positive count per PP rank, summing to n",
    ("LAYER-2.2", "LAYER-2.3", "LAYER-2.4"),
    _valid,
    pins=(),
    variants=_bad_partitions,
    missing=lambda a: (
        None
        if max(a.domain.pp_sizes) > 1 and a.domain.explicit_partitions
        else "the adapter's domain has no explicit layer partitions"
    ),
    method="validate_partition",
)


# -- attention groups, token shards and DP ranks [STAGE-2, CP-1..3, DP-1] ---------------

UNKNOWN_RULES: tuple[str, ...] = (
    "ring",
    "Interleave:4",
    "interleave",
    "interleave:0",
    "interleave:-2",
    "interleave:1.5",
    "round_robin_blocks",
    "round_robin_blocks:0",
    "zigzag:2",
    "contiguous:0",
    "strided:2",
    "",
)
"""Rule names one typo or one missing size away from a real rule [CP-1]."""


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
    for size, block in ((2, 3), (4, 6), (16, 24), (3, 1)):
        changed = copy.deepcopy(config)
        changed[side] = {**layout, "cp_rule": f"interleave:{size}"}
        changed[f"{side}_block_size"] = block
        found.append(("CP-2.2", f"interleave:{size} with cache blocks of {block}", changed))
    for kind in ("round_robin_blocks", "contiguous"):
        for size, block in ((2, 4), (4, 2), (16, 32)):
            changed = copy.deepcopy(config)
            changed[side] = {**layout, "cp_rule": f"{kind}:{size}"}
            changed[f"{side}_block_size"] = block
            found.append(("CP-2.3", f"{kind}:{size} with cache blocks of {block}", changed))
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


def _bad_dp_ranks(adapter: Adapter, config: Example) -> list[Variant]:
    """The router's DP rank outside 0..dp-1 on one side [DP-1]."""
    found = []
    for side in ("source", "target"):
        dp = config[side].get("dp", 1)
        for rank in (dp, dp + 1, -1):
            changed = copy.deepcopy(config)
            changed.setdefault("source_dp", 0)
            changed.setdefault("target_dp", 0)
            changed[f"{side}_dp"] = rank
            found.append(("DP-1.3", f"{side} DP rank {rank} of dp {dp}", changed))
    return found


def _needs(attribute: str, what: str) -> Callable[[Adapter], str | None]:
    def why(adapter: Adapter) -> str | None:
        return None if max(getattr(adapter.domain, attribute)) > 1 else what

    return why


def _with_shards(adapter: Adapter) -> st.SearchStrategy[Example]:
    return _valid(adapter).filter(lambda e: _sharded_side(e) is not None)


_refusal_check(
    "CP-1",
    "refuses-unknown-rule",
    "an unknown token rule or a size below 1",
    ("CP-1.5",),
    _valid,
    method="validate_topology",
    variants=_bad_rules,
    missing=lambda a: None if a.domain.token_shards else "the adapter's domain has no CP",
)
_refusal_check(
    "CP-2",
    "refuses-unfit-rule",
    "a request or a cache block size the rule cannot fit",
    ("CP-2.1", "CP-2.2", "CP-2.3"),
    _with_shards,
    method="validate_topology",
    variants=_unfit_rules,
    missing=lambda a: None if a.domain.token_shards else "the adapter's domain has no CP",
)
_refusal_check(
    "CP-3",
    "refuses-bad-dcp",
    "DCP that does not divide attention TP or outnumbers each head's ranks",
    ("CP-3.3", "CP-3.4"),
    _valid,
    method="validate_topology",
    variants=_bad_dcp,
    missing=_needs("dcp_sizes", "the adapter's domain has no decode context parallelism"),
)
_refusal_check(
    "STAGE-2",
    "refuses-bad-groups",
    "dp * cp must divide tp",
    ("STAGE-2.3",),
    _valid,
    method="validate_sizes",
    variants=_bad_groups,
    missing=lambda a: (
        None
        if max(a.domain.dp_sizes) > 1 or max(a.domain.cp_sizes) > 1
        else "the adapter's domain has no attention groups"
    ),
)
_refusal_check(
    "DP-1",
    "refuses-dp-rank",
    "the router's DP rank must be one of the stage's",
    ("DP-1.3",),
    _valid,
    method="validate_topology",
    variants=_bad_dp_ranks,
    missing=_needs("dp_sizes", "the adapter's domain has no attention DP"),
)


def _accepts_check(slug: str, method: str, *, agreeing: bool = False, ranked: bool = False) -> None:
    """A check that ``method`` accepts every valid configuration of the domain — a refusal
    check alone would pass a validator that refuses everything [PLAN-1.2]; with
    ``agreeing``, the receiver's model is stated and equal to the sender's; with
    ``ranked``, the configuration names the last rank of one side (``tp * pp - 1``)."""

    @check(
        "PLAN-1",
        slug,
        f"every valid configuration passes {method}",
        needs=(VALIDATORS[method],),
        strategy=_valid,
        covers=("PLAN-1.2",),
    )
    def run(ctx: Context, config: Example) -> None:
        OPERATIONS["transfer"](config)  # the reference accepts it
        within_domain(ctx, TransferCase.from_dict(config))
        given = {**config, "target_model": dict(config["model"])} if agreeing else config
        if ranked:
            side = "source" if config["source"]["pp"] > 1 else "target"
            last = config[side]["tp"] * config[side]["pp"] - 1
            given = {**given, "rank": {"side": side, "rank": last}}
        handed(given)
        try:
            getattr(ctx.adapter, method)(copy.deepcopy(given))
        except Exception as error:
            expect(
                False, f"valid configuration {given} was refused: {error!r} [PLAN-1.2]", tier=BREAKS
            )


_accepts_check("accepts-valid", "validate_topology")
_accepts_check("sizes-accept-valid", "validate_sizes", ranked=True)
_accepts_check("models-accept-valid", "validate_model")
_accepts_check("partitions-accept-valid", "validate_partition")
_accepts_check("agreement-accepts-equal-models", "validate_agreement", agreeing=True)


# -- model facts -----------------------------------------------------------------------------


def _bad_models(adapter: Adapter, config: Example) -> list[Variant]:
    """The configuration with one model fact out of range, of another type or kind, for
    every fact [MODEL-1]."""
    model = config["model"]
    found = []
    for fact in ("num_layers", "num_kv_heads", "head_dim"):
        value = model[fact]
        for bad in (0, -1, float(value), str(value), True):
            if bad is True and value == 1:
                continue  # True == 1: the same number, though of the wrong type
            found.append(
                ("MODEL-1.1", f"{fact} {bad!r}", {**config, "model": {**model, fact: bad}})
            )
    for kind in ("gqa", "MHA", "sparse", "", "mqa"):
        found.append(
            ("MODEL-1.2", f"attention {kind!r}", {**config, "model": {**model, "attention": kind}})
        )
    fp8 = model["dtype"] in FP8_DTYPES
    for scale_format in ("per_tensor", "per_token", "") + (() if fp8 else ("per_layer",)):
        changed = {**config, "model": {**model, "scale_format": scale_format}}
        found.append(("MODEL-1.3", f"scale_format {scale_format!r} for {model['dtype']}", changed))
    return found


def _mismatched_models(adapter: Adapter, config: Example) -> list[Variant]:
    """The configuration with a receiver's model that differs in exactly one fact, for every
    fact [MODEL-3]."""
    base = ModelShape.from_dict(config["model"])
    found = []

    def differing(obligation: str, fact: str, config: Example, **other: object) -> None:
        target = ModelShape.from_dict({**config["model"], **other}).to_dict()
        found.append((obligation, f"{fact} alone", {**config, "target_model": target}))

    differing("MODEL-3.1", "num_layers", config, num_layers=base.num_layers + 1)
    if base.attention == "mha":
        differing("MODEL-3.2", "num_kv_heads", config, num_kv_heads=base.num_kv_heads * 2)
    differing("MODEL-3.3", "head_dim", config, head_dim=base.head_dim + 1)
    # MHA with one head and MLA of that width hold as many numbers per token; they still
    # differ in kind (K and V against one latent).
    single = _plain(copy.deepcopy(config))
    single["model"] = {**single["model"], "num_kv_heads": 1}
    for side in ("source", "target"):
        single[side] = {**single[side], "tp": 1}
    differing(
        "MODEL-3.4", "attention", single, attention="mla" if base.attention == "mha" else "mha"
    )
    same_size = [d for d in DTYPES if d != base.dtype and DTYPES[d].itemsize == base.itemsize]
    other = (same_size or [d for d in DTYPES if d != base.dtype])[0]
    differing("MODEL-3.5", "dtype", config, dtype=other, scale_format=None)
    return found


_refusal_check(
    "MODEL-1",
    "refuses-invalid-model",
    "positive integer sizes, a known attention kind, scale formats only for fp8",
    ("MODEL-1.1", "MODEL-1.2", "MODEL-1.3"),
    _valid,
    method="validate_model",
    variants=_bad_models,
)
_refusal_check(
    "MODEL-2",
    "refuses-mla-with-heads",
    "MLA has one latent",
    ("MODEL-2.2",),
    lambda adapter: st.integers(2, 64).map(lambda h: _config(1, 1, _mha(heads=h, attention="mla"))),
    method="validate_model",
)


_refusal_check(
    "MODEL-3",
    "refuses-mismatched-models",
    "stages must agree on every model fact",
    tuple(f"MODEL-3.{i}" for i in range(1, 6)),
    _valid,
    method="validate_agreement",
    pins=(),
    variants=_mismatched_models,
)


_UNKNOWN_DTYPES = ("int8", "float64", "uint8", "float8_e4m3fnuz", "bool", "bf16", "half", "fp8")


_refusal_check(
    "DTYPE-1",
    "refuses-unknown-dtype",
    "only the allowed dtypes",
    ("DTYPE-1.1",),
    _valid,
    method="validate_model",
    variants=lambda adapter, config: [
        (
            "DTYPE-1.1",
            f"dtype {d!r}",
            {**config, "model": {**config["model"], "dtype": d, "scale_format": None}},
        )
        for d in _UNKNOWN_DTYPES
    ],
)


@check(
    "DTYPE-1",
    "accepts-allowed",
    "every allowed dtype of the domain is accepted, for MHA and MLA",
    needs=("models",),
    strategy=lambda adapter: st.tuples(
        st.sampled_from(adapter.domain.model_dtypes()),
        st.sampled_from(adapter.domain.attention),
    ).map(
        lambda pair: _config(
            1,
            1,
            ModelShape.mla(2, 8, dtype=pair[0]).to_dict()
            if pair[1] == "mla"
            else ModelShape(4, 4, 8, dtype=pair[0]).to_dict(),
        )
    ),
    covers=("DTYPE-1.2",),
)
def accepts_allowed(ctx: Context, config: Example) -> None:
    if config["model"]["dtype"] not in ctx.adapter.domain.model_dtypes():
        raise OutsideDomain
    handed(config)  # its keys are a TransferConfig's
    try:
        ctx.adapter.validate_model(copy.deepcopy(cast(TransferConfig, config)))
    except Exception as error:
        expect(
            False,
            f"a {config['model']['dtype']} model ({config['model']}) was refused: {error!r}; "
            "each allowed dtype is accepted [DTYPE-1.2]",
            tier=BREAKS,
        )
