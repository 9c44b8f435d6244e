"""The report that fits a screen: what ``kvspec conform IMPL`` prints by default (issue 43).

A run of some 140 checks on a small adapter used to print one line per check, then every
failure, then every check not run with its reason: a one-failure run was some 300 lines,
its only cause block in the middle, and the last screen said nothing of the failure.
:func:`render_brief` prints, in this order:

1. one header line (the implementation, profile, device) and one summary line: the
   failures by tier and the verdict counts;
2. each cause (:func:`kvspec.conformance.causes.group`): its headline check, tier and
   violated obligation, the rule's title, the minimal counterexample, what happened, the
   replay command and the paste-ready pytest test; its consequences on one line;
3. one line per family for the checks that did not run (not provided, skipped) or were
   inconclusive, saying what they need;
4. the checks whose refusals were unclear (refused, but naming none of the offending
   values): a quality note, never a failure (:func:`note_lines`);
5. a last line saying what set the exit status and why (:func:`exit_line`).

``kvspec conform --verbose`` prints today's full listing instead
(:func:`kvspec.conformance.runner.render`). Pure text over a finished
:class:`~kvspec.conformance.runner.Report`; nothing here runs a check.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.conformance.adapter import provided_capabilities
from kvspec.conformance.result import (
    FAILED,
    INCONCLUSIVE,
    NOT_PROVIDED,
    PASSED,
    SKIPPED,
    CheckResult,
)

if TYPE_CHECKING:
    from kvspec.conformance.causes import Cause
    from kvspec.conformance.runner import Report

WIDTH = 160
"""The widest a line of prose is shown (a counterexample, the replay and the pytest test
are shown whole: they are pasted, not read)."""


def _short(text: str, width: int = WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def summary_line(report: Report) -> str:
    """``by tier: corrupts 1, breaks 0, accepts-invalid 0, differs 0; 120 passed, 1 failed,
    ... in 41.2 s``: the failures by tier, then every verdict's count."""
    counts = report.summary_by_tier()
    return (
        "by tier: "
        + ", ".join(f"{t} {n}" for t, n in counts.items())
        + f"; {report.count(PASSED)} passed, {report.count(FAILED)} failed, "
        f"{report.count(INCONCLUSIVE)} inconclusive, {report.count(NOT_PROVIDED)} not "
        f"provided, {report.count(SKIPPED)} skipped in {report.seconds:.1f} s"
    )


def cause_lines(impl: str, causes: Sequence[Cause], *, device: str = "cpu") -> list[str]:
    """Per cause: the headline (tier, check, obligation, reachability), the rule, the
    counterexample (and the input wrongly accepted), what happened, the replay and the
    pytest test; its consequences as one line."""
    from kvspec.conformance.causes import pytest_test, tier, violated
    from kvspec.conformance.reproduction import reproduction
    from kvspec.core.clauses import get_clause

    lines: list[str] = []
    for n, cause in enumerate(causes, 1):
        head = cause.headline
        evidence = cause.reachability_evidence
        accepted = getattr(head, "accepted_input", None)
        lines += [
            "",
            f"cause {n} of {len(causes)}: {cause.tier or 'untiered'}  {head.check.id}"
            f"  [{violated(head) or '?'}]  reachable in serving: "
            f"{cause.reachable_in_serving or 'not judged'}"
            + (f" ({_short(evidence, 100)})" if evidence else ""),
            f"  rule: {head.check.clause} {get_clause(head.check.clause).title}: "
            f"{head.check.title}",
            f"  counterexample: {json.dumps(head.counterexample)}",
            *(
                [f"  wrongly accepted: {json.dumps(accepted, default=repr)}"]
                if accepted is not None
                else []
            ),
            f"  what happened: {_short(head.reason, 400)}",
            f"  reproduce: {reproduction(impl, head)}",
            "  as a pytest test:",
            *[
                f"    {line}" if line else ""
                for line in pytest_test(impl, head, device=device).splitlines()
            ],
        ]
        if cause.consequences:
            named = ", ".join(f"{r.check.id} ({tier(r)})" for r in cause.consequences)
            lines.append(
                "  "
                + _short(
                    f"consequences (same cause, --verbose shows each): "
                    f"{len(cause.consequences)}: {named}",
                    WIDTH - 2,
                )
            )
    return lines


def _lacking(results: Sequence[CheckResult], provided: set[str]) -> str:
    """What a family's checks that did not run lack: the capabilities they need and the
    adapter does not provide, then any other reason they gave (a domain without CP)."""
    missing = sorted({n for r in results for n in r.check.needs} - provided)
    others = sorted({r.reason for r in results if not set(r.check.needs) - provided and r.reason})
    return "; ".join(
        ([f"needs {', '.join(missing)}"] if missing else []) + [_short(o, 80) for o in others]
    )


def family_lines(report: Report) -> list[str]:
    """One line per family for its checks not provided, skipped or inconclusive: how many,
    and what they lack (capabilities, the skips file's reason, too few examples)."""
    provided = provided_capabilities(report.adapter)
    sections = (
        (NOT_PROVIDED, "not provided (what each check needs: kvspec conform --list)"),
        (SKIPPED, "skipped (the skips file)"),
        (INCONCLUSIVE, "inconclusive (too few examples inside the declared domain)"),
    )
    lines: list[str] = []
    for verdict, title in sections:
        by_family: dict[str, list[CheckResult]] = {}
        for r in report.results:
            if r.verdict == verdict:
                by_family.setdefault(r.check.clause.split("-", 1)[0], []).append(r)
        if not by_family:
            continue
        total = sum(map(len, by_family.values()))
        lines += ["", f"{title}: {total} check(s)"]
        for family, results in by_family.items():
            if verdict == NOT_PROVIDED:
                detail = _lacking(results, provided)
            elif verdict == SKIPPED:
                detail = "; ".join(sorted({r.reason for r in results}))
            else:
                detail = ", ".join(r.check.id for r in results)
            lines.append("  " + _short(f"{family}: {len(results)}: {detail}", WIDTH - 2))
    return lines


def note_lines(report: Report) -> list[str]:
    """The checks with an ``unclear`` refusal: how many, then one line each with its
    first note (refused, but the message names none of the offending values)."""
    noted = [r for r in report.results if r.notes]
    if not noted:
        return []
    lines = [
        "",
        f"unclear refusals (refused, naming none of the offending values; not failures): "
        f"{len(noted)} check(s)",
    ]
    lines += ["  " + _short(f"{r.check.id}: {r.notes[0]}", WIDTH - 2) for r in noted[:5]]
    if len(noted) > 5:
        lines.append(f"  ... and {len(noted) - 5} more (--verbose or --json lists them)")
    return lines


def exit_line(report: Report) -> str:
    """What set the exit status and why: the failures in a ``--fail-on`` tier that serving
    may reach (status 1), else the inconclusive checks (3), else nothing (0), with what
    was reported without failing it."""
    tiers = ",".join(report.failing_tiers)
    failing = report.failing()
    code = report.exit_code
    if failing:
        shown = ", ".join(f"{r.check.id} ({r.tier})" for r in failing[:3])
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        return _short(
            f"exit status {code}: {len(failing)} failure(s) in a --fail-on tier "
            f"({tiers}) that serving may reach: {shown}{more}",
            240,
        )
    failed = [r for r in report.results if r.verdict == FAILED]
    unreachable = [r for r in failed if (r.tier or "breaks") in report.failing_tiers]
    notes = []
    if len(failed) > len(unreachable):
        other = sorted({r.tier or "breaks" for r in failed} - set(report.failing_tiers))
        notes.append(
            f"{len(failed) - len(unreachable)} failure(s) of tiers not in --fail-on "
            f"({', '.join(other)}) reported, not failing"
        )
    if unreachable:
        notes.append(f"{len(unreachable)} failure(s) serving never reaches")
    if code == 3:
        unsure = [r.check.id for r in report.results if r.verdict == INCONCLUSIVE]
        reason = (
            f"nothing failed in --fail-on {tiers}, but {len(unsure)} check(s) were "
            f"inconclusive ({', '.join(unsure[:3])}{', ...' if len(unsure) > 3 else ''})"
        )
    else:
        reason = f"nothing failed in --fail-on {tiers}"
    return _short(f"exit status {code}: {reason}" + (f"; {'; '.join(notes)}" if notes else ""), 240)


def render_brief(report: Report) -> str:
    """The screen-sized report (see the module's docstring)."""
    from kvspec.conformance.runner import adapter_label

    lines = [
        f"kvspec conform: {report.impl} ({adapter_label(report.adapter)}), "
        f"profile {report.profile}, device {report.device}",
        summary_line(report),
    ]
    if report.failed:
        from kvspec.conformance.causes import group

        lines += cause_lines(report.impl, group(report.results), device=report.device)
    lines += family_lines(report)
    lines += note_lines(report)
    lines += ["", exit_line(report)]
    return "\n".join(lines)
