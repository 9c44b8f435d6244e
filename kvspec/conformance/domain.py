"""An implementation's domain, declared as data, and the example strategies drawn inside it.

An adapter says what its implementation handles — which TP pairs (or ratios), whether
pairs that do not divide are in, which pipeline sizes, whether heads may be replicated
(``H < tp``), which attention-DP and context-parallel sizes and token rules, which
attention kinds, dtypes, fp8 scale formats, cache layouts and block sizes — as a
:class:`Domain`. The checks draw their examples *inside* it, so a narrow implementation
is checked on as many examples as a broad one; :meth:`Adapter.supports` stays as a
final filter for what the data cannot say, and every example it turns away is counted
[PLAN-1].

The axes the second release added (non-dividing TP pairs, ``dp``, ``cp``, ``dcp``)
are closed in ``Domain()``, so an adapter written before them is not drawn into them;
:data:`EVERYTHING` opens every axis, and the reference declares it.

Negative checks build their inputs from examples inside the domain and change one
fact to step just outside the *spec's* domain, so they too stay relevant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS, CacheLayout, get_layout, holds_attention
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES, check_dtype
from kvspec.testing.strategies import TP_SIZES, Partitioner, divides, dividing_pairs, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ATTENTION_KINDS, SCALE_FORMATS, ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import RULE_KINDS

BLOCK_SIZES: tuple[int, ...] = (1, 2, 3, 4, 5)
"""Block sizes drawn by default: small, so that few tokens fill several blocks."""


def _tuple(value: Iterable[Any] | None) -> tuple:
    return tuple(value) if value is not None else ()


@dataclass(frozen=True)
class Domain:
    """What an implementation handles; the default is everything the spec allows.

    - ``tp_pairs``: the (source TP, target TP) pairs it handles, or ``None`` for every
      pair of ``tp_sizes`` that divides (every pair with ``non_dividing_tp``) [PLAN-1];
      ``tp_ratios`` keeps only pairs whose larger TP is that multiple of the smaller
      (1 = equal TP).
    - ``dp_sizes``, ``cp_sizes``, ``dcp_sizes``: attention-DP and context-parallel sizes
      it handles on either side [STAGE-2, CP-3]; ``cp_rules`` the token rules [CP-1].
    - ``pp_sizes``: pipeline sizes it handles on either side (``(1,)``: no PP);
      ``explicit_partitions``: whether explicit layer partitions are in [LAYER-2].
    - ``replicated_heads``: whether ``H < tp`` (GQA replication) is in [HEAD-2].
    - ``attention``, ``dtypes``, ``scale_formats``: model facts [MODEL-1]; fp8 dtypes
      are in only with a scale format [DTYPE-3].
    - ``layouts``, ``block_sizes``: cache layouts (every preset by default: K/V ones,
      cross-layer ones, inline-scale ones) and block sizes [LAYOUT-1, LAYOUT-5, PAGED-1].
    - ``repeated_deliveries``: whether its receiver can be handed the same shipment twice
      (a pushed message can arrive again); ``False`` where that cannot happen — a
      receiver that reads what it planned (pull, RDMA), or one fed from a store keyed by
      name, where a repeat is the same entry — and the repeat case of RESHARD-3 is
      then not asked.
    """

    tp_pairs: tuple[tuple[int, int], ...] | None = None
    tp_ratios: tuple[int, ...] | None = None
    tp_sizes: tuple[int, ...] = TP_SIZES
    pp_sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    explicit_partitions: bool = True
    replicated_heads: bool = True
    attention: tuple[str, ...] = ATTENTION_KINDS
    dtypes: tuple[str, ...] = tuple(DTYPES)
    scale_formats: tuple[str, ...] = SCALE_FORMATS
    layouts: tuple[str, ...] = tuple(PRESETS)
    block_sizes: tuple[int, ...] = field(default=BLOCK_SIZES)
    non_dividing_tp: bool = False
    dp_sizes: tuple[int, ...] = (1,)
    cp_sizes: tuple[int, ...] = (1,)
    dcp_sizes: tuple[int, ...] = (1,)
    cp_rules: tuple[str, ...] = RULE_KINDS
    repeated_deliveries: bool = True
    _values: dict[str, CacheLayout] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "tp_sizes",
            "pp_sizes",
            "attention",
            "dtypes",
            "layouts",
            "block_sizes",
            "dp_sizes",
            "cp_sizes",
            "dcp_sizes",
            "cp_rules",
        ):
            object.__setattr__(self, name, _tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ValueError(f"Domain.{name} must not be empty")
        object.__setattr__(self, "scale_formats", _tuple(self.scale_formats))
        if self.tp_pairs is not None:
            pairs = tuple((int(s), int(t)) for s, t in self.tp_pairs)
            object.__setattr__(self, "tp_pairs", pairs)
            bad = [p for p in pairs if not divides(*p) and not self.non_dividing_tp]
            if bad:
                raise ValueError(
                    f"Domain.tp_pairs {bad} do not divide one another; declare "
                    "non_dividing_tp=True to hold such pairs [PLAN-1]"
                )
        if self.tp_ratios is not None:
            object.__setattr__(self, "tp_ratios", _tuple(self.tp_ratios))
        for name in ("tp_sizes", "pp_sizes", "block_sizes", "dp_sizes", "cp_sizes", "dcp_sizes"):
            small = [v for v in getattr(self, name) if not isinstance(v, int) or v < 1]
            if small:
                raise ValueError(f"Domain.{name} must be integers >= 1, got {small}")
        unknown = set(self.cp_rules) - set(RULE_KINDS)
        if unknown:
            raise ValueError(f"Domain.cp_rules: unknown rules {sorted(unknown)} [CP-1]")
        unknown = set(self.attention) - set(ATTENTION_KINDS)
        if unknown:
            raise ValueError(f"Domain.attention: unknown kinds {sorted(unknown)} [MODEL-1]")
        for name in self.dtypes:
            check_dtype(name)
        unknown = set(self.scale_formats) - set(SCALE_FORMATS)
        if unknown:
            raise ValueError(f"Domain.scale_formats: unknown {sorted(unknown)} [MODEL-1]")
        # The adapter's layout names (presets, layout files) are parsed here, once: the
        # suite hands the adapter its own names and reads the values [LAYOUT-1, LAYOUT-5].
        object.__setattr__(self, "_values", {name: get_layout(name) for name in self.layouts})
        if not self.pairs():
            raise ValueError("the domain holds no TP pair (check tp_pairs, tp_ratios, tp_sizes)")
        if not self.model_dtypes():
            raise ValueError("the domain holds no dtype (fp8 dtypes need a scale format)")

    # -- what is inside ------------------------------------------------------------------

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The (source TP, target TP) pairs inside the domain."""
        pairs: Sequence[tuple[int, int]]
        if self.tp_pairs is not None:
            pairs = self.tp_pairs
        elif self.non_dividing_tp:
            pairs = tuple((s, t) for s in self.tp_sizes for t in self.tp_sizes)
        else:
            pairs = tuple(dividing_pairs(self.tp_sizes))
        if self.tp_ratios is not None:
            pairs = [(s, t) for s, t in pairs if max(s, t) // min(s, t) in self.tp_ratios]
        return tuple(pairs)

    def model_dtypes(self, wanted: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """The domain's dtypes (among ``wanted``); fp8 only with a scale format [DTYPE-3]."""
        found = [d for d in self.dtypes if d not in FP8_DTYPES or self.scale_formats]
        return tuple(d for d in found if wanted is None or d in wanted)

    @property
    def fp8(self) -> bool:
        """Whether fp8 caches, and so their scales, are inside the domain [DTYPE-3]."""
        return bool(self.model_dtypes(FP8_DTYPES))

    def attention_kinds(self, wanted: tuple[str, ...] | None = None) -> tuple[str, ...]:
        return tuple(a for a in self.attention if wanted is None or a in wanted)

    def layout(self, name: str) -> CacheLayout:
        """The value of one of the domain's layouts, by the name the adapter gave it (the
        name an example carries, as the adapter is handed it) [LAYOUT-1, LAYOUT-5]; a name
        outside the domain is refused with the domain's names."""
        try:
            return self._values[name]
        except KeyError:
            raise ValueError(
                f"layout {name!r} is not in the domain; it has {sorted(self._values)}"
            ) from None

    def cache_layouts(self, attention: str | None = None) -> tuple[str, ...]:
        """The domain's layouts (that can hold ``attention``'s cache, when given)."""
        kinds = (attention,) if attention else ("mha", "mla")
        return tuple(
            name
            for name, value in self._values.items()
            if any(holds_attention(value, kind, cross_layer=True) for kind in kinds)
        )

    def plain_layouts(self, *, cross_layer: bool = True) -> tuple[str, ...]:
        """The domain's layouts whose cells hold only K and V (or a latent) [LAYOUT-1]."""
        return tuple(
            n for n, v in self._values.items() if v.plain and (cross_layer or not v.cross_layer)
        )

    def record_layouts(self) -> tuple[str, ...]:
        """The domain's layouts whose cells carry inline scales or a fixed record [LAYOUT-6]."""
        return tuple(n for n, v in self._values.items() if not v.plain and not v.scaled)

    def scaled_layouts(self) -> tuple[str, ...]:
        """The domain's block-scaled layouts, their fields in per-block planes or side
        tensors [LAYOUT-8]: those whose model dtypes the domain has."""
        dtypes = set(self.model_dtypes())
        return tuple(
            n for n, v in self._values.items() if v.scaled and set(v.dtypes or ()) & dtypes
        )

    def holds(self, case: TransferCase) -> bool:
        """Whether a transfer case lies inside the domain (pinned examples may not)."""
        return self.outside(case) is None

    def outside(self, case: TransferCase) -> str | None:
        """What puts a transfer case outside the domain, in words; None when it is inside."""
        tps = (case.source.tp, case.target.tp)
        if tps not in self.pairs():
            return f"TP{tps[0]} -> TP{tps[1]} is not one of its TP pairs"
        for side, layout in (("source", case.source), ("target", case.target)):
            why = self.stage_outside(layout, case.model)
            if why:
                return f"the {side} stage: {why}"
        return None

    def holds_stage(self, layout: StageLayout, model: ModelShape) -> bool:
        """Whether one stage of ``model`` laid out as ``layout`` lies inside the domain (what
        a question about one stage, such as who owns what, may ask)."""
        return self.stage_outside(layout, model) is None

    def stage_outside(self, layout: StageLayout, model: ModelShape) -> str | None:
        """What puts one stage outside the domain, in words, or None: a TP of none of its
        pairs, its PP sizes, partitions and parallel axes, the model's attention and dtype,
        and heads fewer than the TP unless replicated heads are in."""
        if not any(layout.tp in pair for pair in self.pairs()):
            return f"TP{layout.tp} is in none of its TP pairs"
        if layout.pp not in self.pp_sizes:
            return f"PP{layout.pp} is not among pp_sizes {self.pp_sizes}"
        if not self.explicit_partitions and layout.layer_partition is not None:
            return "an explicit layer partition, and explicit_partitions is False"
        if not (
            self.replicated_heads or model.attention == "mla" or model.num_kv_heads >= layout.tp
        ):
            return (
                f"{model.num_kv_heads} KV heads over TP{layout.tp} are replicated, and "
                "replicated_heads is False"
            )
        if model.attention not in self.attention:
            return f"{model.attention} attention is not among {self.attention}"
        if model.dtype not in self.model_dtypes():
            return f"{model.dtype} is not among its dtypes {self.model_dtypes()}"
        if not self.holds_layout(layout):
            return (
                f"DP{layout.dp}, CP{layout.cp}, DCP{layout.dcp} ({layout.rule.kind}) is not "
                f"among dp_sizes {self.dp_sizes}, cp_sizes {self.cp_sizes}, dcp_sizes "
                f"{self.dcp_sizes}, cp_rules {self.cp_rules}"
            )
        return None

    def holds_layout(self, layout: StageLayout) -> bool:
        return (
            layout.dp in self.dp_sizes
            and layout.cp in self.cp_sizes
            and layout.dcp in self.dcp_sizes
            and (layout.token_shards == 1 or layout.rule.kind in self.cp_rules)
        )

    @property
    def token_shards(self) -> bool:
        """Whether context parallelism (token shards) is inside the domain [CP-1]."""
        return max(self.cp_sizes) > 1 or max(self.dcp_sizes) > 1

    # -- strategies inside it -------------------------------------------------------------

    def cases(
        self,
        *,
        policies: tuple[str, ...],
        max_layers: int = 8,
        max_head_dim: int = 4,
        max_pp: int = 3,
        dtypes: tuple[str, ...] | None = None,
        attention: tuple[str, ...] | None = None,
        partition: Partitioner | None = None,
    ) -> st.SearchStrategy[TransferCase]:
        """Valid transfer cases inside the domain; ``dtypes`` and ``attention`` narrow it
        further (an empty intersection is the caller's "not provided"); ``partition`` is
        the engine's default layer split (``Adapter.layer_partition``), given to stages
        drawn without a partition."""
        return transfer_cases(
            pairs=self.pairs(),
            pp_sizes=tuple(p for p in self.pp_sizes if p <= max_pp) or (min(self.pp_sizes),),
            replicated_heads=self.replicated_heads,
            explicit_partitions=self.explicit_partitions,
            attention=self.attention_kinds(attention),
            dtypes=self.model_dtypes(dtypes),
            policies=policies or ("lowest",),
            max_layers=max(max_layers, min(self.pp_sizes)),
            max_head_dim=max_head_dim,
            non_dividing=self.non_dividing_tp and self.tp_pairs is None,
            dp_sizes=self.dp_sizes,
            cp_sizes=self.cp_sizes,
            dcp_sizes=self.dcp_sizes,
            rules=self.cp_rules,
            partition=partition,
        )

    def describe(self) -> str:
        """One line: how the domain differs from the whole spec."""
        parts = [
            f"{name}={getattr(self, name)!r}"
            for name in self.__dataclass_fields__
            if getattr(self, name) != getattr(EVERYTHING, name)
        ]
        return ", ".join(parts) or "everything the spec allows"


FIRST_RELEASE = Domain()
"""The first release's domain: TP and PP, dividing TP pairs. The default of an adapter."""

EVERYTHING = Domain(
    non_dividing_tp=True, dp_sizes=(1, 2, 4), cp_sizes=(1, 2, 3, 4), dcp_sizes=(1, 2, 4)
)
"""The whole spec's domain, every axis open; the reference declares it."""
