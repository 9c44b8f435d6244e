"""Replay the targeted examples of one engine and print their verdicts as JSON.

usage: python field/replays.py ENGINE OUT.json   (engines log to stdout, so not there)

field/replays/ENGINE.json lists examples that the random search under the `ci` profile
does not reach first (a check stops at its first failure), each with why it matters and,
once triaged, the defect or kvspec issue it shows. Run in .venv-field with the engine's
package directory on PYTHONPATH (field/run.sh does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvspec.conformance import get_check, load_adapter, run_check
from kvspec.testing.profiles import load_profile


def main(engine: str, out_path: str) -> int:
    entries = json.loads(Path(f"field/replays/{engine}.json").read_text())
    load_profile("ci")
    adapter = load_adapter(engine)
    out = []
    for entry in entries:
        result = run_check(get_check(entry["check"]), adapter, replay=entry["example"])
        out.append(
            {
                **{k: v for k, v in entry.items() if k != "example"},
                "example": entry["example"],
                "verdict": result.verdict,
                "reason": result.reason,
            }
        )
    Path(out_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
