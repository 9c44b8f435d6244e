"""A result that cannot be written (a full disk) ends a command with its verdict
printed, one line naming the file and the reason, exit status 74 (``OUTPUT_FAILED``)
and no partial file: ``--json`` and ``--markdown`` files are written atomically."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import main as kvspec_main
from kvspec.console.exits import OUTPUT_FAILED, run_to_exit
from kvspec.console.output import OutputFailed, write_json, write_text
from tests.paths import ROOT

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this host")
PLAN = ["plan", "--source-tp", "2", "--target-tp", "1", "--kv-heads", "2"]


def disk_fills_on_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills up once the text is written: the sync of the data fails."""

    def full(_descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_full_disk_leaves_the_old_file_whole_and_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    report.write_text('{"old": true}\n')
    disk_fills_on_sync(monkeypatch)
    with pytest.raises(OutputFailed, match=r"could not write .*report\.json: No space left"):
        write_json(str(report), {"new": list(range(1000))})
    assert report.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_full_disk_leaves_no_new_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk_fills_on_sync(monkeypatch)
    with pytest.raises(OutputFailed):
        write_text(str(tmp_path / "new.json"), "{}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_write_keeps_the_files_mode_and_follows_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(str(link), "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_device_is_written_in_place_never_replaced() -> None:
    """``--json /dev/null`` is an idiom; renaming a file over it would replace the device."""
    write_text(os.devnull, "{}\n")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_failed_write_is_one_line_and_its_own_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def command() -> int:
        print("verdict: every request verified")
        raise OutputFailed("out.json", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    assert run_to_exit(command, "kvspec") == OUTPUT_FAILED == 74
    out, err = capsys.readouterr()
    assert out == "verdict: every request verified\n"
    left = "out.json was left as it was"
    assert err == f"kvspec: could not write out.json: No space left on device; {left}\n"


def test_conform_prints_its_verdict_then_fails_on_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "conform.json"
    disk_fills_on_sync(monkeypatch)
    argv = ["conform", "reference", "--clause", "PORT-1", "--profile", "quick"]
    assert kvspec_main([*argv, "--json", str(report)]) == OUTPUT_FAILED
    out, err = capsys.readouterr()
    assert "exit status 0: nothing failed" in out  # the verdict came first
    assert err.strip().splitlines() == [
        f"kvspec: could not write {report}: No space left on device; {report} was left as it was"
    ]
    assert list(tmp_path.iterdir()) == []


@needs_dev_full
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "kvspec", *PLAN, "--json", str(FULL)],
        ["-m", "sim", "run", *PLAN[1:], "--ports", "os", "--quiet", "--json", str(FULL)],
    ],
    ids=["kvspec plan", "sim run"],
)
def test_a_full_device_after_the_verdict(argv: list[str]) -> None:
    done = run(*argv)
    assert done.returncode == OUTPUT_FAILED, done.stderr
    assert done.stdout.strip(), "the verdict is printed before the write"
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(
        f"could not write {FULL}: No space left on device; {FULL} was left as it was"
    )
    assert "Traceback" not in done.stderr


@needs_dev_full
@pytest.mark.parametrize("json", [[], ["--json", "-"]], ids=["text", "json"])
def test_standard_output_on_a_full_device(json: list[str]) -> None:
    with FULL.open("w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "kvspec", *PLAN, *json],
            cwd=ROOT,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert done.returncode == OUTPUT_FAILED
    assert done.stderr == "kvspec: could not write standard output: No space left on device\n"
