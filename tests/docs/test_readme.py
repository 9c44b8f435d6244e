"""The README's examples are true: its Python blocks run and its console transcripts match."""

import re
import shlex

import pytest

from kvspec.cli import main
from sim.cli import main as sim_main
from tests.paths import ROOT

README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README) if lang == language]


def _transcripts() -> list[tuple[str, list[str]]]:
    """(command, shown output lines) for every `$ .venv/bin/...` line of a console block."""
    found = []
    for body in _blocks("console"):
        current: tuple[str, list[str]] | None = None
        for line in body.splitlines():
            if line.startswith("$ "):
                current = (line[2:], [])
                found.append(current)
            elif current is not None:
                current[1].append(line)
    return found


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's reader runs its blocks from the checkout's root (`examples` is found there).
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    exec(compile(_blocks("python")[index], f"README.md python block {index}", "exec"), {})


@pytest.mark.parametrize(("command", "shown"), _transcripts(), ids=lambda v: str(v)[:60])
def test_console_transcript(
    command: str, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(command, comments=True)
    if words[:3] == [".venv/bin/python", "-m", "sim"]:
        code = sim_main(words[3:])
    else:
        assert words[0] == ".venv/bin/kvspec", f"README runs only kvspec and sim: {command}"
        code = main(words[1:])
    out, err = capsys.readouterr()
    annotated = re.search(r"exit (\d+)", command)
    expected_code = int(annotated.group(1)) if annotated else 0
    assert code == expected_code
    printed = (out + err).splitlines()
    for line in shown:
        if line == "...":
            continue
        # "..." inside a shown line stands for text that varies from run to run
        pattern = re.compile(".*?".join(re.escape(part) for part in line.split("...")))
        assert any(pattern.fullmatch(p) for p in printed), line


def test_readme_shows_the_example_adapter_verbatim() -> None:
    adapter = (ROOT / "examples" / "field_adapter.py").read_text()
    assert adapter in _blocks("python")
