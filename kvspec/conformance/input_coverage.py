"""What the suite's inputs reach: the features of the domain every check's drawn examples
hit, counted per clause family under a profile (``kvspec conform IMPL --coverage``).

A check passes on the examples it is given; a corner its strategy never draws is a corner
no implementation is ever held to. This module names the corners as data —
:data:`DECLARED`, read from the spec's own enumerations (every preset, every TP relation
with every replica policy, every replica policy on a hybrid (its layer groups and state
reads planned under it), every layer-group kind, every state kind with and without
speculative rows, every lifecycle event and the event sequences the LIFE clauses speak
of, every token rule and dtype; and, below the issue-44 line, each descriptor layout
kind and the side a bound is broken on, model facts changed together, a merge whose
shards share layers) — reads the features of any example
(:func:`features_of`, a walk over its plain data), and counts what each check draws under
a profile without running the check (:func:`draw_coverage`: the strategy and the pinned
examples, exactly as the runner hands them over). A declared feature that its families
never draw is a gap (:meth:`InputCoverage.gaps`); tests/suite/test_input_coverage.py fails
on a gap that is not on its known list, and on a known gap that has been closed.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.adapter.capabilities import provided_capabilities
from kvspec.conformance.checks import Check, Example, all_checks
from kvspec.conformance.checks.example_layouts import example_layout
from kvspec.conformance.families.descriptors.checks import (
    LAYOUT_KINDS,
    SIDES,
    SPLIT_SLOTS,
    layout_kinds,
)
from kvspec.conformance.families.models.refusal_checks import TOGETHER
from kvspec.conformance.runner import hypothesis_test, requested_examples
from kvspec.core.dtype_names import DTYPE_NAMES
from kvspec.lifecycle.machine import EVENTS
from kvspec.memory.presets import PRESETS
from kvspec.topology.case import TransferCase
from kvspec.topology.groups import KINDS
from kvspec.topology.plan import POLICIES
from kvspec.topology.tokens import RULE_KINDS


@dataclass(frozen=True)
class Feature:
    """One corner of the domain: ``axis`` (``preset``, ``tp pair``, ...) and ``value``,
    and the clause families whose checks should draw it (any one of them suffices)."""

    axis: str
    value: str
    families: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.axis}: {self.value}"


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


RELATIONS: tuple[str, ...] = (
    *(f"{way}, {fit}" for way in ("fan-in", "fan-out") for fit in ("dividing", "non-dividing")),
    "same TP",
)
"""How a transfer's TP sizes relate: more senders than receivers (fan-in) or fewer
(fan-out), dividing one another or not, or equal."""

ROUTING = ("PLAN", "SLICE", "RESHARD", "DESC", "PAYLOAD", "WIRE", "CHUNK", "KEY", "DP")
HYBRID = ("GROUP", "STATE", "WINDOW", "LOCAL", "BLOCK", "INDEX", "ORACLE", "SLAYOUT")
SPECULATIVE_KINDS = tuple(k for k, cls in KINDS.items() if "num_spec" in _field_names(cls))
"""The state kinds whose conv state carries speculative rows (``num_spec``) [STATE-1]."""

SEQUENCES: tuple[str, ...] = (
    "old-epoch handle after a restart",
    "second delivery",
    "poisoned block released",
    "allocation for a closed request",
    "post from a future epoch",
)
"""Event sequences the LIFE clauses speak of (LIFE-1, -3, -4, -6, -7)."""


def _declared() -> tuple[Feature, ...]:
    found = [Feature("preset", name, ("LAYOUT", "SLAYOUT", "PAGED")) for name in PRESETS]
    found += [Feature("tp pair", r, ROUTING) for r in RELATIONS]
    found += [
        Feature("policy x tp pair", f"{policy}, {r}", ("PLAN",))
        for policy in POLICIES
        for r in RELATIONS
        if r != "same TP"
    ]
    found += [Feature("policy x hybrid", policy, HYBRID) for policy in POLICIES]
    found += [Feature("layer kind", kind, HYBRID) for kind in KINDS]
    found += [
        Feature("state x speculative rows", f"{kind}, {rows}", HYBRID)
        for kind in SPECULATIVE_KINDS
        for rows in ("none", "some")
    ]
    found += [Feature("event", kind, ("LIFE",)) for kind in EVENTS]
    found += [Feature("event sequence", s, ("LIFE",)) for s in SEQUENCES]
    found += [Feature("cp rule", kind, ("CP",)) for kind in RULE_KINDS]
    found += [Feature("dtype", name, ("DTYPE", "PAGED", "ORACLE")) for name in DTYPE_NAMES]
    found += [Feature("attention", kind, ("MODEL", "HEAD", "PAGED")) for kind in ("mha", "mla")]
    found += [Feature("layer partition", "explicit, uneven", ("LAYER", "PLAN"))]
    found += _declared_gaps_of_issue_44()
    return tuple(found)


# The gap classes of issue 44 closed after the table's first run ----------------------------
def _declared_gaps_of_issue_44() -> list[Feature]:
    """Descriptor byte ranges of every layout kind (split slot axes among them) and a
    bound broken on either side [DESC-1, DESC-2]; pairs of model facts a handshake sees
    changed together [MODEL-3]."""
    found = [Feature("layout kind", kind, ("DESC",)) for kind in LAYOUT_KINDS]
    found += [Feature("layout kind", SPLIT_SLOTS, ("DESC",))]
    found += [Feature("bound broken on", side, ("DESC",)) for side in SIDES]
    found += [Feature("facts changed together", pair, ("MODEL",)) for pair in TOGETHER]
    found += [Feature("merged shards", SHARED_LAYERS, ("PAYLOAD",))]
    return found


SHARED_LAYERS = "a receiver whose shards share layers, so one can lack a layer another has"
"""The set of payloads PAYLOAD-3.8's probe needs: one receiver, several senders whose
edges carry a layer in common, one of them more than one layer [PAYLOAD-3]."""


def _shares_layers(example: Mapping[str, Any]) -> bool:
    """Whether a tensor example's plan has a receiver of :data:`SHARED_LAYERS`."""
    try:
        plan = TransferCase.from_dict(example["case"]).plan()
    except (ValueError, TypeError, KeyError):
        return False  # an example outside the spec's domain: no plan to merge by
    for dst in {e.dst for e in plan.edges}:
        edges = [set(e.layers) for e in plan.edges_to(dst)]
        for i, mine in enumerate(edges):
            if len(mine) > 1 and any(mine & other for j, other in enumerate(edges) if j != i):
                return True
    return False


def _gap_features(key: str, value: object, found: set[str]) -> None:
    """The issue-44 features one key of an example names."""
    if key == "layout" and isinstance(value, str) and value in PRESETS:
        found.update(f"layout kind: {k}" for k in layout_kinds(example_layout({key: value}, key)))
    elif key == "short_side" and value in SIDES:
        found.add(f"bound broken on: {value}")
    elif key == "together" and value in TOGETHER:
        found.add(f"facts changed together: {value}")


DECLARED: tuple[Feature, ...] = _declared()
"""Every feature of the domain the suite declares it draws."""

_LAYOUT_KEYS = frozenset({"layout", "target", "known"})
"""Keys whose string values name a cache layout in the checks' examples."""


def features_of(example: object) -> set[str]:
    """The features (``axis: value``) an example's plain data hits, at any depth."""
    found: set[str] = set()
    _walk(example, found)
    return found


def _walk(value: object, found: set[str]) -> None:
    if isinstance(value, Mapping):
        if {"case", "seq_len", "seed"} <= set(value) and _shares_layers(value):
            found.add(f"merged shards: {SHARED_LAYERS}")
        _stage_pair(value, found)
        _model(value, found)
        if isinstance(value.get("events"), list):
            _events(value["events"], found)
        rule = value.get("cp_rule")
        if isinstance(rule, str):
            found.add(f"cp rule: {rule.partition(':')[0]}")
        for key, inner in value.items():
            if key in _LAYOUT_KEYS and isinstance(inner, str) and inner in PRESETS:
                found.add(f"preset: {inner}")
            _gap_features(key, inner, found)
            _walk(inner, found)
    elif isinstance(value, list | tuple):
        for inner in value:
            _walk(inner, found)


def _relation(source_tp: int, target_tp: int) -> str:
    if source_tp == target_tp:
        return "same TP"
    way = "fan-in" if source_tp > target_tp else "fan-out"
    fits = source_tp % target_tp == 0 or target_tp % source_tp == 0
    return f"{way}, {'dividing' if fits else 'non-dividing'}"


def _stage_pair(value: Mapping[str, Any], found: set[str]) -> None:
    source, target = value.get("source"), value.get("target")
    if not (isinstance(source, Mapping) and isinstance(target, Mapping)):
        return
    tps = source.get("tp"), target.get("tp")
    if not all(isinstance(t, int) and t > 0 for t in tps):
        return
    source_tp, target_tp = cast(tuple[int, int], tps)
    relation = _relation(source_tp, target_tp)
    found.add(f"tp pair: {relation}")
    policy = value.get("policy")
    if isinstance(policy, str) and relation != "same TP":
        found.add(f"policy x tp pair: {policy}, {relation}")
    if isinstance(policy, str) and source_tp > 1 and _hybrid(value.get("model")):
        found.add(f"policy x hybrid: {policy}")  # a replica rule reaching the group planner
    for side in (source, target):
        parts = side.get("layer_partition")
        if isinstance(parts, list) and len(set(parts)) > 1:
            found.add("layer partition: explicit, uneven")


def _hybrid(model: object) -> bool:
    """Whether a model's plain data has a layer of one of its groups."""
    if not isinstance(model, Mapping):
        return False
    groups, layers = model.get("groups"), model.get("layers")
    return (
        isinstance(groups, list)
        and isinstance(layers, list)
        and any(isinstance(i, int) and 0 < i <= len(groups) for i in layers)
    )


def _model(value: Mapping[str, Any], found: set[str]) -> None:
    if not ("attention" in value and "num_layers" in value):
        return
    for key, axis in (("attention", "attention"), ("dtype", "dtype")):
        if isinstance(value.get(key), str):
            found.add(f"{axis}: {value[key]}")
    groups, layers = value.get("groups"), value.get("layers")
    if not (isinstance(groups, list) and isinstance(layers, list)):
        return
    for index in set(layers):  # 0 is the model's own attention; i the groups' i-1
        if isinstance(index, int) and 0 < index <= len(groups):
            group = groups[index - 1]
            kind = group.get("kind") if isinstance(group, Mapping) else None
            if isinstance(kind, str):
                found.add(f"layer kind: {kind}")
                if kind in SPECULATIVE_KINDS:
                    rows = "some" if (group.get("num_spec") or 0) > 0 else "none"
                    found.add(f"state x speculative rows: {kind}, {rows}")
        elif index == 0:
            found.add("layer kind: full")


def _events(events: Sequence[object], found: set[str]) -> None:
    """Event kinds, and the sequences of :data:`SEQUENCES` the list contains."""
    epochs: dict[object, int] = {}  # peer -> its latest epoch
    posted: dict[object, tuple[object, int]] = {}  # handle -> (peer, epoch)
    closed: set[object] = set()
    delivered: set[object] = set()
    poisoned: set[object] = set()
    held: dict[object, set[object]] = {}  # request -> its blocks
    for event in events:
        if not isinstance(event, Mapping) or not isinstance(event.get("ev"), str):
            continue
        kind = event["ev"]
        found.add(f"event: {kind}")
        request, blocks = event.get("request"), event.get("blocks")
        blocks = set(blocks) if isinstance(blocks, list) else set()
        if kind == "peer_up" and isinstance(event.get("epoch"), int):
            epochs[event.get("peer")] = event["epoch"]
        elif kind == "alloc":
            if request in closed:
                found.add("event sequence: allocation for a closed request")
            held.setdefault(request, set()).update(blocks)
        elif kind == "post" and isinstance(event.get("epoch"), int):
            peer = event.get("peer")
            if event["epoch"] > epochs.get(peer, 0):
                found.add("event sequence: post from a future epoch")
            posted[event.get("handle")] = (peer, event["epoch"])
        elif kind in ("write", "complete") and event.get("handle") in posted:
            peer, epoch = posted[event.get("handle")]
            if epochs.get(peer, 0) > epoch:
                found.add("event sequence: old-epoch handle after a restart")
        elif kind == "deliver":
            if request in delivered:
                found.add("event sequence: second delivery")
            delivered.add(request)
            closed.add(request)
        elif kind in ("abort", "release"):
            if kind == "release" and held.get(request, set()) & poisoned:
                found.add("event sequence: poisoned block released")
            closed.add(request)
        elif kind == "poison":
            poisoned |= blocks
        elif kind == "free" and blocks & poisoned:
            found.add("event sequence: poisoned block released")


def family_of(check: Check) -> str:
    """A check's clause family: ``PLAN`` for ``PLAN-2``."""
    return check.clause.split("-")[0]


@dataclass
class InputCoverage:
    """How many drawn examples hit each feature, per clause family, under ``profile``."""

    profile: str
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    """Clause family -> feature name -> examples that hit it."""
    examples: Counter[str] = field(default_factory=Counter)
    """Clause family -> examples drawn."""

    def add(self, family: str, example: object) -> None:
        self.examples[family] += 1
        self.counts.setdefault(family, Counter()).update(features_of(example))

    def declared(self) -> list[Feature]:
        """The declared features some drawn family should draw (all of them for a whole
        run; for ``--clause LIFE``, the lifecycle's)."""
        return [f for f in DECLARED if set(f.families) & set(self.examples)]

    def hits(self, feature: Feature) -> int:
        """The examples of ``feature``'s families that hit it."""
        return sum(self.counts.get(f, Counter())[feature.name] for f in feature.families)

    def gaps(self, declared: Iterable[Feature] | None = None) -> list[Feature]:
        """Declared features (of :meth:`declared`) no example of their families hits."""
        return [f for f in (self.declared() if declared is None else declared) if not self.hits(f)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "examples": dict(self.examples),
            "features": [
                {"feature": f.name, "families": list(f.families), "examples": self.hits(f)}
                for f in self.declared()
            ],
            "gaps": [f.name for f in self.gaps()],
        }


def draw_coverage(
    adapter: Adapter, *, profile: str, checks: Sequence[Check] | None = None
) -> InputCoverage:
    """Draw every check's examples as the runner would under ``profile`` (its pinned
    examples first, then as many generated ones as it requests) without running the
    check, and count the features they hit. Checks the adapter cannot run are left out."""
    coverage = InputCoverage(profile)
    provided = provided_capabilities(adapter)
    for check in checks if checks is not None else all_checks():
        if set(check.needs) - provided or (check.missing and check.missing(adapter)):
            continue
        record = _recorder(coverage, family_of(check))
        hypothesis_test(
            check, adapter, record, requested_examples(check, profile), False, profile
        )()
    return coverage


def _recorder(coverage: InputCoverage, family: str) -> Callable[[Example], None]:
    def record(example: Example) -> None:
        coverage.add(family, example)

    return record


def render_coverage(coverage: InputCoverage) -> str:
    """The table ``kvspec conform IMPL --coverage`` prints: every declared feature with
    the examples that hit it, grouped by axis, gaps marked."""
    lines = [
        f"input coverage under profile {coverage.profile}: "
        f"{sum(coverage.examples.values())} examples drawn over {len(coverage.examples)} "
        "clause families, without running the checks",
        "",
    ]
    declared = coverage.declared()
    width = max((len(f.value) for f in declared), default=0)
    axis = ""
    for feature in declared:
        if feature.axis != axis:
            axis = feature.axis
            lines.append(f"{axis}  (drawn by {', '.join(feature.families)})")
        hits = coverage.hits(feature)
        lines.append(f"  {feature.value:<{width}}  {hits:>6}{'  NEVER DRAWN' if not hits else ''}")
    gaps = coverage.gaps()
    lines += [
        "",
        f"{len(declared) - len(gaps)} of {len(declared)} features drawn; {len(gaps)} never",
    ]
    return "\n".join(lines)
