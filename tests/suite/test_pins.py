"""Pins reach an engine under its own choices (kvspec.conformance.pins): its replica rule
for ``lowest``, its default layer split for kvspec's [PLAN-4, LAYER-1]."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.conformance import get_check, run_check
from kvspec.conformance.draws import ROUTING_PINS, TENSOR_PINS
from kvspec.conformance.families.routing.checks import POLICY_PINS
from kvspec.conformance.pins import pins_for
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import PASSED
from kvspec.topology.case import TransferCase
from kvspec.topology.ownership import default_layer_partition


def last_heavy(num_layers: int, pp: int) -> list[int]:
    """Extra layers on the last stages (SGLang's get_pp_indices does this; kvspec gives
    them to the stages before the last [LAYER-1])."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i >= pp - extra else 0) for i in range(pp)]


class OwnChoices(ReferenceAdapter):
    """The reference, run as an engine that names one replica rule and splits its own way."""

    name = "own-choices"
    policies = ("balanced",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[TransferCase] = []

    def layer_partition(self, num_layers: int, pp: int) -> Sequence[int] | None:
        return last_heavy(num_layers, pp)

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        self.seen.append(case)
        return super().sources(case, dst)


def uneven_pipeline_pin(pins) -> dict:
    [pin] = [
        p
        for p in pins
        if p["source"]["pp"] == 2
        and p["target"]["pp"] == 1
        and p["model"]["num_layers"] == 3
        and p["source"]["tp"] == 2
    ]
    return pin


def test_the_reference_gets_the_pins_as_written() -> None:
    for pins in (ROUTING_PINS, TENSOR_PINS, POLICY_PINS):
        assert pins_for(ReferenceAdapter(), pins) == pins


def test_an_engine_gets_its_own_policy_and_split_for_kvspecs() -> None:
    adapted = pins_for(OwnChoices(), ROUTING_PINS)
    assert len(adapted) == len(ROUTING_PINS)
    assert {p["policy"] for p in adapted} == {"balanced"}  # every routing pin says lowest
    pin = uneven_pipeline_pin(adapted)
    assert default_layer_partition(3, 2) != (1, 2)  # the two splits do differ here
    assert pin["source"]["layer_partition"] == [1, 2]
    assert pin["target"]["layer_partition"] is None  # PP1: nothing to split
    # the adapted pin is a valid case, the topology unchanged
    case = TransferCase.from_dict(pin)
    assert (case.source.tp, case.source.pp, case.target.tp) == (2, 2, 2)


def test_an_explicit_split_or_another_named_policy_is_left_as_written() -> None:
    explicit = {
        "source": {"tp": 2, "pp": 2, "layer_partition": [2, 1]},
        "target": {"tp": 2, "pp": 1, "layer_partition": None},
        "model": {"num_layers": 3, "num_kv_heads": 2, "head_dim": 2, "attention": "mha"},
        "policy": "lowest",
    }
    [adapted] = pins_for(OwnChoices(), [explicit])
    assert adapted["source"]["layer_partition"] == [2, 1]  # a pin that chose its split
    assert adapted["policy"] == "balanced"

    class NamesAnother(OwnChoices):
        policies = ("by_receiver",)

    for before, after in zip(POLICY_PINS, pins_for(NamesAnother(), POLICY_PINS), strict=True):
        assert before["policy"] == after["policy"] == "balanced"  # a pin about that policy


def test_nested_cases_are_adapted_too() -> None:
    adapted = pins_for(OwnChoices(), TENSOR_PINS)
    pin = uneven_pipeline_pin([p["case"] for p in adapted])
    assert pin["source"]["layer_partition"] == [1, 2] and pin["policy"] == "balanced"
    assert [p["seq_len"] for p in adapted] == [p["seq_len"] for p in TENSOR_PINS]


def test_the_suite_hands_the_engine_the_adapted_pin() -> None:
    """Run through the suite, the engine is asked about the uneven pipeline under its own
    split and policy, not about kvspec's (which it would never run)."""
    adapter = OwnChoices()
    result = run_check(get_check("PLAN-3/inverse"), adapter, max_examples=1, profile="quick")
    assert result.verdict == PASSED, result.reason
    pipelines = [
        c for c in adapter.seen if c.source.pp == 2 and c.target.pp == 1 and c.model.num_layers == 3
    ]
    assert pipelines, "the uneven-pipeline pins never reached the adapter"
    assert all(c.source.layer_partition == (1, 2) and c.policy == "balanced" for c in pipelines)
