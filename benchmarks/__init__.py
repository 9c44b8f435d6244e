"""kvspec's benchmarks: figures measured against a baseline taken in the same run.

Each benchmark module listed in :data:`benchmarks.__main__.BENCHMARKS` exposes
``run(quick: bool) -> list[Figure]``. Speeds are always reported with a baseline
(a plain memory copy of the same bytes, raw pyzmq for the same bytes) measured in the
same process and run, and the ratio baseline_time / measured_time — never as a
timed unit test.
"""
