"""``--faults`` only refuses (issue 45): for any text, :func:`sim.run.faults.parse_faults`
returns a spec that describes itself back to the same spec, or raises ``ValueError`` with
one line naming the bad part — never another exception, and never a value read from a
non-ASCII digit. ``KVSPEC_FUZZ_EXAMPLES`` raises the count (``make fuzz`` runs
``10**5``); ``make test`` runs a sample.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.run.faults import PROBABILITIES, RANK_KINDS, parse_faults

EXAMPLES = int(os.environ.get("KVSPEC_FUZZ_EXAMPLES", 0)) or 4 * settings.default.max_examples
FUZZ = settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])

_NAMES = st.sampled_from([*PROBABILITIES, *RANK_KINDS, "delay", "", "DROP", "kill "])
_VALUES = st.one_of(
    st.sampled_from(["0", "1", "0.5", "1e-3", "1e-400", "2", "-0", "nan", "inf", "5ms", "0.2s"]),
    st.sampled_from(["sender:1@0.5", "receiver:0@1", "stage2:3@0", "sender:\u0663@0.5"]),
    st.sampled_from(["sender:1@3", "stage9999:999999@0.5+receiver:0@0", "sender:1@1e9"]),
    st.text(alphabet="0123456789.eE+-@:ms\u0663 ", max_size=12),
    st.text(max_size=8),
)
_PART = st.builds(lambda n, sep, v: n + sep + v, _NAMES, st.sampled_from(["=", "", "=="]), _VALUES)


@FUZZ
@given(st.lists(_PART, max_size=6).map(",".join) | st.text(max_size=30))
def test_any_faults_text_parses_or_is_refused_in_one_line(text: str) -> None:
    try:
        spec = parse_faults(text)
    except ValueError as error:
        assert "\n" not in str(error) and len(str(error)) < 400, str(error)
    else:
        assert parse_faults(spec.describe()) == spec  # what it read, it says back
        assert spec.describe().isascii()


@pytest.mark.parametrize("text", ["kill=sender:\u0663@0.5", "delay=\u0665ms", "drop=\u0660.5"])
def test_a_digit_of_another_script_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_faults(text)
