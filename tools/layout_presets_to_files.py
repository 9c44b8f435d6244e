"""Write kvspec's layout presets as layout files (issue 33): one JSON file per preset.

Run once, when the presets moved from Python tables (``kvspec/memory/presets.py`` at
fc2919a) into files; kept so that the step can be repeated and read:

    PYTHONPATH=. python tools/layout_presets_to_files.py kvspec/memory/layouts

It writes ``presets/NAME.json`` for every cache and state layout preset and ``index.json``,
the order they are listed in. It reads whatever :mod:`kvspec.memory.presets` holds, so
after the move it rewrites the files from themselves (a no-op unless the writer changed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvspec.memory.layout_files import dumps
from kvspec.memory.layout_model import CacheLayout, StateCacheLayout
from kvspec.memory.presets import LAYOUT_PRESETS, STATE_LAYOUT_PRESETS


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    presets = root / "presets"
    presets.mkdir(parents=True, exist_ok=True)
    every: list[CacheLayout | StateCacheLayout] = [*LAYOUT_PRESETS, *STATE_LAYOUT_PRESETS]
    for layout in every:
        (presets / f"{layout.name}.json").write_text(dumps(layout), encoding="utf-8")
    index = {
        "_note": "The order presets are listed in (kvspec layouts, detection candidates, "
        "golden vectors); each name is presets/NAME.json. Adding a preset is adding its "
        "file and its name here, where it belongs.",
        "layouts": [layout.name for layout in LAYOUT_PRESETS],
        "state_layouts": [layout.name for layout in STATE_LAYOUT_PRESETS],
    }
    (root / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(LAYOUT_PRESETS) + len(STATE_LAYOUT_PRESETS)} layout files under {presets}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
