"""`kvspec` starts without torch: help, versions, usage errors, and the whole of `kvspec
clauses`, `kvspec plan` and `kvspec ports` run with torch (and numpy and Hypothesis)
blocked, each in a fresh interpreter, and leave none of them imported. Commands that
move tensors (`layouts`, `desc`, `conform`, `vectors`) import torch inside their `run`.

Only exit statuses and output are asserted, never how long anything took.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from kvspec import __version__
from kvspec.cli import SUBCOMMANDS
from kvspec.core.clauses import SPEC_MODULES, read_clauses

HEAVY = ("torch", "numpy", "hypothesis")
"""What `kvspec` must start without: torch above all, and what only tensors and the
conformance suite need."""

LOADED = "kvspec-startup-loaded:"

SCRIPT = f"""
import json, sys, traceback
argv, block, module = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
for name in block:
    sys.modules[name] = None  # from here on, importing it raises ImportError
try:
    if module:
        import runpy
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__")
        code = 0
    else:
        from kvspec.cli import main
        code = main(argv)
except SystemExit as exit:
    code = exit.code
except Exception:
    traceback.print_exc()
    code = 1
sys.stdout.flush()
loaded = [name for name in {HEAVY!r} if sys.modules.get(name) is not None]
print({LOADED!r}, json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def kvspec(
    argv: list[str], *, block: tuple[str, ...] = HEAVY, module: str = ""
) -> tuple[int, str, list[str]]:
    """Run ``kvspec.cli.main(argv)`` (or ``python -m module argv``) in a fresh interpreter
    with ``block`` unimportable: its exit status, its output (stdout then stderr) and the
    modules of :data:`HEAVY` it had imported when it ended."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(argv), json.dumps(block), module],
        capture_output=True,
        text=True,
        check=False,
    )
    err, sep, last = done.stderr.rstrip("\n").rpartition("\n")
    if not last.startswith(LOADED):
        raise AssertionError(f"the child did not finish: {done.stdout}{done.stderr}")
    return done.returncode, done.stdout + err + sep, json.loads(last.removeprefix(LOADED))


PLAN = ["plan", "--source-tp", "8", "--target-tp", "2"]

CASES: list[tuple[list[str], int, str]] = [
    # help and versions
    (["--help"], 0, "usage: kvspec [-h] [--version] COMMAND"),
    (["--version"], 0, f"kvspec {__version__}"),
    *(([m.NAME, "--help"], 0, f"usage: kvspec {m.NAME} ") for m in SUBCOMMANDS),
    (["vectors", "check", "--help"], 0, "usage: kvspec vectors check "),
    (["vectors", "export", "--help"], 0, "usage: kvspec vectors export "),
    # usage errors: refused by argparse, before any command runs
    ([], 2, "kvspec: refused: the following arguments are required: COMMAND"),
    (["frobnicate"], 2, "kvspec: refused: argument COMMAND: invalid choice: 'frobnicate'"),
    (["--frob"], 2, "kvspec: refused: "),
    *(([m.NAME, "--no-such-option"], 2, ": refused: ") for m in SUBCOMMANDS),
    (["plan"], 2, "required: --source-tp, --target-tp"),
    ([*PLAN[:2], "x", *PLAN[3:]], 2, "--source-tp: expected an integer in 1..4096, got 'x'"),
    ([*PLAN, "--dtype", "float64"], 2, "argument --dtype: invalid choice: 'float64'"),
    ([*PLAN, "--policy", "nearest"], 2, "argument --policy: invalid choice: 'nearest'"),
    ([*PLAN, "--model", "gpt-5"], 2, "argument --model: invalid choice: 'gpt-5'"),
    (["ports"], 2, "the following arguments are required: --stage"),
    (["ports", "--stage", "tp=2", "--base", "abc"], 2, "expected an integer in 1..65535"),
    (["layouts", "--dtype", "int8"], 2, "argument --dtype: invalid choice: 'int8'"),
    (["layouts", "--model", "gpt-5"], 2, "argument --model: invalid choice: 'gpt-5'"),
    (["layouts", "--heads", "0"], 2, "argument --heads: must be in 1..4096, got 0"),
    (["desc"], 2, "required: --source-tp, --target-tp"),
    (["desc", *PLAN[1:], "--seed", "-1"], 2, "argument --seed: must be in 0..2147483648"),
    (["conform", "--profile", "nope"], 2, "argument --profile: invalid choice: 'nope'"),
    (["conform", "--jobs", "x"], 2, "argument --jobs: invalid int value: 'x'"),
    (["vectors"], 2, "the following arguments are required: ACTION"),
    (["vectors", "frobnicate"], 2, "argument ACTION: invalid choice: 'frobnicate'"),
    (["vectors", "check"], 2, "the following arguments are required: --impl"),
    (["vectors", "check", "--impl", "x", "--family", "nope"], 2, "invalid choice: 'nope'"),
    (["vectors", "export"], 2, "the following arguments are required: directory"),
    # conform's own refusals come before the suite is imported
    (["conform"], 2, "kvspec conform: give IMPL"),
    (["conform", "--device", "tpu", "reference"], 2, "--device must be cpu, cuda or cuda:N"),
    (["conform", "--jobs", "0", "reference"], 2, "--jobs must be at least 1; got 0"),
    (["conform", "--fail-on", "nope", "reference"], 2, "--fail-on: unknown tier(s) 'nope'"),
    # the whole of `kvspec clauses` (but --coverage, which loads the suite)
    (["clauses"], 0, "PLAN-2 "),
    (["clauses", "DTYPE", "--text"], 0, "DTYPE-2.1    must: NaN payloads"),
    (["clauses", "--markdown"], 0, "| PAYLOAD-1 |"),
    (["clauses", "NOPE"], 1, "kvspec clauses: no clause id starts with 'NOPE'"),
    # the whole of `kvspec plan`: plans, group plans, refusals with nearby configurations
    ([*PLAN, "--kv-heads", "4"], 0, "edges (4):"),
    ([*PLAN, "--kv-heads", "4", "--json", "-"], 0, '"edges": ['),
    ([*PLAN, "--attention", "mla", "--latent-dim", "576"], 0, "MLA latent 576"),
    ([*PLAN, "--target-cp", "2", "--cp-rule", "interleave:1", "--kv-heads", "4"], 0, "CP2"),
    (["plan", "--source-tp", "4", "--target-tp", "6", "--kv-heads", "12"], 0, "TP4 -> TP6"),
    (
        ["plan", "--source-tp", "1", "--target-tp", "4", "--model", "qwen3-next-80b-a3b"],
        0,
        "qwen3-next-80b-a3b: TP1 -> TP4",
    ),
    ([*PLAN, "--kv-heads", "6"], 2, "8 % 6 = 2 [HEAD-2]\nnearby valid configurations:"),
    ([*PLAN, "--target-cp", "3", "--kv-heads", "4"], 2, "does not divide tp"),
    (["plan", "--source-tp", "3", "--target-tp", "1", "--model", "jamba-v0.1"], 2, "refused"),
    # the whole of `kvspec ports`
    (["ports", "--stage", "tp=2,replicas=2", "--stage", "tp=1"], 0, "all distinct"),
    (["ports", "--stage", "tp=8,dp=2", "--dp-stride", "4096", "--json", "-"], 0, '"dp_rank": 1'),
    (["ports", "--stage", "tp=2", "--kv-offset", "0"], 2, "2 colliding pair(s)"),
    (["ports", "--stage", "tp=zz"], 2, "tp expected an integer in 1..4096, got 'zz'"),
]


def _id(case: tuple[list[str], int, str]) -> str:
    return " ".join(case[0]) or "(no arguments)"


@pytest.mark.parametrize(("argv", "code", "text"), CASES, ids=[_id(c) for c in CASES])
def test_runs_with_torch_blocked(argv: list[str], code: int, text: str) -> None:
    got, output, _ = kvspec(argv)
    assert (got, text in output) == (code, True), output[-2000:]
    assert "Traceback" not in output, output[-2000:]


@pytest.mark.parametrize(("argv", "code", "text"), CASES, ids=[_id(c) for c in CASES])
def test_leaves_torch_unimported(argv: list[str], code: int, text: str) -> None:
    got, output, loaded = kvspec(argv, block=())
    assert (got, text in output) == (code, True), output[-2000:]
    assert loaded == [], f"kvspec {' '.join(argv)} imported {loaded}"


def test_python_m_kvspec_starts_without_torch() -> None:
    code, output, _ = kvspec(["--help"], module="kvspec")
    assert code == 0
    assert "usage: kvspec [-h] [--version] COMMAND" in output
    code, output, loaded = kvspec(["--version"], block=(), module="kvspec")
    assert (code, loaded) == (0, [])
    assert f"kvspec {__version__}" in output


def test_a_command_that_moves_tensors_still_imports_torch_and_works() -> None:
    code, output, loaded = kvspec(["layouts", "--convert", "flash_attn", "sglang_mha"], block=())
    assert code == 0, output
    assert "bit-identical" in output
    assert "torch" in loaded


def test_the_block_is_real() -> None:
    # The same command with torch blocked fails on the import: the other tests prove
    # something only because blocking torch does stop it from loading.
    code, output, _ = kvspec(["layouts", "--convert", "flash_attn", "sglang_mha"])
    assert code == 1
    assert "ModuleNotFoundError: import of torch halted" in output


@pytest.mark.parametrize("name", SPEC_MODULES)
def test_clauses_are_read_without_importing_their_module(name: str) -> None:
    # `kvspec clauses` reads CLAUSES from the source of every spec module not yet
    # imported; a declaration it cannot read would import the module (and torch).
    read = read_clauses(name)
    assert read is not None, (
        f"{name}.CLAUSES must be one literal tuple of Clause(...), must(...) and "
        "refuses(...) with constant strings, so that `kvspec clauses` reads it without "
        "importing the module"
    )
    assert read == importlib.import_module(name).CLAUSES


def test_vectors_family_choices_are_the_vector_families() -> None:
    from kvspec.cli import vectors
    from kvspec.conformance.vectors import FAMILY_NAMES

    assert vectors.FAMILY_NAMES == FAMILY_NAMES, "update kvspec/cli/vectors.py FAMILY_NAMES"
