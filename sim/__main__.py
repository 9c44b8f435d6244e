"""``python -m sim`` runs the simulated cluster (see ``python -m sim run --help``)."""

import time

ENTERED = time.time()  # before torch is imported: the start, where /proc cannot say

import os  # noqa: E402
import sys  # noqa: E402

try:  # torch loads here, for seconds: Ctrl-C in that time ends the run as any other does
    from sim.cli import main
    from sim.harness.clock import process_start
except KeyboardInterrupt:
    print("\npython -m sim: interrupted (Ctrl-C) while starting", file=sys.stderr)
    os._exit(130)  # nothing started yet; the interpreter's teardown would cost a second

started = process_start()
code = main(
    started=(started, "the process's start")
    if started is not None
    else (ENTERED, "python -m sim starting")
)
if code == 130:
    # Ctrl-C: every rank is already stopped and reaped and the report is printed; skip
    # the interpreter's teardown (most of a second with torch loaded) so the run ends
    # within a second of the keypress.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
