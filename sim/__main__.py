"""``python -m sim`` runs the simulated cluster (see ``python -m sim run --help``)."""

import os
import sys

from sim.cli import main

code = main()
if code == 130:
    # Ctrl-C: every rank is already stopped and reaped and the report is printed; skip
    # the interpreter's teardown (most of a second with torch loaded) so the run ends
    # within a second of the keypress.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
