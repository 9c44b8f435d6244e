"""An engine's own default layer split reaches the generated cases [LAYER-1, LAYER-2]."""

from __future__ import annotations

from hypothesis import given, settings

from kvspec.conformance.adapter import Adapter
from kvspec.conformance.domain import Domain
from kvspec.testing.strategies import engine_default
from kvspec.topology.ownership import default_layer_partition


def extra_last(num_layers: int, pp: int) -> list[int]:
    """A split that puts the extra layers on the last stages (SGLang's default rule)."""
    base, extra = divmod(num_layers, pp)
    return [base + (rank >= pp - extra) for rank in range(pp)]


def test_the_base_adapter_has_kvspecs_split():
    assert Adapter().layer_partition(5, 2) is None


def test_an_engine_split_equal_to_kvspecs_stays_implicit():
    assert engine_default(extra_last, 4, 2) is None  # even: both rules agree
    assert engine_default(None, 5, 2) is None
    assert engine_default(extra_last, 5, 1) is None
    assert engine_default(extra_last, 5, 2) == (2, 3)
    assert default_layer_partition(5, 2) == (3, 2)


@settings(max_examples=150, database=None, deadline=None)
@given(Domain(pp_sizes=(2, 3)).cases(policies=("lowest",), partition=extra_last))
def test_stages_drawn_without_a_partition_get_the_engines(case):
    for stage in (case.source, case.target):
        n = case.model.num_layers
        split = tuple(stage.layer_partition or default_layer_partition(n, stage.pp))
        assert sum(split) == n
        if stage.pp > 1 and n % stage.pp:  # the rules differ: never left to kvspec's
            assert stage.layer_partition is not None
