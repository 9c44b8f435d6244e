"""The suite's inputs reach every declared corner of the domain (issue 44): under the ci
profile every feature of :data:`~kvspec.conformance.input_coverage.DECLARED` is drawn by a
check of its families, and the table fails when a draw stops producing one. The feature
readers are held to hand-written examples first, so a reader that sees nothing cannot make
the coverage test pass."""

from __future__ import annotations

import json

import pytest

from kvspec.cli import main
from kvspec.conformance.adapter import load_adapter
from kvspec.conformance.draws import hybrids
from kvspec.conformance.input_coverage import DECLARED, draw_coverage, features_of
from kvspec.conformance.runner import select_checks


def _pair(source_tp: int, target_tp: int, **extra: object) -> dict[str, object]:
    return {"source": {"tp": source_tp, "pp": 1}, "target": {"tp": target_tp, "pp": 1}, **extra}


@pytest.mark.parametrize(
    ("source", "target", "relation"),
    [
        (8, 2, "fan-in, dividing"),
        (6, 4, "fan-in, non-dividing"),
        (2, 8, "fan-out, dividing"),
        (4, 6, "fan-out, non-dividing"),
        (4, 4, "same TP"),
    ],
)
def test_a_tp_pair_is_read_with_its_relation_and_policy(
    source: int, target: int, relation: str
) -> None:
    found = features_of({"case": _pair(source, target, policy="balanced")})
    assert f"tp pair: {relation}" in found
    assert ("policy x tp pair: balanced, " + relation in found) == (relation != "same TP")


def test_presets_are_read_only_where_a_layout_is_named() -> None:
    found = features_of({"layout": "flash_attn", "target": "vllm_mla", "model": {"name": "mla"}})
    assert {f for f in found if f.startswith("preset")} == {
        "preset: flash_attn",
        "preset: vllm_mla",
    }


def test_a_hybrid_model_gives_the_kinds_its_layers_use() -> None:
    model = {
        "num_layers": 4,
        "num_kv_heads": 1,
        "head_dim": 1,
        "attention": "mha",
        "dtype": "bfloat16",
        "groups": [
            {"kind": "none"},
            {"kind": "gdn", "num_spec": 1},
            {"kind": "mamba2", "num_spec": 0},
            {"kind": "sliding"},  # listed, but no layer uses it
        ],
        "layers": [0, 1, 2, 3],
    }
    found = features_of({"case": {"model": model}})
    kinds = {f for f in found if f.startswith("layer kind")}
    assert kinds == {f"layer kind: {k}" for k in ("full", "none", "gdn", "mamba2")}
    assert "state x speculative rows: gdn, some" in found
    assert "state x speculative rows: mamba2, none" in found
    assert "dtype: bfloat16" in found and "attention: mha" in found


@pytest.mark.parametrize(
    ("events", "sequence"),
    [
        (
            [
                {"ev": "peer_up", "peer": "p", "epoch": 1},
                {"ev": "post", "handle": "h", "peer": "p", "epoch": 1},
                {"ev": "peer_up", "peer": "p", "epoch": 2},
                {"ev": "write", "handle": "h", "epoch": 1},
            ],
            "old-epoch handle after a restart",
        ),
        ([{"ev": "deliver", "request": "r"}, {"ev": "deliver", "request": "r"}], "second delivery"),
        (
            [
                {"ev": "alloc", "request": "r", "blocks": [0]},
                {"ev": "poison", "blocks": [0]},
                {"ev": "abort", "request": "r"},
                {"ev": "release", "request": "r"},
            ],
            "poisoned block released",
        ),
        (
            [{"ev": "abort", "request": "r"}, {"ev": "alloc", "request": "r", "blocks": [1]}],
            "allocation for a closed request",
        ),
        ([{"ev": "post", "handle": "h", "peer": "p", "epoch": 3}], "post from a future epoch"),
    ],
)
def test_event_sequences_are_recognised(events: list[dict[str, object]], sequence: str) -> None:
    found = features_of({"num_blocks": 4, "events": events})
    assert f"event sequence: {sequence}" in found
    others = {f for f in found if f.startswith("event sequence")} - {f"event sequence: {sequence}"}
    assert others == set()


@pytest.fixture(scope="module")
def ci_coverage():  # type: ignore[no-untyped-def]
    return draw_coverage(load_adapter("reference"), profile="ci")


def test_every_declared_feature_is_drawn_under_ci(ci_coverage) -> None:  # type: ignore[no-untyped-def]
    assert [f.name for f in ci_coverage.gaps()] == []
    assert ci_coverage.declared() == list(DECLARED)  # every family drew something


def test_a_feature_that_stops_being_drawn_is_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hybrids drawn without MLP-only layers, as before issue 44: the table names the gap."""
    monkeypatch.setattr(hybrids, "KINDS", tuple(k for k in hybrids.KINDS if k != "none"))
    checks = select_checks(["GROUP-3"])
    coverage = draw_coverage(load_adapter("reference"), profile="ci", checks=checks)
    assert "layer kind: none" in [f.name for f in coverage.gaps()]


def test_the_command_prints_the_table_and_writes_it(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "coverage.json"
    code = main(["conform", "reference", "--coverage", "--clause", "LIFE", "--json", str(out)])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert code == 0 and data["gaps"] == []
    assert "event sequence  (drawn by LIFE)" in printed
    assert {f["feature"].split(":")[0] for f in data["features"]} == {"event", "event sequence"}


def test_the_command_refuses_coverage_with_mutants(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["conform", "--mutants", "--coverage"]) == 2
    assert "--coverage draws inputs only" in capsys.readouterr().err


def test_the_issue_44_gap_features_are_read() -> None:
    """Layout kinds (a split slot axis among them), the side a bound is broken on, facts
    changed together and a merge whose shards share layers, each from its own key."""
    found = features_of(
        {
            "sides": [{"layout": "vllm_nvfp4_hnd"}, {"layout": "vllm_pth_nhd"}],
            "short_side": "sender",
            "together": "num_kv_heads and head_dim, one product",
        }
    )
    assert {f for f in found if f.startswith(("layout kind", "bound", "facts"))} == {
        "layout kind: block-scaled",
        "layout kind: block-scaled, split slot axis",
        "layout kind: record",
        "bound broken on: sender",
        "facts changed together: num_kv_heads and head_dim, one product",
    }
    assert "layout kind: block-scaled, split slot axis" not in features_of(
        {"layout": "vllm_nvfp4_fa2_hnd"}
    )
    model = {"num_layers": 2, "num_kv_heads": 4, "head_dim": 2, "attention": "mha"}
    shared = {"case": _pair(4, 1, model=model), "seq_len": 2, "seed": 0}
    apart = {"case": _pair(4, 4, model=model), "seq_len": 2, "seed": 0}
    name = (
        "merged shards: a receiver whose shards share layers, so one can lack a layer another has"
    )
    assert name in features_of(shared) and name not in features_of(apart)
