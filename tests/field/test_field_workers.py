"""The worker harness (field/workers/) on captured data: no engine is needed.

`make field` runs vLLM's own NIXL workers (field/workers/vllm_nixl.py); what it does
with what they posted and stored is pure and tested here: NIXL descriptor rows expanded
as NIXL reads them, a READ's index pairs turned into kvspec descriptors, each judged by
its effect against DESC-1..3, and a case's outcome. The lists below are built from the
spec's own plan and then broken one way each, as a connector could break them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kvspec.memory.descriptors import Descriptor, plan_descriptors
from kvspec.topology.model import ModelShape

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "field" / "workers"))

import descs  # noqa: E402
import vllm_nixl  # noqa: E402

MODEL = vllm_nixl.Case("t", 4, 2, 4, layers=2, head_dim=8, block_size=4).model
BLOCK = 4
SRC_BASE, DST_BASE = 0x10_0000, 0x80_0000
"""Where the two ranks' layer regions start in the fake address spaces."""


def caches(heads_src: int, heads_dst: int, blocks: int = 8) -> tuple[Any, Any]:
    return (
        descs.registered_cache(
            vllm_nixl.KVSPEC_LAYOUT, MODEL, num_blocks=blocks, block_size=BLOCK, heads=heads_src
        ),
        descs.registered_cache(
            vllm_nixl.KVSPEC_LAYOUT, MODEL, num_blocks=blocks, block_size=BLOCK, heads=heads_dst
        ),
    )


def regions(cache: Any, base: int) -> descs.Regions:
    sizes = tuple(cache.regions().values())
    return descs.Regions(tuple(base + i * (1 << 16) for i in range(len(sizes))), sizes)


def capture(listed: list[Descriptor], source: descs.Regions, target: descs.Regions) -> tuple:
    """A READ of ``listed`` as a worker records it: two NIXL lists and index pairs."""

    def address(regions: descs.Regions, name: str, offset: int) -> int:
        return regions.addresses[int(name[1:])] + offset

    local = [[address(target, d.dst_region, d.dst_offset), d.length, 0] for d in listed]
    remote = [[address(source, d.src_region, d.src_offset), d.length, 0] for d in listed]
    dlists = {"0": {"rows": local}, "1": {"rows": remote}}
    read = {
        "local": 0,
        "remote": 1,
        "local_ids": list(range(len(listed))),
        "remote_ids": list(range(len(listed))),
    }
    return read, dlists


class Edge:
    """Edge 1 -> 0 of TP4 -> TP2 with 4 KV heads: head 1 into the second half of the
    receiver's blocks, for a request of ``seq_len`` tokens."""

    def __init__(self, seq_len: int, src_ids: list[int], dst_ids: list[int]) -> None:
        self.plan = descs.transfer_plan(4, 2, MODEL)
        self.edge = self.plan.edge(1, 0)
        self.source, self.target = caches(1, 2)
        self.src_ids, self.dst_ids, self.seq_len = src_ids, dst_ids, seq_len
        self.src_regions = regions(self.source, SRC_BASE)
        self.dst_regions = regions(self.target, DST_BASE)

    def spec(self, tokens: range | None = None) -> list[Descriptor]:
        return list(
            plan_descriptors(
                self.plan,
                self.edge,
                self.source,
                self.src_ids,
                self.target,
                self.dst_ids,
                tokens or range(self.seq_len),
            ).descriptors
        )

    def judge(self, listed: list[Descriptor]) -> dict[str, Any]:
        read, dlists = capture(listed, self.src_regions, self.dst_regions)
        posted = descs.posted_read(read, dlists, self.src_regions, self.dst_regions)
        assert not posted.problems
        assert list(posted.descriptors) == listed  # addresses back to regions, exactly
        return descs.judge_edge(
            self.plan,
            1,
            0,
            posted.descriptors,
            self.source,
            self.src_ids,
            self.target,
            self.dst_ids,
            self.seq_len,
        )


# -- NIXL's descriptor rows ---------------------------------------------------------------


def test_a_strided_row_is_count_descriptors_stride_apart_and_a_plain_row_one() -> None:
    rows = [[100, 8, 0, 32, 3], [7, 5, 0]]
    assert descs.expand_rows(rows) == [(100, 8), (132, 8), (164, 8), (7, 5)]


def test_a_row_of_another_width_is_refused_with_the_row() -> None:
    with pytest.raises(ValueError, match=r"\(addr, len, dev\).*got \[1, 2\]"):
        descs.expand_rows([[1, 2]])


def test_an_address_outside_every_region_has_no_region() -> None:
    r = descs.Regions((1000, 5000), (100, 100))
    assert r.locate(1050, 50) == ("L0", 50)
    assert r.locate(5000, 100) == ("L1", 0)
    assert r.locate(1050, 51) is None  # one byte past L0's end [DESC-2]
    assert r.locate(2000, 1) is None


# -- a READ judged by its effect ------------------------------------------------------------


def test_the_specs_own_list_captured_and_read_back_is_exact_and_minimal() -> None:
    edge = Edge(12, [5, 2, 7], [1, 6, 3])
    row = edge.judge(edge.spec())
    assert row["verdict"] == "exact"
    assert row["count"] == row["minimum"] > 0
    assert row["bytes"] == row["share_bytes"]


def test_one_descriptor_per_block_is_exact_and_counted_above_the_minimum() -> None:
    # TP2 -> TP4 with 2 KV heads: both ranks hold one head, so with consecutive ids on
    # both sides a layer's blocks are one run [DESC-3]; a per-block list (what vLLM
    # posts) has the same effect with one descriptor per block.
    model = ModelShape(2, 2, 8)
    plan = descs.transfer_plan(2, 4, model)
    source, target = (
        descs.registered_cache(vllm_nixl.KVSPEC_LAYOUT, model, num_blocks=8, block_size=4, heads=1)
        for _ in range(2)
    )
    ids = [1, 2, 3]
    whole = plan_descriptors(plan, plan.edge(0, 0), source, ids, target, ids, range(12))
    page = target.strides()["blocks"]
    per_block = [
        d._replace(src_offset=d.src_offset + k, dst_offset=d.dst_offset + k, length=page)
        for d in whole.descriptors
        for k in range(0, d.length, page)
    ]
    assert whole.count == model.num_layers  # one run per layer
    row = descs.judge_edge(plan, 0, 0, per_block, source, ids, target, ids, 12)
    assert row["verdict"] == "exact"
    assert (row["count"], row["minimum"]) == (3 * model.num_layers, model.num_layers)


def test_a_read_of_the_neighbouring_head_is_wrong() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    head = edge.source.strides()["heads"]
    listed = edge.spec()
    # The sender holds one head; reading "one head further" leaves the block's head page.
    shifted = [d._replace(src_offset=d.src_offset + head) for d in listed]
    row = edge.judge(shifted)
    assert row["verdict"] == "wrong"
    assert any("[DESC-1.1]" in p for p in row["problems"])


def test_a_read_into_another_requests_block_is_wrong() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    page = edge.target.strides()["blocks"]
    listed = edge.spec()
    moved = [
        d._replace(dst_offset=d.dst_offset + page) if i == 0 else d for i, d in enumerate(listed)
    ]
    row = edge.judge(moved)
    assert row["verdict"] == "wrong"
    assert any("[DESC-1.3]" in p for p in row["problems"])


def test_a_read_that_skips_a_block_is_wrong() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    row = edge.judge(edge.spec()[1:])
    assert row["verdict"] == "wrong"
    assert any("never written" in p for p in row["problems"])


def test_a_whole_last_block_is_whole_blocks_not_exact_and_not_wrong() -> None:
    edge = Edge(6, [5, 2], [1, 6])  # 6 tokens in blocks of 4: 2 slots past the range
    row = edge.judge(edge.spec(range(8)))
    assert row["verdict"] == "whole blocks"
    assert row["problems"] == []


def test_a_whole_last_block_from_another_block_is_wrong() -> None:
    edge = Edge(6, [5, 2], [1, 6])
    page = edge.source.strides()["blocks"]
    listed = edge.spec(range(8))
    last = max(range(len(listed)), key=lambda i: listed[i].dst_offset)
    listed[last] = listed[last]._replace(src_offset=listed[last].src_offset + page)
    assert edge.judge(listed)["verdict"] == "wrong"


def test_unequal_lengths_and_indices_past_a_list_are_reported() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    read, dlists = capture(edge.spec(), edge.src_regions, edge.dst_regions)
    dlists["1"]["rows"][0][1] += 2  # the remote descriptor is longer than the local one
    read["remote_ids"][-1] = len(dlists["1"]["rows"])  # one past the remote list
    posted = descs.posted_read(read, dlists, edge.src_regions, edge.dst_regions)
    assert any("remote bytes into a" in p for p in posted.problems)
    assert any("out of range [DESC-2]" in p for p in posted.problems)


def test_a_descriptor_leaving_its_region_is_reported() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    read, dlists = capture(edge.spec(), edge.src_regions, edge.dst_regions)
    dlists["0"]["rows"][0][0] = DST_BASE - 4  # starts before the receiver's first region
    posted = descs.posted_read(read, dlists, edge.src_regions, edge.dst_regions)
    assert any("local range" in p and "[DESC-2]" in p for p in posted.problems)


def test_a_read_the_plan_has_no_edge_for_is_reported() -> None:
    edge = Edge(8, [5, 2], [1, 6])
    row = descs.judge_edge(
        edge.plan, 2, 0, edge.spec(), edge.source, [5, 2], edge.target, [1, 6], 8
    )
    assert row["verdict"] == "wrong" and not row["in_plan"]
    assert descs.missing_edges(edge.plan, {(0, 0), (1, 0)}) == [[2, 1], [3, 1]]


# -- the harness's bookkeeping ------------------------------------------------------------


def test_requests_get_distinct_blocks_a_fresh_pool_first_and_never_the_null_block() -> None:
    case = vllm_nixl.CASES[0]
    requests = vllm_nixl.requests_for(case, 25)
    for side in ("prefill_blocks", "decode_blocks"):
        first = requests[0][side]
        assert first == list(range(1, len(first) + 1))  # a fresh pool, in order
        every = [b for r in requests for b in r[side]]
        assert len(every) == len(set(every)) and 0 not in every
        assert all(len(r[side]) == -(-r["seq_len"] // case.block_size) for r in requests)
    assert [r["pool"] for r in requests] == ["fresh"] + ["fragmented"] * (len(requests) - 1)


def result(**kw: Any) -> dict[str, Any]:
    base = {
        "transferred": True,
        "verified": True,
        "failed_recving": [],
        "stray_nonzero_elements": 0,
        "requests": [{"untouched": False}, {"untouched": False}],
    }
    return {**base, **kw}


def test_an_outcome_is_moved_refused_or_wrong() -> None:
    ids = {"a", "b"}
    assert vllm_nixl.outcome(result(), ids) == "moved"
    assert vllm_nixl.outcome(result(verified=False), ids) == "wrong"
    refused = {
        "transferred": False,
        "verified": False,
        "failed_recving": ["a", "b"],
        "requests": [{"untouched": True}, {"untouched": True}],
    }
    assert vllm_nixl.outcome(result(**refused), ids) == "refused"
    # A failure that wrote something, or failed only some requests, is not a refusal.
    assert vllm_nixl.outcome(result(**refused, stray_nonzero_elements=3), ids) == "wrong"
    assert vllm_nixl.outcome(result(**{**refused, "failed_recving": ["a"]}), ids) == "wrong"
    partly = {**refused, "requests": [{"untouched": True}, {"untouched": False}]}
    assert vllm_nixl.outcome(result(**partly), ids) == "wrong"


def test_views_of_another_shape_or_with_gaps_are_reported() -> None:
    case = vllm_nixl.Case("t", 2, 2, 2, head_dim=8, block_size=4)
    good = {
        "layout": "LBHNC",
        "shape": [9, 1, 4, 16],
        "strides": [64, 64, 16, 1],
        "registered_addresses": [1, 2],
        "layer_addresses": [1, 2],
    }
    assert vllm_nixl.check_views(case, [good]) == []
    assert vllm_nixl.check_views(case, [{**good, "layout": "LBNHC"}])
    assert vllm_nixl.check_views(case, [{**good, "strides": [128, 64, 16, 1]}])
    assert vllm_nixl.check_views(case, [{**good, "registered_addresses": [1, 3]}])


VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(not VLLM, reason="vllm 0.33.0 is not installed here (make field installs it)")
def test_connector_metadata_crosses_the_pipe_as_vllms_own_classes() -> None:
    import vllm_nixl_rank as rank
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        NixlConnectorMetadata,
        ReqMeta,
    )

    meta = NixlConnectorMetadata()
    meta.add_new_req_to_recv(
        "r",
        ([3, 1],),
        {
            "remote_block_ids": [[7, 2]],
            "remote_engine_id": "p",
            "remote_request_id": "r",
            "remote_host": "127.0.0.1",
            "remote_port": 1,
            "tp_size": 4,
        },
    )
    meta.reqs_to_send = {"s": 1.5}
    back = rank.decode_meta(rank.encode_meta(meta))
    got = back.reqs_to_recv["r"]
    assert isinstance(got, ReqMeta) and got.local_block_ids == ([3, 1],)
    assert got.remote is not None and got.remote.block_ids == ([7, 2],) and got.tp_size == 4
    assert back.reqs_to_send == {"s": 1.5}


# -- the field report's section ----------------------------------------------------------


def case_result(name: str, outcome: str, expected: str, **extra: Any) -> dict[str, Any]:
    return {
        "case": name,
        "prefill_tp": 4,
        "decode_tp": 2,
        "kv_heads": 4,
        "outcome": outcome,
        "expected": expected,
        "elements_verified": 177152,
        "elements_wrong": 0,
        "bytes_verified": 354304,
        "stray_nonzero_elements": 0,
        "reads_by_verdict": {"exact": 1, "whole blocks": 1, "wrong": 0},
        "descriptors_posted": 12,
        "descriptors_minimum": 8,
        "connector_errors": extra.pop("errors", []),
        "reads": [
            {
                "request": "r0",
                "pool": "fresh",
                "seq_len": 96,
                "verdict": "exact",
                "count": 6,
                "minimum": 2,
            },
            {
                "request": "r1",
                "pool": "fragmented",
                "seq_len": 77,
                "verdict": "whole blocks",
                "count": 6,
                "minimum": 6,
            },
        ],
        **extra,
    }


WORKERS = {
    "vllm-nixl": {
        "engine": "vllm-nixl",
        "release": "vllm 0.33.0",
        "cases": [
            case_result("tp4-to-tp2", "moved", "moved"),
            case_result(
                "tp4-to-tp2-heads2",
                "refused",
                "refused",
                errors=["handshake failed: AssertionError"],
            ),
        ],
    }
}


def test_the_report_shows_each_case_its_outcome_and_the_counts_beside_the_minimum() -> None:
    from field.report.workers import unexpected, worker_lines, workers_json

    text = "\n".join(worker_lines(WORKERS))
    assert "## Real connector workers" in text and "### vllm-nixl (vllm 0.33.0)" in text
    assert "| tp4-to-tp2 | TP4 → TP2 | 4 | moved: 177,152 elements (354,304 bytes)" in text
    assert "refused: every request failed, nothing written — handshake failed" in text
    assert "| 1 / 1 / 0 | 12 / 8 |" in text
    assert "| tp4-to-tp2 | r0 | fresh | 96 | 6 | 2 |" in text
    assert unexpected(WORKERS) == []
    assert workers_json(WORKERS)["vllm-nixl"]["cases"]["tp4-to-tp2"]["descriptors_minimum"] == 8
    assert worker_lines({}) == []


def test_a_case_that_ends_otherwise_than_expected_fails_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from field.report import main

    reports = tmp_path / "reports"
    reports.mkdir()
    passed = {
        "check": "PLAN-2/exact-cover",
        "verdict": "passed",
        "examples_tried": 3,
        "outside_declared_domain": 0,
        "reason": "",
        "counterexample": None,
    }
    engine = {
        "adapter": {"name": "vllm-nixl", "version": "vllm 0.33.0"},
        "profile": "ci",
        "device": "cpu",
        "results": [passed],
    }
    (reports / "vllm-nixl.json").write_text(json.dumps(engine))
    (reports / "vllm-nixl.workers.json").write_text(json.dumps(WORKERS["vllm-nixl"]))
    ledger = tmp_path / "defects.json"
    ledger.write_text(json.dumps({"defects": {}}))
    out = tmp_path / "report.md"
    args = ["--reports", str(reports), "--ledger", str(ledger), "--out", str(out)]
    assert main([*args, "--root", str(tmp_path)]) == 0
    assert "## Real connector workers" in out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["workers"]["vllm-nixl"]["cases"]["tp4-to-tp2-heads2"]["outcome"] == "refused"
    wrong = {**WORKERS["vllm-nixl"], "cases": [case_result("tp4-to-tp2", "wrong", "moved")]}
    (reports / "vllm-nixl.workers.json").write_text(json.dumps(wrong))
    assert main([*args, "--root", str(tmp_path)]) == 1
    assert "worker harness: vllm-nixl tp4-to-tp2: wrong, expected moved" in capsys.readouterr().err


def test_a_case_is_verified_only_when_every_element_of_the_decode_caches_is_accounted_for() -> None:
    case = vllm_nixl.Case("t", 2, 2, 2, layers=2, head_dim=8, block_size=4, seq_lens=(8,))
    model, plan = case.model, descs.transfer_plan(2, 2, case.model)
    request = {"id": "t-req0", "seq_len": 8, "pool": "fresh"}
    request.update(prefill_blocks=[1, 2], decode_blocks=[3, 1])
    source, target = (
        descs.registered_cache(vllm_nixl.KVSPEC_LAYOUT, model, num_blocks=6, block_size=4, heads=1)
        for _ in range(2)
    )

    def info(base: int, heads: list[int]) -> dict[str, Any]:
        r = regions(source, base)
        return {
            "layer_addresses": list(r.addresses),
            "layer_bytes": list(r.sizes),
            "num_blocks": 6,
            "heads": heads,
            "backend": "CPU_ATTN",
            "layout": "LBHNC",
        }

    prefill = [info(SRC_BASE + k * (1 << 20), [k]) for k in range(2)]
    decode = [info(DST_BASE + k * (1 << 20), [k]) for k in range(2)]
    verdicts = []
    for k in range(2):
        listed = plan_descriptors(
            plan, plan.edge(k, k), source, [1, 2], target, [3, 1], range(8)
        ).descriptors
        src = descs.Regions(tuple(prefill[k]["layer_addresses"]), tuple(prefill[k]["layer_bytes"]))
        dst = descs.Regions(tuple(decode[k]["layer_addresses"]), tuple(decode[k]["layer_bytes"]))
        read, dlists = capture(list(listed), src, dst)
        read["notif"] = "t-req0:1"
        row = {"id": "t-req0", "elements": 64, "mismatches": 0, "bytes": 128, "tail": "none"}
        verdicts.append(
            {"requests": [row], "stray_nonzero_elements": 0, "reads": [read], "dlists": dlists}
        )
    judged = vllm_nixl.judge(case, [request], prefill, decode, verdicts)
    assert judged["verified"] and judged["plan_edges_not_read"] == []
    assert judged["reads_by_verdict"] == {"exact": 2, "whole blocks": 0, "wrong": 0}
    assert judged["descriptors_posted"] == judged["descriptors_minimum"] > 0
    for broken in ({"mismatches": 1}, {"tail": "other bytes"}):
        verdicts[1]["requests"][0].update(broken)
        assert not vllm_nixl.judge(case, [request], prefill, decode, verdicts)["verified"]
        verdicts[1]["requests"][0].update(mismatches=0, tail="none")
    verdicts[0]["stray_nonzero_elements"] = 2
    assert not vllm_nixl.judge(case, [request], prefill, decode, verdicts)["verified"]
