"""SGLang's contract in its adapter (kvspec/adapters/sglang.py): what it declares, and,
where sglang is installed (the field venv), that SGLang's own code answers as declared."""

from __future__ import annotations

import importlib.util

import pytest

from kvspec.adapters import _engine, sglang
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import SGLANG
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout


def test_the_contract_is_data() -> None:
    cls = sglang.SglangAdapter
    assert cls.replicas_write == "every"
    assert cls.policies == (SGLANG,) and set(cls.policy_rules) == {SGLANG}
    assert "RESHARD-3.2" in cls.serving_never_produces
    assert "_setup_bootstrap_infos" in cls.serving_never_produces["RESHARD-3.2"]
    # non-dividing TP pairs are in: SGLang starts with them (issue 28, part 4)
    assert sglang.DOMAIN.holds(TransferCase(StageLayout(3), StageLayout(2), ModelShape(2, 6, 2)))


def test_the_model_config_has_the_kv_heads_and_query_heads_every_tp_divides() -> None:
    config = sglang.mha_config({"num_layers": 61, "num_kv_heads": 6, "head_dim": 4}, (3, 2))
    assert config["num_hidden_layers"] == 61 and config["num_key_value_heads"] == 6
    assert config["num_attention_heads"] % 3 == 0 and config["num_attention_heads"] % 2 == 0
    assert config["hidden_size"] == config["num_attention_heads"] * 4


def test_a_bare_assert_is_reported_by_its_statement(tmp_path) -> None:
    # an engine module's bare assert (a module pytest does not rewrite)
    (tmp_path / "engine_checks.py").write_text("def check():\n    assert 1 + 1 == 3\n")
    spec = importlib.util.spec_from_file_location("engine_checks", tmp_path / "engine_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(AssertionError) as raised:
        module.check()
    said = _engine.engine_message(raised.value)
    assert said.startswith("AssertionError: (no message) at ")
    assert said.endswith(":2 `assert 1 + 1 == 3`")


installed = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not installed, reason="sglang is not installed (field venv)")


@pytest.fixture(scope="module")
def adapter():  # pragma: no cover - field venv only
    return sglang.SglangAdapter()


def deployment(p, pp_p, d, pp_d, layers, heads, attention="mha", partition=None):
    return {
        "source": {"tp": p, "pp": pp_p, "layer_partition": partition},
        "target": {"tp": d, "pp": pp_d, "layer_partition": None},
        "model": {
            "num_layers": layers,
            "num_kv_heads": heads,
            "head_dim": 2,
            "attention": attention,
            "dtype": "bfloat16",
        },
    }


@needs_sglang
def test_the_layer_partition_is_sglangs_get_pp_indices(adapter) -> None:  # pragma: no cover
    assert adapter.layer_partition(32, 3) == [10, 11, 11]  # extra layers last
    assert adapter.layer_partition(94, 4) == [23, 23, 24, 24]
    assert adapter.layer_partition(4, 2) == [2, 2]
    assert adapter.refusal_types[-1] is adapter.conn.KVTransferError


@needs_sglang
@pytest.mark.parametrize(
    ("config", "accepted", "said"),
    [
        (deployment(3, 1, 2, 1, 2, 6), True, "accepts"),  # non-dividing: SGLang starts
        (deployment(4, 1, 2, 1, 2, 6), False, "total_num_kv_heads % tp_size"),
        (deployment(1, 2, 1, 1, 1, 1), False, "num_hidden_layers >= pp_size"),
        (deployment(2, 2, 1, 3, 6, 2), False, "Decode pp size (3)"),
        (deployment(1, 2, 1, 1, 5, 1, partition=[2, 2]), False, "sum(partitions)=4"),
        (deployment(1, 3, 1, 1, 32, 8), True, "accepts"),
    ],
)
def test_serving_accepts_runs_sglangs_start_up_checks(
    adapter, config, accepted, said
):  # pragma: no cover
    verdict = adapter.serving_accepts(config)
    assert verdict.accepted is accepted, verdict.evidence
    assert said in verdict.evidence


@needs_sglang
def test_the_suite_finds_the_pp_pairing_under_the_default_split(
    adapter,
) -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    split = tuple(adapter.layer_partition(32, 3))
    case = TransferCase(StageLayout(1, 3, split), StageLayout(1), ModelShape(32, 8, 2), SGLANG)
    example = {"case": case.to_dict(), "seq_len": 2, "seed": 0}
    result = run_check(get_check("RESHARD-2/round-trip"), adapter, replay=example)
    assert result.verdict == "FAILED", result.reason


@needs_sglang
def test_the_suite_finds_the_non_dividing_head_loss(adapter) -> None:  # pragma: no cover
    from kvspec.conformance import get_check, run_check

    case = TransferCase(StageLayout(3), StageLayout(2), ModelShape(2, 6, 2), SGLANG)
    result = run_check(get_check("PLAN-2/exact-cover"), adapter, replay=case.to_dict())
    assert result.verdict == "FAILED" and "never receives" in result.reason, result.reason


def test_fan_out_pairs_that_do_not_divide_are_left_out_and_said_why() -> None:
    assert (2, 3) in sglang.FAN_OUT_NON_DIVIDING and (3, 2) not in sglang.FAN_OUT_NON_DIVIDING
    assert (2, 3) not in sglang.DOMAIN.pairs() and (3, 2) in sglang.DOMAIN.pairs()


@needs_sglang
def test_a_fan_out_that_does_not_divide_fails_at_bootstrap(adapter) -> None:  # pragma: no cover
    case = TransferCase(StageLayout(3), StageLayout(4), ModelShape.mla(2, 2), SGLANG)
    assert adapter.serving_accepts(case.to_dict()).accepted  # SGLang starts with it
    assert list(adapter.sources(case, 2)) == [2]
    with pytest.raises(adapter.conn.KVTransferError, match="target_tp_rank: 3"):
        adapter.sources(case, 3)
