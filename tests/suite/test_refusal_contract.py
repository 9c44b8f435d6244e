"""A refusal is one of the adapter's declared refusal types (a message naming no
offending value is an ``unclear`` note, issue 43); a crash on an invalid input is never
a pass (issue 28)."""

import pytest

from kvspec.conformance.checks import Context
from kvspec.conformance.checks.expectations import expect_refused, judging, refused
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, get_check, run_check
from kvspec.conformance.violation import Violation
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

VALID = TransferCase(StageLayout(2), StageLayout(4), ModelShape(2, 4, 2)).to_dict()
"""A configuration every stage accepts: TP2 -> TP4, 4 heads."""


def _config(source_tp: int) -> dict:
    """A valid configuration (for tp 1) the refusal checks make invalid variants of."""
    return {
        "source": {"tp": source_tp, "pp": 1, "layer_partition": None},
        "target": {"tp": 1, "pp": 1, "layer_partition": None},
        "model": ModelShape(2, 4, 2).to_dict(),
    }


class CrashesOnInvalidSizes(ReferenceAdapter):
    """Looks up the per-rank heads in a list sized by tp: tp 0 dies with IndexError
    instead of being refused."""

    def validate_sizes(self, config):
        for side in ("source", "target"):
            if config[side]["tp"] < 1:
                [][config[side]["tp"]]
        super().validate_sizes(config)


class CrashesOnValidTopology(ReferenceAdapter):
    """Refuses every pair of layouts by crashing: a valid configuration it starts with."""

    def validate_topology(self, config):
        raise IndexError("list index out of range")


class RefusesWithoutNaming(ReferenceAdapter):
    """Refuses bad key fields with a ValueError that says nothing of which or what."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        try:
            return super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)
        except ValueError:
            raise ValueError("invalid key") from None


def test_a_crash_on_an_invalid_configuration_fails_with_tier_breaks() -> None:
    result = run_check(
        get_check("STAGE-1/refuses-empty-stage"), CrashesOnInvalidSizes(), replay=_config(1)
    )
    assert result.verdict == FAILED
    assert result.tier == "breaks"
    assert "crashed instead of refusing" in result.reason
    assert "IndexError" in result.reason and "test_refusal_contract.py" in result.reason
    handed = result.accepted_input  # the input it crashed on, not the valid example
    assert 0 in (handed["source"]["tp"], handed["target"]["tp"])


def test_the_same_configuration_refused_cleanly_passes() -> None:
    result = run_check(
        get_check("STAGE-1/refuses-empty-stage"), ReferenceAdapter(), replay=_config(1)
    )
    assert result.verdict == PASSED


def test_refusing_a_valid_configuration_by_crashing_fails_with_tier_breaks() -> None:
    result = run_check(get_check("PLAN-1/accepts-valid"), CrashesOnValidTopology(), replay=VALID)
    assert result.verdict == FAILED
    assert result.tier == "breaks"
    assert result.obligation == "PLAN-1.2"


def test_a_refusal_not_naming_the_offending_value_is_noted_unclear() -> None:
    """A ValueError that names no offending value is a refusal still: the check passes
    and carries an ``unclear`` note quoting the message (issue 43: not ``breaks``)."""
    example = {
        "request_id": "req-1",
        "from_stage": 0,
        "chunk_id": 0,
        "from_rank": 0,
        "to_rank": 0,
        "to_stage": 0,
    }
    check = get_check("KEY-3/refuses-outside-domain")
    clear = run_check(check, ReferenceAdapter(), replay=example)
    assert clear.verdict == PASSED and clear.notes == ()
    result = run_check(check, RefusesWithoutNaming(), replay=example)
    assert result.verdict == PASSED
    assert result.notes and all("names none of the offending values" in n for n in result.notes)
    assert "'invalid key'" in result.notes[0]
    assert result.to_dict()["notes"] == list(result.notes)


class Other(Exception):
    pass


class DeclaresOther(ReferenceAdapter):
    refusal_types = (Other,)


def test_only_the_declared_refusal_types_are_refusals() -> None:
    def raises_value_error():
        raise ValueError("tp 0")

    def raises_other():
        raise Other("tp 0")

    with judging(DeclaresOther()):
        expect_refused("STAGE-1.1", "tp 0", raises_other, naming=(0,))
        with pytest.raises(Violation) as caught:
            expect_refused("STAGE-1.1", "tp 0", raises_value_error, naming=(0,))
        assert caught.value.tier == "breaks"
        assert refused(raises_other) is True
        assert refused(lambda: None) is False
        with pytest.raises(Violation):
            refused(raises_value_error)
    with judging(ReferenceAdapter()):
        assert refused(raises_value_error, naming=(0,)) is True


def test_the_wire_decoder_is_held_to_value_error_whatever_the_adapter_declares() -> None:
    def raises_other():
        raise Other("frame 3")

    with judging(DeclaresOther()), pytest.raises(Violation) as caught:
        expect_refused("WIRE-4.1", "a damaged message", raises_other)
    assert "crashed instead of refusing" in str(caught.value)


def test_an_accepted_input_is_shown_as_handed_over() -> None:
    """KEY-3: the accepted request id '' is shown, not the valid 'req-1' it was made from."""

    class EmptyIdAccepted(ReferenceAdapter):
        def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
            if request_id == "":
                return f"_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
            return super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)

    example = {
        "request_id": "req-1",
        **dict.fromkeys(("from_stage", "chunk_id", "from_rank", "to_rank", "to_stage"), 0),
    }
    result = run_check(get_check("KEY-3/refuses-outside-domain"), EmptyIdAccepted(), replay=example)
    assert result.verdict == FAILED
    assert result.tier == "accepts-invalid"
    assert result.accepted_input["request_id"] == ""


def test_port_2_shows_the_stage_that_was_accepted() -> None:
    class AnyStage(ReferenceAdapter):
        def kv_port(self, base, stage, rank, replica):
            if isinstance(stage, int) and stage >= 16:
                return base + 100 + replica * 1024 + rank * 16 + stage
            return super().kv_port(base, stage, rank, replica)

    example = {"base": 50000, "stage": 0, "rank": 0, "replica": 0}
    result = run_check(get_check("PORT-2/refuses-outside-domain"), AnyStage(), replay=example)
    assert result.verdict == FAILED
    assert result.obligation == "PORT-2.1"
    assert result.accepted_input["stage"] == 16
    assert "stage 16" in result.reason


def test_context_is_unchanged_by_judging() -> None:
    """Checks keep their Context; judging only sets whose refusal types count."""
    assert Context(ReferenceAdapter()).device == "cpu"
