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
