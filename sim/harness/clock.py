"""When this process started, so a command's report shows the wall time ``time`` does.

A run's own clock starts when it starts its ranks; by then the interpreter has started
and imported torch, which is most of a short run's wall time. The kernel knows when the
process began: on Linux, field 22 of ``/proc/self/stat`` in clock ticks since boot.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_age() -> float | None:
    """Seconds since this process started, to a clock tick (10 ms, usually), on the boot
    clock the kernel counts it by (so no step of the wall clock moves it); None where
    ``/proc`` cannot say (not Linux, no ``/proc``)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # after "(comm)", which may hold spaces, field 3 comes first: starttime is 19 on
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None


def process_start() -> float | None:
    """``time.time()`` when this process started, to a clock tick; None where ``/proc``
    cannot say. The wall clock as it reads now: a step of it since the start moves this."""
    age = process_age()
    return None if age is None else time.time() - age
