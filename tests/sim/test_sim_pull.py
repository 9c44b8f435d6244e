"""``--transfer pull``: receivers read their descriptors from the senders' caches, between
any two presets the sim moves, with any TP pair, PP, token shards (PCP, DCP), attention-DP
groups, chunks, chains, faults and refusals."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS
from kvspec.memory.descriptors import RegisteredCache, plan_descriptors
from kvspec.naming.keys import parse_key
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from sim.cli import main as sim_main
from sim.harness.cluster import run_simulation
from sim.paths.pull import PullAgent
from sim.run.config import SimConfig
from tests.sim import runs
from tests.sim.runs import MHA, assert_all_verified, domain_runs, small_run


def make(stages, model, **overrides) -> SimConfig:
    """A small pull run."""
    return small_run(stages, model, **{"transfer": "pull", **overrides})


def pull_configs() -> st.SearchStrategy[SimConfig]:
    """Pull (or push) runs over the whole domain: any TP pair, PP, token shards on either
    side by every rule, attention-DP groups [PLAN-1, CP-1, DP-1, DESC-1]."""
    return domain_runs(cross_layer=True, transfer=st.sampled_from(["pull", "pull", "push"]))


@given(pull_configs())
@settings(max_examples=25, deadline=None)
def test_in_process_pull_and_push_verify_every_element(config: SimConfig) -> None:
    """Any two presets the sim moves, cross-layer tensors and token pools included, by
    push or pull: all verified, and the bytes each edge moved are the plan's."""
    report = run_simulation(config)
    assert_all_verified(report)
    if config.transfer == "pull":
        summary = report.descriptor_summary()
        assert summary is not None and summary["descriptors"] > 0
        assert report.receiver_stats["descriptor_bytes"] == report.bytes_moved


PULL_RUNS = {
    "the issue's example TP8->TP2, packed HND -> SGLang pool": dict(
        stages=(StageLayout(8), StageLayout(2)),
        model=ModelShape(2, 4, 8),
        src_layout=PRESETS["vllm_packed_hnd"],
        dst_layout=PRESETS["sglang_mha"],
        src_block_size=16,
        dst_block_size=4,
    ),
    "fan-out TP2->TP8, replicated heads, TRT-LLM pool -> cross-layer NHD": dict(
        stages=(StageLayout(2), StageLayout(8)),
        model=MHA,
        src_layout=PRESETS["trtllm_pool"],
        dst_layout=PRESETS["vllm_packed_nhd_layers"],
        chunks=2,
    ),
    "PP on both sides, uneven": dict(
        stages=(StageLayout(2, 2), StageLayout(2, 3)),
        model=ModelShape(5, 4, 8),
        src_layout=PRESETS["flashinfer_hnd"],
        dst_layout=PRESETS["sglang_mha_hnd"],
        dst_block_size=3,
    ),
    "MLA TP4->TP2, SGLang pool -> vLLM MLA": dict(
        stages=(StageLayout(4), StageLayout(2)),
        model=ModelShape.mla(3, 16),
        src_layout=PRESETS["sglang_mla"],
        dst_layout=PRESETS["vllm_mla"],
        src_block_size=2,
    ),
    "TP4 PCP2 interleave:16 -> TP6 (the issue's example), 12 heads": dict(
        stages=(StageLayout(4, cp=2, cp_rule="interleave:16"), StageLayout(6)),
        model=ModelShape(2, 12, 8),
        seq_len=(20, 80),
        src_layout=PRESETS["vllm_packed_hnd"],
        dst_layout=PRESETS["sglang_mha"],
        dst_block_size=4,
        chunks=2,
    ),
    "PCP zigzag -> DCP interleave:2, DP2 groups -> DP2 groups": dict(
        stages=(
            StageLayout(8, dp=2, cp=2, cp_rule="zigzag"),
            StageLayout(8, dp=2, dcp=2, cp_rule="interleave:2"),
        ),
        model=ModelShape(2, 2, 8),
        seq_len=(8, 30),
        requests=4,
        src_layout=PRESETS["flash_attn_hnd"],
        dst_layout=PRESETS["trtllm_pool"],
        src_block_size=4,
        dst_block_size=4,
        ranks_per_process=4,
    ),
    "SGLang's page-major pool -> its HiCache host pool (page_first), TP4->TP2": dict(
        stages=(StageLayout(4), StageLayout(2)),
        model=ModelShape(3, 4, 8),
        src_layout=PRESETS["sglang_page_major"],
        dst_layout=PRESETS["sglang_host_page_first"],
        src_block_size=4,
        dst_block_size=8,
    ),
    "HiCache layer_first -> page_unified (every later stage), a chain TP2 -> TP4 -> TP1": dict(
        stages=(StageLayout(2), StageLayout(4), StageLayout(1)),
        model=ModelShape(2, 4, 8),
        src_layout=PRESETS["sglang_host_layer_first"],
        dst_layout=PRESETS["sglang_host_unified"],
        src_block_size=2,
    ),
    "HiCache page_first_direct -> vLLM's BHLNC tensor, TP2 -> TP4": dict(
        stages=(StageLayout(2), StageLayout(4)),
        model=ModelShape(2, 4, 8),
        src_layout=PRESETS["sglang_host_pf_direct"],
        dst_layout=PRESETS["vllm_packed_bhlnc"],
        src_block_size=3,
    ),
    "a chain TP4 -> TP2 -> TP1, fp8": dict(
        stages=(StageLayout(4), StageLayout(2), StageLayout(1)),
        model=ModelShape(2, 4, 8, dtype="float8_e4m3fn"),
        src_layout=PRESETS["vllm_packed_nhd"],
        dst_layout=PRESETS["kv_tuple"],
    ),
}


@pytest.mark.parametrize("name", list(PULL_RUNS))
def test_multi_process_pull_runs(name: str) -> None:
    report = run_simulation(make(**PULL_RUNS[name]))
    assert_all_verified(report)
    assert report.descriptor_summary()["reads_refused"] == 0


def _requests_of(keys: set[str]) -> set[str]:
    return {parse_key(k).request_id for k in keys}


FAULTS = runs.faults_of("drop", "dup", "reorder", "corrupt", "garbage", "kill")


@pytest.mark.parametrize("kind", list(FAULTS))
def test_pull_books_balance(kind: str) -> None:
    """Each fault strikes answers as it strikes payloads; over ten seeds the books balance
    key by key, and only the struck requests fail [sim.books.accounting]."""
    for seed in range(10):
        report = runs.faulted_run(
            kind,
            seed,
            transfer="pull",
            src_layout=PRESETS["vllm_packed_hnd"],
            dst_layout=PRESETS["flashinfer"],
            dst_block_size=3,
        )
        injected = report.fault_keys["injected"].get(kind, [])
        assert report.verified + report.failed == 4
        failed = {o.request_id for o in report.outcomes if not o.ok}
        if kind in ("drop", "corrupt"):
            assert failed == _requests_of(set(injected)), seed
        if kind in ("dup", "reorder", "garbage"):
            assert not failed, seed


def test_a_read_is_served_only_to_a_verified_receiver_for_its_own_share() -> None:
    """A read from an unknown connection is a stranger's; one naming another receiver's key,
    or asking for other bytes than the spec's list, is refused [sim.net.auth, DESC-1]."""
    plan = plan_transfer(StageLayout(2), StageLayout(2), MHA)
    cache = RegisteredCache(PRESETS["flash_attn"], 2, 3, 4, 2, 8, "bfloat16")
    made = plan_descriptors(plan, plan.edge(0, 0), cache, [1, 2], cache, [0, 1], range(6))
    rank = SimpleNamespace(  # the path's read-only view of its rank
        strangers=Counter(),
        stats=Counter(),
        config=SimpleNamespace(checksum=False),
        who=SimpleNamespace(rank=0),
    )
    outbound = SimpleNamespace(  # the sender's port: one verified receiver, nothing skipped
        receiver_of=lambda peer: 0 if peer == b"verified" else None,
        is_skipped=lambda dst, key: False,
    )
    ports = SimpleNamespace(view=rank, out=outbound, inbound=None)
    agent = PullAgent(ports)  # type: ignore[arg-type]
    agent.names = list(cache.regions())
    agent.keys_of = {"req_0_0_0_0": ("req", 0, 0), "req_0_0_0_1": ("req", 0, 1)}
    agent._plan = lambda *a, **k: made  # type: ignore[method-assign]
    answered = []
    agent._answer = lambda dst, key, listed: answered.append((dst, key))  # type: ignore[method-assign]
    agent.ready_requests.add("req")
    rows = [
        [agent.names.index(a), b, agent.names.index(c), d, n] for a, b, c, d, n in made.descriptors
    ]

    def read(peer: bytes, key: str, listed) -> None:
        body = np.array(listed, dtype="<i8").reshape(-1, 5).tobytes()
        head = json.dumps({"read": key, "seq": 0, "n": len(listed)}).encode()
        agent.on_read([peer, head, body])

    read(b"stranger", "req_0_0_0_0", rows)
    assert rank.strangers["kv reads refused"] == 1 and not answered
    read(b"verified", "req_0_0_0_1", rows)  # receiver 1's key
    wider = [*rows[:-1], [rows[-1][0], rows[-1][1], rows[-1][2], rows[-1][3], rows[-1][4] + 8]]
    read(b"verified", "req_0_0_0_0", wider)  # eight bytes past its share
    assert rank.stats["reads_refused"] == 2 and not answered
    read(b"verified", "req_0_0_0_0", rows)
    assert answered == [(0, "req_0_0_0_0")]


def test_cli_pull_reports_descriptors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--quiet", "--ports", "os", "--transfer", "pull", "--kv-heads", "4"]
    argv += ["--source-tp", "4", "--target-tp", "2", "--requests", "2", "--seq-len", "8:16"]
    argv += ["--src-layout", "vllm_packed_hnd", "--dst-layout", "sglang_mha", "--json", "-"]
    argv += ["--head-dim", "8"]
    assert sim_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["transfer"] == "pull" and report["requests"]["verified"] == 2
    pulled = report["descriptors"]
    assert pulled["descriptors"] > 0 and pulled["per_request"] == pulled["descriptors"] / 2
    # An SGLang row holds both of the receiver's heads, a sender's block one head: each
    # range is one token's K or V of one head, 8 bfloat16 values
    assert pulled["bytes_per_descriptor"] == 8 * 2
