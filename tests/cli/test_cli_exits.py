"""Both command lines end cleanly when stopped from outside: Ctrl-C, or a reader that
closes the pipe (``kvspec conform --list | head``) — an exit status, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvspec.console.exits import INTERRUPTED, READER_GONE, run_to_exit
from tests.paths import ROOT

# argparse prints --help itself and, from Python 3.11, drops an OSError while doing so,
# then exits 0; before that the broken pipe reaches run_to_exit. Quiet either way.
HELP_ENDS = {0, READER_GONE}


@pytest.mark.parametrize(
    ("argv", "statuses"),
    [
        (["-m", "kvspec", "conform", "--list"], {READER_GONE}),
        (
            ["-m", "kvspec", "plan", "--source-tp", "8", "--target-tp", "2", "--kv-heads", "8"],
            {READER_GONE},
        ),
        (["-m", "kvspec", "--help"], HELP_ENDS),
        (["-m", "sim", "run", "--help"], HELP_ENDS),
    ],
    ids=["conform --list", "kvspec plan", "kvspec --help", "sim run --help"],
)
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(
    argv: list[str], statuses: set[int]
) -> None:
    """The reader is gone before the first byte is written, as with ``| head`` after the
    lines it wanted: exit 141 (128 + SIGPIPE) and nothing on standard error, also when
    the output is still in Python's buffer when the command returns."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a user's
    child = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child has imported anything, let alone written
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) in statuses, stderr
    assert stderr == ""


def test_ctrl_c_gives_130_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def run() -> int:
        raise KeyboardInterrupt

    assert run_to_exit(run, "kvspec") == INTERRUPTED == 130
    assert capsys.readouterr().err == "\nkvspec: interrupted (Ctrl-C)\n"


def test_a_finished_command_keeps_its_status_and_usage_errors_pass_through() -> None:
    assert run_to_exit(lambda: 3, "kvspec") == 3

    def usage() -> int:
        raise SystemExit(2)

    with pytest.raises(SystemExit) as exited:
        run_to_exit(usage, "kvspec")
    assert exited.value.code == 2
