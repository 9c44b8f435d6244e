"""Every parser of a user's file or option only refuses (issue 45): for any input it returns
its value or raises the documented error with one line naming the input, never another
exception (a ``RecursionError`` from deep nesting, a ``TypeError`` from a value of the
wrong kind, a ``ValueError`` from converting a thousand-digit number).

Fuzzed here: the JSON reader every parser shares (:mod:`kvspec.core.untrusted_input`), the
skips file, ``kvspec conform --replay``'s text and ``kvspec desc --check``'s list (the
layout files have their own, ``tests/spec/test_layout_file_fuzz.py``; ``--faults``,
``tests/sim/test_faults_fuzz.py``). ``KVSPEC_FUZZ_EXAMPLES`` raises the count
(``make fuzz`` runs ``10**5`` of each); ``make test`` runs a sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvspec.cli import desc as desc_cli
from kvspec.cli import main
from kvspec.conformance.skips import read_skips
from kvspec.core.untrusted_input import InputRefused, loads
from kvspec.memory.descriptors import judge_descriptors

EXAMPLES = int(os.environ.get("KVSPEC_FUZZ_EXAMPLES", 0)) or 2 * settings.default.max_examples
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_JSON_PIECES = st.sampled_from(
    ["[", "]", "{", "}", '"', "\\", ",", ":", "1", "-", "e9", "0" * 40, "NaN", "Infinity",
     "true", "null", '"a"', "\u0663", "\x00", " ", "\ud800"]
)  # fmt: skip


@st.composite
def hostile_json(draw: st.DrawFn) -> str:
    """Text near JSON: pieces of its grammar in any order, or thousands of open brackets."""
    if draw(st.booleans()):
        depth = draw(st.integers(min_value=1, max_value=20_000))
        opener = draw(st.sampled_from(["[", '{"a":', "[{"]))
        return opener * depth + draw(st.text(max_size=5))
    return "".join(draw(st.lists(_JSON_PIECES | st.text(max_size=3), max_size=60)))


@FUZZ
@given(hostile_json(), st.integers(min_value=1, max_value=64))
def test_the_shared_json_reader_returns_a_value_or_refuses(text: str, depth: int) -> None:
    try:
        value = loads(text, max_depth=depth)
    except InputRefused as refusal:
        assert "\n" not in str(refusal)
    else:
        assert value == json.loads(text)  # what it accepts, it reads as the standard parser


def test_the_shared_json_reader_refuses_each_kind_of_trouble_naming_it() -> None:
    cases = {
        "[" * 5000: "nests arrays or objects more than 8 deep",
        '{"a": [1, NaN]}': "NaN is not a JSON number",
        "[" + "7" * 40 + "]": "has 40 digits; at most 32",
        b"[\xff]": "is not UTF-8 text",
        "[1,": "is not JSON",
    }
    for text, why in cases.items():
        with pytest.raises(InputRefused, match=why):
            loads(text, max_depth=8)
    assert loads('["[[[[[[[[[[", {"}": 1}]', max_depth=2) == ["[[[[[[[[[[", {"}": 1}]


_SKIP_LINES = st.one_of(
    st.sampled_from(["PLAN-4/* a reason", "# only a comment", "HEAD-1", "HEAD-1:", "  \t "]),
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


@FUZZ
@given(st.lists(_SKIP_LINES, max_size=12), st.sampled_from(["\n", "\r\n", "\r", "\x0b"]))
def test_a_skips_file_reads_as_entries_or_is_refused_naming_it(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], newline: str
) -> None:
    path = tmp_path_factory.mktemp("skips") / "skips.txt"
    path.write_bytes(newline.join(lines).encode("utf-8", "surrogatepass"))
    try:
        entries = read_skips(path)
    except ValueError as error:
        assert str(path) in str(error) and "\n" not in str(error)
    else:
        assert all(e.pattern and e.reason and e.line >= 1 for e in entries)


@FUZZ
@given(hostile_json() | st.builds(json.dumps, st.lists(st.integers() | st.text(), max_size=4)))
@example("-:")  # once drawn: read by argparse as an option when passed as its own word
def test_a_replay_that_is_no_json_object_is_refused_in_one_line(text: str) -> None:
    """--replay's text is refused before any check runs unless it is a JSON object."""
    with mock.patch("kvspec.conformance.runner.run_check") as run_check:
        # --replay=TEXT: a text that begins with '-' ('-:') is the option's value, not an option
        code = main(["conform", "reference", "--check", "PLAN-2/exact-cover", f"--replay={text}"])
    assert code == 2 and not run_check.called


_DESC_ARGS = ["--source-tp", "4", "--target-tp", "2", "--kv-heads", "4", "--layers", "2"]
_DESC_ARGS += ["--seq-len", "40", "--edge", "2:1", "--dst-layout", "sglang_mha"]


@pytest.fixture(scope="module")
def edge_plan(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The plan ``kvspec desc --check`` judges a list against, as the command builds it."""
    good = tmp_path_factory.mktemp("desc") / "good.json"
    good.write_text("[]")
    seen = []
    real = desc_cli._check
    with mock.patch.object(desc_cli, "_check", lambda path, made: seen.append(made) or {}):
        assert main(["desc", *_DESC_ARGS, "--check", str(good), "--json", "-"]) == 0
    assert real is desc_cli._check and len(seen) == 1
    return seen[0]


_REGIONS = st.sampled_from(["L0", "L1", "L0.K", "cache", "", "L9", "\u0663"])
_OFFSETS = st.integers(min_value=-(2**65), max_value=2**65) | st.sampled_from([0, 1, 64, 128])
_DESCRIPTORS = st.one_of(
    st.tuples(_REGIONS, _OFFSETS, _REGIONS, _OFFSETS, _OFFSETS).map(list),
    st.lists(st.none() | st.booleans() | st.floats() | st.text(max_size=3), max_size=6),
    st.none() | st.integers() | st.text(max_size=4) | st.dictionaries(st.text(), st.none()),
)


@FUZZ
@given(st.lists(_DESCRIPTORS, max_size=20))
def test_a_descriptor_list_is_judged_never_crashes(edge_plan: Any, listed: list[Any]) -> None:
    """``--check``'s list, any JSON list: a verdict naming each problem, never an exception."""
    verdict = judge_descriptors(listed, edge_plan)
    assert verdict.ok is (not verdict.problems)
    assert not verdict.ok or all(isinstance(d, list) and len(d) == 5 for d in listed)


@pytest.mark.parametrize(
    "content", ["[" * 100_000, "[[1,2]", '{"a": 1}', "[NaN]", "[" + "9" * 5000 + "]"]
)
def test_desc_check_refuses_a_list_it_cannot_read_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    path = tmp_path / "listed.json"
    path.write_text(content)
    code = main(["desc", *_DESC_ARGS, "--check", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"kvspec desc: refused: --check {path}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_desc_check_refuses_a_fifo_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "listed.json"
    os.mkfifo(path)
    code = main(["desc", *_DESC_ARGS, "--check", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "FIFO" in err and str(path) in err
