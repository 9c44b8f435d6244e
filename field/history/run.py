"""Run kvspec on both releases of every bug of the historical corpus (field/history/).

usage: python field/history/run.py [--corpus DIR] [--engines DIR] [--out DIR]
                                   [--kvspec PATH] [--profile NAME] [BUG ...]

For each bug (field/history/bugs/ID.json, the schema in field/history/README.md) whose
entry names an adapter, and for each of its two releases (``buggy``, ``fixed``), the
runner runs what `make field` runs for a current engine, with that release's package
directory (``.venv-field/engines/REQUIREMENTS``, built by field/setup.sh from
field/history/requirements/REQUIREMENTS.txt) first on PYTHONPATH:

- ``kvspec conform ADAPTER --check PATTERN ... --profile PROFILE --json OUT/ID.SIDE.json``,
  the checks the entry names (a bug is met by a few clauses; the rest of the suite is the
  field run's business);
- for each of the entry's replays (the deployment the thread reported),
  ``kvspec conform ADAPTER --check CHECK --replay EXAMPLE --json OUT/ID.SIDE.replay-N.json``.

It records each command's exit status and time in OUT/run.json and judges nothing: the
verdicts (caught, missed, not run) are the report builder's (`python -m field.report`,
field/report/history.py), from these reports and the corpus. A bug with no
adapter is not run (its entry says why). Exit status 0 when every run produced its report,
1 when one could not (an adapter that does not load, a timeout): the report says which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIDES = ("buggy", "fixed")
CONFORM_TIMEOUT = 900  # seconds for one `kvspec conform` (the ci profile on a 2-core box)


def load_bugs(corpus: Path, only: list[str]) -> list[dict[str, Any]]:
    """The corpus entries, by id, restricted to ``only`` when given (unknown ids refused)."""
    bugs = {p.stem: json.loads(p.read_text()) for p in sorted(corpus.glob("*.json"))}
    unknown = sorted(set(only) - set(bugs))
    if unknown:
        raise SystemExit(f"field/history/run.py: no bug {unknown} in {corpus} (has {sorted(bugs)})")
    return [bugs[k] for k in (only or sorted(bugs))]


def conform_commands(
    bug: dict[str, Any], side: str, *, kvspec: str, profile: str, out: Path
) -> list[tuple[str, list[str]]]:
    """(report path, command) for the bug's checks on one release, then each replay."""
    spec = bug["kvspec"]
    adapter = bug[side].get("adapter") or spec["adapter"]
    report = out / f"{bug['id']}.{side}.json"
    search = [kvspec, "conform", adapter, "--profile", profile, "--quiet", "--json", str(report)]
    for pattern in spec["checks"]:
        search += ["--check", pattern]
    commands = [(str(report), search)]
    for n, replay in enumerate(spec.get("replays", []), 1):
        path = out / f"{bug['id']}.{side}.replay-{n}.json"
        commands.append(
            (
                str(path),
                [
                    *(kvspec, "conform", adapter, "--check", replay["check"], "--quiet"),
                    *("--replay", json.dumps(replay["example"]), "--json", str(path)),
                ],
            )
        )
    return commands


def run_side(
    bug: dict[str, Any], side: str, *, engines: Path, kvspec: str, profile: str, out: Path
) -> dict[str, Any]:
    """Run one release's commands; what each exited with, how long it took, and the tail of
    its log when it produced no report."""
    engine_dir = engines / bug[side]["requirements"]
    record: dict[str, Any] = {"release": bug[side]["release"], "runs": []}
    if not engine_dir.is_dir():
        record["error"] = (
            f"{engine_dir} is not installed (FIELD_REQUIREMENTS=field/history/requirements "
            f"field/setup.sh {bug[side]['requirements']})"
        )
        return record
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engine_dir), os.getcwd()])}
    log = out / f"{bug['id']}.{side}.log"
    with log.open("w") as sink:
        for report, command in conform_commands(bug, side, kvspec=kvspec, profile=profile, out=out):
            Path(report).unlink(missing_ok=True)
            started = time.monotonic()
            try:
                rc = subprocess.run(
                    command,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    timeout=CONFORM_TIMEOUT,
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
            run = {"report": report, "exit": rc, "seconds": round(time.monotonic() - started, 1)}
            if not Path(report).exists():
                sink.flush()
                run["error"] = _tail(log)
            record["runs"].append(run)
    return record


def _tail(log: Path, lines: int = 4) -> str:
    """The last lines of a log, for the report (engines print a lot before the error)."""
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bugs", nargs="*", help="bug ids (default: the whole corpus)")
    parser.add_argument("--corpus", default="field/history/bugs")
    parser.add_argument("--engines", default=".venv-field/engines")
    parser.add_argument("--out", default="reports/field/history")
    parser.add_argument("--kvspec", default=".venv-field/bin/kvspec")
    parser.add_argument("--profile", default=os.environ.get("PROFILE", "ci"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {}
    for bug in load_bugs(Path(args.corpus), args.bugs):
        if not bug["kvspec"].get("adapter"):
            results[bug["id"]] = {"not_run": bug["kvspec"]["not_run"]}
            continue
        print(f"field history: {bug['id']}", file=sys.stderr)
        results[bug["id"]] = {
            side: run_side(
                bug,
                side,
                engines=Path(args.engines),
                kvspec=args.kvspec,
                profile=args.profile,
                out=out,
            )
            for side in SIDES
        }
    seconds = round(time.monotonic() - started, 1)
    summary = {"profile": args.profile, "seconds": seconds, "bugs": results}
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    failed = [
        f"{bug} {side}"
        for bug, sides in results.items()
        for side, record in sides.items()
        if side in SIDES and (record.get("error") or any("error" in r for r in record["runs"]))
    ]
    for line in failed:
        print(f"field history: {line} produced no report (see {out}/run.json)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
