"""How a failed result is replayed: the shell command and the one line of Python that run
the counterexample again (``kvspec conform IMPL --check ID --replay EXAMPLE``), as the
report, the pytest plugin and a cause's headline print them."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvspec.conformance.result import CheckResult


def reproduction(impl: str, result: CheckResult) -> str:
    """A shell command that replays the counterexample of a failed result."""
    example = json.dumps(result.counterexample, separators=(",", ":"))
    return (
        f"kvspec conform {shlex.quote(impl)} --check {result.check.id} "
        f"--replay {shlex.quote(example)}"
    )


def python_reproduction(impl: str, result: CheckResult) -> str:
    """The same replay as one line of Python, imports included (the example travels as a
    JSON string literal, so any example is valid Python)."""
    example = json.dumps(result.counterexample, separators=(",", ":"))
    return (
        "import json; from kvspec.conformance import get_check, load_adapter, run_check; "
        f"result = run_check(get_check({result.check.id!r}), load_adapter({impl!r}), "
        f"replay=json.loads({example!r})); print(result.verdict, result.reason)"
    )
