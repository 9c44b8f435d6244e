"""One bug, one headline: failures that share a cause, grouped under the most basic one.

One wrong rule rarely fails one check. An adapter that takes a replicated head from
every replica (:class:`~kvspec.conformance.families.routing.mutants.ReplicasMergedTwice`) fails
the routing check, and then every tensor check that plans a transfer on the way to its
own rule: bit-exact special values, fp8 scales, shard shapes, merges, chunks, the wire.
Listed in clause order the first of those is about NaN and -0.0 (``DTYPE-2`` comes
before ``PLAN`` in the clause table), and the routing bug is somewhere in the middle.
:func:`group` turns that list into causes: one headline each, the rest of its failures
listed as its consequences.

**When two failures share a cause** (the links are transitive; a cause is a connected
set of FAILED results):

1. *the same counterexample*: identical plain data (canonical JSON, keys sorted);
2. *the same transfer case*: both counterexamples hold (at any depth: ``case``,
   ``tensors.case``, ``base.case``, or at the top) the same
   :class:`~kvspec.topology.case.TransferCase`, compared on all of its fields: ``source``,
   ``target``, ``model``, ``policy``, and where the case has them its own ``seq_len``
   (the plan of token-sharded stages depends on it) and DP ranks. What only varies the
   request's data (the example's ``seed``, its outer ``seq_len``, chunk cuts, a fuzz
   index) is not compared: one deployment, one plan, whatever bytes flow through it. A
   bare model, a layout or a seed is never enough: the same model under two deployments
   is two plans;
3. *the same broken rule, reported downstream*: a check that cites, as the obligation
   it found broken, one of *another* clause (``DTYPE-2/special-values`` failing with
   "routing lists source 0 for target 1 ... [PLAN-2.3]") is a consequence of that
   clause: it is linked with every failure of that clause (by its check or by the
   obligation its message cites). This is the "same first wrong edge" of issue 28 made
   exact: an edge (``source 0 -> target 1``) names processes of one deployment only, so
   two failures naming the same edge already share their transfer case (link 2); what
   crosses deployments is the rule the edge broke, and the suite's messages cite it.
   Two failures of one clause found by that clause's own checks on two different
   deployments are *not* linked by this: they may be two bugs.

The violated obligation of a failure is ``CheckResult.obligation`` (set by the runner
from the message, :func:`kvspec.conformance.tiers.violated_obligation`); "cites" means
the message names it.

**The first wrong fact** (issue 43). What a failure found wrong is read from what it
observed where the check's message says it exactly (:func:`fact`): an ownership check
that finds a rank's heads right and its layers wrong found a layer on the wrong stage
(``LAYER-1.1``, or ``LAYER-2.1`` for an explicit partition), whatever clause the check
is for; heads wrong and layers right, a head rule (``HEAD-1.1``, ``HEAD-2.1``,
``HEAD-3.1``); both wrong, the rank numbering (``STAGE-1.1``). A transfer whose data
arrived right but its fp8 scales missing or wrong found ``DTYPE-3.1`` broken. Such a
fact counts as the obligation the failure violated, and as one it *cites* (link 3): the
failure joins the failures of that fact's clause.

**Facts before consequences.** A failure either names a wrong *fact* (a layer on the
wrong stage, an edge from the wrong sender, a -0.0 that lost its sign) or is an
*observation*: a check of a composite result, which any wrong fact beneath it also fails
(:data:`OBSERVATIONS`: a whole transfer compared with the spec's, in another arrival
order, after a request of another length, an MLA latent moved whole; and an attention
group whose heads alone are wrong, which its mapping or any head rule beneath explains).
A refusal probe whose input the implementation did *not* let through but refused
unclearly or crashed on (:func:`evidence`: a refusal obligation broken with tier
``breaks``) is the weakest evidence: an implementation that refuses too much, or crashes
on configurations of another rule, fails every probe built on them.

**Which failure is the headline** of a cause: never refusal-probe trouble while the cause
has another failure; then the most basic obligation that fails, by :data:`STRATA`
(ownership, then routing, shipments, memory, payload content, naming and wire), then the
most severe tier (:data:`~kvspec.conformance.tiers.TIERS`: corrupts, breaks,
accepts-invalid, differs), then a check of the violated clause itself before one that
only reports it, then by :func:`evidence`, then clause-table order. **Causes are
ordered** with those headlined by refusal-probe trouble last; otherwise most severe tier
first (a cause's tier is its most severe failure's), then facts before observations,
then by how basic their headline is.

How well this names the root cause is measured over the project's own mutant corpus
(:mod:`kvspec.conformance.headlines`; docs/conformance.md states the share).

Known limit: two independent bugs that both fail on the very same transfer case are
shown as one cause (the more basic as headline, the other among its consequences);
fixing the headline and running again separates them, as with a compiler's first error.

Pure functions over results; nothing here runs an adapter or imports torch.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from kvspec.core.clauses import all_clauses, all_obligations

if TYPE_CHECKING:
    from kvspec.conformance.result import CheckResult

FAILED = "FAILED"  # kvspec.conformance.result.FAILED, without importing the checks

TIER_ORDER: tuple[str, ...] = ("corrupts", "breaks", "accepts-invalid", "differs")
"""The tiers, most severe first (:data:`kvspec.conformance.tiers.TIERS`; a test keeps
the two equal)."""

STRATA: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ownership",
        (
            "STAGE",
            "MODEL",
            "DTYPE-1",
            "CP",
            "HEAD",
            "LAYER",
            "DP",
            "GROUP-1",
            "GROUP-2",
            "STATE-1",
            "BLOCK",
        ),
    ),
    ("routing", ("PLAN", "STATE-2", "WINDOW", "LOCAL", "INDEX", "GROUP-3")),
    ("shipments", ("SLICE", "RESHARD")),
    ("memory", ("LAYOUT", "PAGED", "DESC", "SLAYOUT")),
    ("payload content", ("DTYPE", "ORACLE", "PAYLOAD", "CHUNK", "STREAM")),
    ("naming and wire", ("KEY", "PORT", "WIRE", "LIFE")),
)
"""How basic a clause is: strata from what a rank holds to how bytes are named and
framed, each a tuple of families (``PLAN``) or clauses (``GROUP-3``; a clause entry
wins over its family's). Within a stratum, clause-table order (:mod:`kvspec.core.clauses`).

- *ownership*: what each rank holds: stage ranks, the model and its dtype (``DTYPE-1``),
  token rules, heads, layers, the DP group, layer groups and state parts, block sizes.
  Nothing can be planned over a wrong owner.
- *routing*: who sends what to whom: the plan (``PLAN``) and, per layer group, what an
  edge carries (state reads, windows, local chunks, the indexer, bytes per group).
- *shipments*: what one edge's shipment holds and who cuts it (``SLICE``, ``RESHARD``).
- *memory*: where those bytes sit in a cache: layouts, block tables, descriptors.
- *payload content*: the values themselves and their containers: bit-exact
  comparisons and fp8 scales (``DTYPE-2``, ``DTYPE-3``), the oracle, payload merges,
  chunks, streaming.
- *naming and wire*: keys, ports, the wire format, the handle lifecycle: they carry
  bytes a more basic stratum decided.

The clause table itself is ordered for reading the spec (``DTYPE`` right after
``MODEL``), not by what depends on what; hence an explicit list. A test holds every
clause of the table to exactly one stratum.
"""


OBSERVATIONS: dict[str, str] = {
    "RESHARD-2.2": "a whole assembly in another arrival order compared with the spec's",
    "RESHARD-2.1": "a whole transfer's shards compared with the spec's (the round trip)",
    "PLAN-6.3": "a whole transfer after a request of another length, compared with the spec's",
    "MODEL-2.1": "an MLA latent moved through a whole transfer and compared with the spec's",
    "PLAN-5.1": "the bytes of an edge: any wrong slice, layer range or head beneath changes them",
    "PLAN-5.2": "likewise, receiver-side",
}
"""Obligations whose checks observe a composite result (obligation -> what they observe),
the most direct observer of a wrong assembly first: every wrong fact beneath them fails
them too, so a failure of one of these is read after any failure that names a fact
(:func:`evidence`), and among themselves in this order."""

_WHOLE_TRANSFER_CLAUSES = ("DTYPE-2", "DTYPE-3")
"""Clauses whose checks move data through a whole transfer (special values, fp8 with its
scales): a data difference they report is that transfer observed, as wrong for a
misplaced head or layer as for a value that lost its bits; their scales are a fact."""
_ELEMENTS = re.compile(r"\d+ of \d+ elements differ; first at")

FACT, REFUSAL_TROUBLE, OBSERVATION = 0, 1, 2
""":func:`evidence`'s classes, the strongest first."""


@dataclass(frozen=True)
class Cause:
    """Failures that share one cause: the headline to read first, the rest as its
    consequences (they go away with it, or are seen again once it is fixed)."""

    headline: CheckResult
    consequences: tuple[CheckResult, ...]
    tier: str | None
    """The most severe tier among the cause's failures."""
    reachable_in_serving: str | None
    """``yes`` if serving can reach any of its failures, else ``unknown`` if any may
    be, else ``no`` (None when no failure says)."""
    key: str
    """What identifies the cause across runs: the headline's violated obligation and the
    transfer case (or counterexample) it failed on."""
    reachability_evidence: str = ""
    """Why, from the failure that decided :attr:`reachable_in_serving`."""

    @property
    def results(self) -> tuple[CheckResult, ...]:
        """The headline, then the consequences."""
        return (self.headline, *self.consequences)

    def to_dict(self) -> dict[str, Any]:
        """The ``causes`` entry of the JSON report."""
        return {
            "headline": self.headline.check.id,
            "obligation": violated(self.headline),
            "tier": self.tier,
            "reachable_in_serving": self.reachable_in_serving,
            "reachability_evidence": self.reachability_evidence,
            "counterexample": self.headline.counterexample,
            "key": self.key,
            "consequences": [r.check.id for r in self.consequences],
        }


@cache
def _clause_index() -> dict[str, int]:
    return {cid: i for i, cid in enumerate(all_clauses())}


def clause_of(obligation: str) -> str:
    """The clause of an obligation id (``PLAN-2.3`` -> ``PLAN-2``); a clause id as is."""
    return obligation.split(".", 1)[0]


def stratum(clause: str) -> int:
    """The index in :data:`STRATA` of ``clause`` (or of an obligation's clause);
    ``len(STRATA)`` for one no stratum names."""
    clause = clause_of(clause)
    family = clause.split("-", 1)[0]
    for name in (clause, family):  # a clause entry wins over its family's
        for i, (_, members) in enumerate(STRATA):
            if name in members:
                return i
    return len(STRATA)


def basicness(clause: str) -> tuple[int, int]:
    """Sort key of how basic ``clause`` (or an obligation's clause) is: its stratum, then
    its place in the clause table."""
    clause = clause_of(clause)
    return stratum(clause), _clause_index().get(clause, len(_clause_index()))


def severity(tier: str | None) -> int:
    """Sort key of a tier: 0 for the most severe; unknown or None last."""
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


_REACH_ORDER = ("yes", "unknown", "no")

_CITED = re.compile(r"\[([A-Z]+-[0-9]+\.[0-9]+)")


_OWNERSHIP = re.compile(
    r"owns heads (?P<heads>.+?) and layers (?P<layers>.+?) \[[^\]]*\]; the implementation "
    r"says heads (?P<got_heads>.+?), layers (?P<got_layers>.+)$"
)
"""What an ownership check (checks/ownership.py) says a rank owns, and what it was told."""
_SCALES = re.compile(r": scales (missing|unexpected|\[.*\] != expected \[.*\])$")
"""A tensor comparison (checks/transfer.py ``difference``) whose data shape matched and
whose scales did not."""
_SHAPES = re.compile(
    r"got \S+ \[(?P<got>[0-9, ]+)\], expected \S+ \[(?P<want>[0-9, ]+)\] \(\[layers, kv"
)
"""The same comparison, when the shapes differ."""


def _ownership_mismatch(result: CheckResult) -> tuple[bool, bool] | None:
    """(heads right, layers right) when ``result`` is an ownership check's report of one
    rank; None for any other message."""
    owned = _OWNERSHIP.search(result.reason or "")
    if owned is None:
        return None
    return owned["heads"] == owned["got_heads"], owned["layers"] == owned["got_layers"]


def fact(result: CheckResult) -> str | None:
    """The obligation of the first wrong fact ``result``'s message reports exactly, when
    it reports one more basic than its check's clause (see the module's docstring); else
    None."""
    reason = result.reason or ""
    mismatch = _ownership_mismatch(result)
    if mismatch is not None:
        heads_right, layers_right = mismatch
        example = result.counterexample if isinstance(result.counterexample, dict) else {}
        layout, model = example.get("layout") or {}, example.get("model") or {}
        if heads_right and not layers_right:
            return "LAYER-2.1" if layout.get("layer_partition") else "LAYER-1.1"
        if layers_right and not heads_right and result.check.clause.startswith("STAGE-2"):
            return None  # the heads of a rank's attention group: STAGE-2's own rule
        if layers_right and not heads_right:
            if model.get("attention") == "mla":
                return "HEAD-3.1"
            groups = (layout.get("dp") or 1) * (layout.get("cp") or 1)
            attn_tp = max(1, int(layout.get("tp") or 1) // groups)
            return "HEAD-2.1" if int(model.get("num_kv_heads") or 0) < attn_tp else "HEAD-1.1"
        if not heads_right and not layers_right and not result.check.clause.startswith("STAGE"):
            return "STAGE-1.1"  # every rank's heads and layers: the rank numbering
        return None
    if _SCALES.search(reason):
        return "DTYPE-3.1"
    shapes = _SHAPES.search(reason)
    case = transfer_case(result.counterexample)
    if shapes and case is not None and (case.get("model") or {}).get("attention") == "mla":
        got, want = (shapes[k].split(", ") for k in ("got", "want"))
        if (
            len(got) == len(want) == 5
            and got[1] != want[1]
            and got[:1] + got[2:] == (want[:1] + want[2:])
        ):
            return "MODEL-2.1"  # an MLA shard with a V (or without its latent)
    return None


def violated(result: CheckResult) -> str | None:
    """The obligation ``result`` violated: its :func:`fact`, else its ``obligation``
    attribute, else the first ``[FAM-N.M]`` its message cites that exists, else the
    check's first covered one."""
    found = fact(result) or getattr(result, "obligation", None)
    if found:
        return found
    known = all_obligations()
    for cited in _CITED.findall(result.reason or ""):
        if cited in known:
            return cited
    return next((o for o in result.check.covers if o in known), None)


def tier(result: CheckResult) -> str | None:
    """The tier of a FAILED ``result``: its ``tier`` attribute, else derived from its
    violated obligation (:func:`kvspec.conformance.tiers.tier_of_obligation`; a crash,
    reported as "the implementation raised ...", is ``breaks``)."""
    found = getattr(result, "tier", None)
    if found:
        return found
    if (result.reason or "").startswith("the implementation raised "):
        return "breaks"
    from kvspec.conformance.tiers import tier_of_obligation

    return tier_of_obligation(all_obligations().get(violated(result) or ""))


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


_CASE_DEFAULTS: dict[str, Any] = {"policy": "lowest", "seq_len": None}
_CASE_FIELDS = ("source", "target", "model", "policy", "seq_len", "source_dp", "target_dp")


def transfer_case(counterexample: object) -> dict[str, Any] | None:
    """The transfer case a counterexample holds: the first mapping, depth first, with a
    ``source``, a ``target`` and a ``model``, reduced to the fields of
    :class:`~kvspec.topology.case.TransferCase` (defaults filled in); None if it holds none."""
    stack = [counterexample]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            if all(k in item for k in ("source", "target", "model")):
                case = {k: item.get(k, _CASE_DEFAULTS.get(k)) for k in _CASE_FIELDS}
                for side in ("source_dp", "target_dp"):
                    case[side] = case[side] or 0
                return case
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def _cites_other_clause(result: CheckResult) -> str | None:
    """The clause whose obligation ``result``'s message cites as broken, when it is not
    the check's own clause (a downstream report of an upstream rule); else None."""
    obligation = violated(result)
    if not obligation or (obligation not in (result.reason or "") and not fact(result)):
        return None
    clause = clause_of(obligation)
    return None if clause == result.check.clause else clause


def evidence(result: CheckResult) -> int:
    """How directly a FAILED ``result`` names a wrong fact: :data:`FACT`; else
    :data:`REFUSAL_TROUBLE` when it broke a refusal obligation without letting the input
    through (tier ``breaks``: refused unclearly, or crashed); else :data:`OBSERVATION`
    when its violated obligation is one of :data:`OBSERVATIONS`."""
    obligation = violated(result) or ""
    if fact(result) is not None:
        return FACT
    if obligation in OBSERVATIONS:
        return OBSERVATION
    if result.check.clause in _WHOLE_TRANSFER_CLAUSES and (
        _ELEMENTS.search(result.reason or "") or _SHAPES.search(result.reason or "")
    ):
        return OBSERVATION
    if result.check.clause.startswith("STAGE-2") and _ownership_mismatch(result) == (
        False,
        True,
    ):
        return OBSERVATION  # a group's heads: its mapping, or any head rule beneath it
    known = all_obligations().get(obligation)
    if known is not None and known.kind == "negative" and tier(result) == "breaks":
        return REFUSAL_TROUBLE
    return FACT


def _headline_key(index: int, result: CheckResult) -> tuple[Any, ...]:
    obligation = violated(result) or result.check.clause
    level, place = basicness(obligation)
    own = 0 if clause_of(obligation) == result.check.clause else 1
    strength = evidence(result)
    return strength == REFUSAL_TROUBLE, strength, level, severity(tier(result)), own, place, index


def _observed_order(result: CheckResult) -> int:
    """Where an observation stands among :data:`OBSERVATIONS` (others after them)."""
    order = list(OBSERVATIONS)
    obligation = violated(result) or ""
    return order.index(obligation) if obligation in order else len(order)


def _reachability(results: Iterable[CheckResult]) -> tuple[str | None, str]:
    """The most reachable verdict among ``results`` (yes, unknown, no) and its evidence."""
    judged = [r for r in results if getattr(r, "reachable_in_serving", None) in _REACH_ORDER]
    if not judged:
        return None, ""
    best = min(judged, key=lambda r: _REACH_ORDER.index(r.reachable_in_serving))
    return best.reachable_in_serving, getattr(best, "reachability_evidence", "") or ""


def group(results: Sequence[CheckResult]) -> list[Cause]:
    """The FAILED results of ``results`` grouped by cause (see the module's docstring for
    the links), each under its most basic failure; causes most severe tier first, then
    most basic headline first. Results of other verdicts are ignored."""
    failures = [r for r in results if r.verdict == FAILED]
    parent = list(range(len(failures)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    first_with: dict[tuple[str, str], int] = {}
    for i, r in enumerate(failures):
        keys = [("example", _canonical(r.counterexample))]
        case = transfer_case(r.counterexample)
        if case is not None:
            keys.append(("case", _canonical(case)))
        for key in keys:
            if key in first_with:
                union(i, first_with[key])
            else:
                first_with[key] = i
    for i, r in enumerate(failures):
        upstream = _cites_other_clause(r)
        if upstream is None:
            continue
        for j, other in enumerate(failures):
            if upstream in (other.check.clause, clause_of(violated(other) or "")):
                union(i, j)

    members: dict[int, list[int]] = {}
    for i in range(len(failures)):
        members.setdefault(find(i), []).append(i)
    causes = []
    for indices in members.values():
        ordered = sorted(indices, key=lambda i: _headline_key(i, failures[i]))
        head = failures[ordered[0]]
        group_results = [failures[i] for i in ordered]
        worst = min((tier(r) for r in group_results), key=severity)
        case = transfer_case(head.counterexample)
        where = _canonical(case if case is not None else head.counterexample)
        reach, why_reach = _reachability(group_results)
        causes.append(
            Cause(
                headline=head,
                consequences=tuple(failures[i] for i in sorted(ordered[1:])),
                tier=worst,
                reachable_in_serving=reach,
                key=f"{violated(head) or head.check.clause} on {where}",
                reachability_evidence=why_reach,
            )
        )
    order = {id(r): i for i, r in enumerate(failures)}
    causes.sort(
        key=lambda c: (
            evidence(c.headline) == REFUSAL_TROUBLE,
            severity(c.tier),
            evidence(c.headline),
            _observed_order(c.headline) if evidence(c.headline) == OBSERVATION else 0,
            basicness(violated(c.headline) or c.headline.check.clause),
            order[id(c.headline)],
        )
    )
    return causes


def pytest_name(result: CheckResult) -> str:
    """``test_<clause>_<slug>``, lower case, every other character an underscore:
    ``PLAN-2/exact-cover`` -> ``test_plan_2_exact_cover``."""
    name = re.sub(r"[^0-9a-z]+", "_", f"test_{result.check.clause}_{result.check.slug}".lower())
    name = name.strip("_")
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"test_{name}"


def _example_literal(counterexample: object) -> str:
    """The counterexample as a Python expression: ``json.loads('...')`` of its JSON (so
    any plain data, NaN included, round-trips as the replay reads it)."""
    return f"json.loads({json.dumps(counterexample, separators=(',', ':'))!r})"


def pytest_test(impl: str, result: CheckResult, *, device: str = "cpu") -> str:
    """A paste-ready pytest test (a module on its own, imports included) that replays the
    counterexample of FAILED ``result`` against adapter ``impl`` (``reference`` or
    ``MODULE:ATTR``) and asserts the check no longer fails: it fails today, and passes
    once the implementation is fixed (or once the adapter no longer claims the input:
    a replay outside its declared domain is not a failure)."""
    return "\n".join(
        [
            "import json",
            "",
            "from kvspec.conformance import get_check, load_adapter, run_check",
            "",
            "",
            f"def {pytest_name(result)}():",
            f'    """{result.check.id} on its counterexample [{violated(result) or ""}]: '
            f'{_docstring_safe(result.check.title)}."""',
            *_assignment("example", _example_literal(result.counterexample)),
            "    result = run_check(",
            # json.dumps: double-quoted literals, as ruff format writes them
            f"        get_check({json.dumps(result.check.id)}),",
            f"        load_adapter({json.dumps(impl)}),",
            "        replay=example,",
            *([f"        device={json.dumps(device)},"] if device != "cpu" else []),
            "    )",
            '    assert result.verdict != "FAILED", result.reason',
            "",
        ]
    )


def _assignment(name: str, literal: str, width: int = 88) -> list[str]:
    """``name = literal`` in a function body, split inside the call's parentheses the way
    ``ruff format`` (and black) would at their default width, so a pasted test is clean."""
    line = f"    {name} = {literal}"
    if len(line) <= width or not literal.endswith(")") or "(" not in literal:
        return [line]
    call, _, argument = literal.partition("(")
    return [f"    {name} = {call}(", f"        {argument[:-1]}", "    )"]


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', "'''")


def hypothesis_example(result: CheckResult) -> str | None:
    """The ``@example(...)`` line that pins ``result``'s counterexample on a test drawing
    from the check's strategy (``@given(get_check(ID).strategy(adapter))``); it needs
    ``import json`` and ``from hypothesis import example``. None when the result has no
    counterexample (nothing failed)."""
    if result.counterexample is None:
        return None
    return f"@example({_example_literal(result.counterexample)})"


def _one_line(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render_causes(impl: str, causes: Sequence[Cause]) -> list[str]:
    """The report's lines for ``causes``: per cause a headline line (tier, check,
    violated obligation, reachability), the rule, the counterexample, what happened, how
    to reproduce it (shell, Python, a pytest test), then its consequences, one line each."""
    from kvspec.conformance.reproduction import python_reproduction, reproduction
    from kvspec.core.clauses import get_clause, get_obligation

    lines: list[str] = []
    for n, cause in enumerate(causes, 1):
        head = cause.headline
        obligation = violated(head)
        clause = get_clause(head.check.clause)
        evidence = cause.reachability_evidence
        lines += [
            "",
            f"cause {n} of {len(causes)}: {cause.tier or 'untiered'}  {head.check.id}"
            f"  [{obligation or '?'}]  reachable in serving: "
            f"{cause.reachable_in_serving or 'not judged'}"
            + (f" ({_one_line(evidence, 120)})" if evidence else ""),
            f"  rule: {clause.id} {clause.title}: {clause.text}",
        ]
        if obligation and clause_of(obligation) != head.check.clause:
            lines.append(f"  broken: {obligation}: {get_obligation(obligation).text}")
        accepted = getattr(head, "accepted_input", None)
        lines += [
            f"  counterexample: {json.dumps(head.counterexample)}",
            *(
                [f"  wrongly accepted: {json.dumps(accepted, default=repr)}"]
                if accepted is not None
                else []
            ),
            f"  what happened: {head.reason}",
            f"  reproduce: {reproduction(impl, head)}",
            f"  or in Python: {python_reproduction(impl, head)}",
            "  as a pytest test:",
            *[f"    {line}" if line else "" for line in pytest_test(impl, head).splitlines()],
        ]
        if cause.consequences:
            lines.append(f"  consequences (same cause): {len(cause.consequences)}")
            lines += [
                f"    {r.check.id}  {tier(r) or 'untiered'}  [{violated(r) or '?'}]: "
                f"{_one_line(r.reason)}"
                for r in cause.consequences
            ]
    return lines
