"""The report in markdown: what ``kvspec conform --markdown PATH`` writes, a CI job summary.

GitHub shows a job's ``$GITHUB_STEP_SUMMARY`` file on the run's page; the repository's
``action.yml`` points ``--markdown`` at it. The content is the screen-sized report's
(:mod:`kvspec.conformance.brief`): the verdict and the exit status first, the failures by
tier as a table (which tiers fail the exit status), each cause with its counterexample,
replay and paste-ready pytest test folded under a ``<details>``, one row per family not
run, and the same last line saying what set the exit status.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kvspec.conformance.brief import exit_line, family_lines
from kvspec.conformance.result import FAILED, INCONCLUSIVE, NOT_PROVIDED, PASSED, SKIPPED

if TYPE_CHECKING:
    from kvspec.conformance.runner import Report


def _cell(text: str) -> str:
    """Text safe inside a table cell: no pipe, no line break."""
    return " ".join(text.split()).replace("|", "\\|")


def _fenced(language: str, text: str) -> list[str]:
    fence = "````" if "```" in text else "```"
    return [f"{fence}{language}", text, fence]


def render_markdown(report: Report) -> str:
    """The job summary of ``report`` (see the module's docstring)."""
    from kvspec.conformance.causes import group, pytest_test, tier, violated
    from kvspec.conformance.reproduction import reproduction
    from kvspec.conformance.runner import adapter_label
    from kvspec.core.clauses import get_clause

    code = report.exit_code
    verdict = {0: "passed", 1: "failed", 3: "inconclusive"}.get(code, f"exit {code}")
    lines = [
        f"## kvspec conform `{report.impl}`: {verdict} (exit status {code})",
        "",
        f"{adapter_label(report.adapter)}, profile {report.profile}, device {report.device}: "
        f"{report.count(PASSED)} passed, {report.count(FAILED)} failed, "
        f"{report.count(INCONCLUSIVE)} inconclusive, {report.count(NOT_PROVIDED)} not "
        f"provided, {report.count(SKIPPED)} skipped in {report.seconds:.1f} s",
        "",
        "| tier | failures | fails the exit status (--fail-on) |",
        "|---|---:|---|",
        *[
            f"| {t} | {n} | {'yes' if t in report.failing_tiers else 'no'} |"
            for t, n in report.summary_by_tier().items()
        ],
    ]
    causes = group(report.results) if report.failed else []
    if causes:
        lines += ["", "### Causes, most severe and most basic first"]
    for n, cause in enumerate(causes, 1):
        head = cause.headline
        lines += [
            "",
            f"**{n}. {cause.tier or 'untiered'}: `{head.check.id}`** "
            f"[{violated(head) or '?'}], reachable in serving: "
            f"{cause.reachable_in_serving or 'not judged'}",
            "",
            f"{head.check.clause} {get_clause(head.check.clause).title}: {head.check.title}. "
            f"What happened: {_cell(head.reason)}",
        ]
        if cause.consequences:
            named = ", ".join(f"`{r.check.id}` ({tier(r)})" for r in cause.consequences)
            lines += ["", f"Consequences of the same cause: {named}"]
        lines += [
            "",
            "<details><summary>counterexample, replay, pytest test</summary>",
            "",
            *_fenced("json", json.dumps(head.counterexample, indent=1)),
            "",
            *_fenced("console", reproduction(report.impl, head)),
            "",
            *_fenced("python", pytest_test(report.impl, head, device=report.device).rstrip()),
            "",
            "</details>",
        ]
    families = family_lines(report)
    if families:
        lines += ["", "### Not run or inconclusive"]
        for line in families:  # "", a section's title, then its families indented
            if line.startswith("  "):
                lines.append(f"- {_cell(line)}")
            else:
                lines += [line] + ([""] if line else [])
    lines += ["", f"**{exit_line(report)}**"]
    return "\n".join(lines)
