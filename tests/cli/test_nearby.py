"""Nearby valid configurations: one change at a time, closest first, each one accepted by
the validator of the command that offers it (``kvspec plan`` and ``python -m sim run``)."""

from __future__ import annotations

import argparse

import multiprocess
import pytest

from kvspec.console.nearby import Knob, closest_valid, flag_hint, nearby
from sim.cli import build_parser, checked_config
from sim.cli import main as sim_main


def _even(args: argparse.Namespace) -> None:
    if args.n % 2:
        raise ValueError(f"n must be even, got {args.n}")


def test_the_closest_accepted_values_come_first_and_the_current_one_never() -> None:
    args = argparse.Namespace(n=6, other="kept")
    seen: list[argparse.Namespace] = []

    def validate(candidate: argparse.Namespace) -> None:
        seen.append(candidate)
        _even(candidate)

    knob = Knob("n", range(1, 20), flag_hint("--n"))
    assert closest_valid(args, validate, knob, count=3) == [4, 8, 2]
    assert all(c.other == "kept" and c.n != 6 for c in seen), "one knob changes, never to itself"
    assert args.n == 6, "the namespace asked about is left alone"
    assert nearby(args, validate, [knob], count=2) == ["--n 4 or 8"]


def test_a_knob_with_no_accepted_value_gives_no_hint() -> None:
    knob = Knob("n", [1, 3, 5], flag_hint("--n"))
    assert nearby(argparse.Namespace(n=7), _even, [knob]) == []


def test_a_distance_orders_values_that_are_not_numbers() -> None:
    knob = Knob("rule", ["a:1", "a:5", "a:9"], flag_hint("--rule"), distance=lambda r: r[-1])
    assert closest_valid(argparse.Namespace(rule="a:2"), lambda a: None, knob) == [
        "a:1",
        "a:5",
        "a:9",
    ]


def _alternatives(hint: str) -> list[list[str]]:
    """The command lines a hint stands for: ``--a 1 --b 2 or 3`` is ``--a 1 --b 2`` and
    ``--a 1 --b 3`` (a hint changes one flag, and offers its values joined by ``or``)."""
    flags: list[tuple[str, list[str]]] = []
    words = hint.split()
    for i in range(0, len(words), 2):
        if words[i] == "or":
            flags[-1][1].append(words[i + 1])
        else:
            assert words[i].startswith("--"), hint
            flags.append((words[i], [words[i + 1]]))
    several = [values for _, values in flags if len(values) > 1]
    assert len(several) <= 1, f"{hint!r} changes more than one flag"
    choices = several[0] if several else [flags[-1][1][0]]
    return [
        [w for flag, values in flags for w in (flag, v if values is choices else values[0])]
        for v in choices
    ]


REFUSED = {
    "heads over the source TP": ["--source-tp", "4", "--target-tp", "2", "--kv-heads", "6"],
    "heads over the target TP": ["--source-tp", "4", "--target-tp", "6", "--kv-heads", "8"],
    "rule beyond the block": ["--source-cp=2", "--cp-rule=interleave:24", "--kv-heads=8"],
    "zigzag too short": [
        "--target-tp=4",
        "--target-cp=2",
        "--cp-rule=zigzag",
        "--kv-heads=4",
        "--seq-len=3",
    ],
}


@pytest.mark.parametrize("argv", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_sim_run_names_nearby_runs_the_sim_accepts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["run", *argv, "--quiet", "--ports", "os"]
    assert sim_main(command) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("python -m sim run: refused: ")
    assert lines[1] == "nearby valid configurations:"
    hints = [line.strip() for line in lines[2:]]
    assert hints and all(line.startswith("  --") for line in lines[2:])
    parser = build_parser()
    with pytest.raises(ValueError):
        checked_config(parser.parse_args(command))
    for hint in hints:
        for alternative in _alternatives(hint):
            checked_config(parser.parse_args([*command, *alternative]))  # accepted
    assert not multiprocess.active_children(), "no rank was started to find them"


def test_a_refusal_no_knob_can_fix_offers_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["run", "--kv-heads", "2", "--faults", "drop=2", "--quiet"]) == 2
    assert "nearby valid configurations" not in capsys.readouterr().err
