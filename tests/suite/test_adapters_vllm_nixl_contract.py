"""vLLM NIXL's contract in its adapter (kvspec/adapters/vllm_nixl.py): its replica rule
and refusal types, and, where vllm is installed, its start-up checks as run on CPU."""

from __future__ import annotations

import importlib.util

import pytest

from kvspec.adapters import vllm_nixl
from kvspec.topology.field_policies import VLLM_NIXL


def test_the_contract_is_data() -> None:
    cls = vllm_nixl.VllmNixlAdapter
    assert cls.policies == (VLLM_NIXL,) and set(cls.policy_rules) == {VLLM_NIXL}
    assert cls.replicas_write == "one"  # np.unique keeps one rank per head
    assert AssertionError in cls.refusal_types and RuntimeError in cls.refusal_types


def deployment(p, d, heads, attention="mha", pp_d=1):
    return {
        "source": {"tp": p, "pp": 1},
        "target": {"tp": d, "pp": pp_d},
        "model": {
            "num_layers": 2,
            "num_kv_heads": heads,
            "head_dim": 2,
            "attention": attention,
            "dtype": "bfloat16",
        },
    }


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize(
    ("config", "accepted", "said"),
    [
        (deployment(4, 2, 8), True, "accepts"),
        (deployment(3, 2, 6), False, "not divisible by local tensor parallel size 2"),
        (deployment(4, 2, 6), False, "6 is not divisible by 4"),  # QKVParallelLinear
        (deployment(8, 2, 2), False, "is_kv_replicated"),
        (deployment(2, 2, 2, pp_d=2), False, "pipeline_parallel_size > 1"),
        (deployment(4, 2, 1, "mla"), True, "accepts"),
    ],
)
def test_serving_accepts_runs_vllms_checks(config, accepted, said) -> None:  # pragma: no cover
    verdict = vllm_nixl.VllmNixlAdapter().serving_accepts(config)
    assert verdict.accepted is accepted, verdict.evidence
    assert said in verdict.evidence


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize(("p", "d", "heads"), [(2, 8, 4), (8, 2, 8), (8, 2, 0), (4, 4, 2)])
def test_local_consumers_counts_the_notifiers(p, d, heads, monkeypatch) -> None:  # pragma: no cover
    """Each prefill rank hears from exactly as many decode ranks as they announce; a count
    one too high (the prefill would hold the blocks until the abort timeout) is caught."""
    from kvspec.topology.case import TransferCase
    from kvspec.topology.model import ModelShape
    from kvspec.topology.stage import StageLayout

    adapter = vllm_nixl.VllmNixlAdapter()
    model = ModelShape.mla(2, 4) if heads == 0 else ModelShape(2, heads, 2)
    case = TransferCase(StageLayout(p), StageLayout(d), model, VLLM_NIXL)
    assert sorted({t for s in range(p) for t in adapter.targets(case, s)}) == list(range(d))
    real = adapter.utils.TransferTopology.dcp_consumer_count
    monkeypatch.setattr(
        adapter.utils.TransferTopology,
        "dcp_consumer_count",
        lambda self, *args: real(self, *args) + 1,
    )
    with pytest.raises(RuntimeError, match="local_consumers"):
        adapter.targets(case, 0)
