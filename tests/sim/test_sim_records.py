"""The sim moves record caches (inline scales, FlashMLA's fp8 record) between every pair of
presets that holds the same information, by push and by pull, TP pairs included, and the
receiver verifies every byte of every field [LAYOUT-6, LAYOUT-7, ORACLE-6, DESC-1]; pairs
of other information are refused, naming the pair and the presets each pairs with."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS, get_layout
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.cli import main as sim_main
from sim.harness.cluster import run_simulation, validate
from sim.run.config import SimConfig
from sim.run.faults import parse_faults
from sim.run.workload import Workload
from tests.strategies import shortest_request

PTH = ModelShape(2, 4, 8, dtype="float8_e4m3fn")
FLASHMLA = ModelShape.mla(2, 576, dtype="float8_e4m3fn")
TP_PAIRS = ((4, 2), (1, 2), (2, 4), (2, 1))


def _model(layout: str) -> ModelShape:
    return FLASHMLA if PRESETS[layout].kv_tensors == 1 else PTH


def _pairs() -> list[tuple[str, str]]:
    """Every ordered pair of presets, one of them a record, whose cells hold the same
    fields for the model that record holds: the pairs the sim must move [LAYOUT-6]."""
    out = []
    for a, spec in PRESETS.items():
        if spec.plain or spec.scaled:  # block-scaled pairs: tests/sim/test_sim_scaled.py
            continue
        model = _model(a)
        want = spec.information(model.dtype, model.head_dim, model.kv_tensors)
        for b, other in PRESETS.items():
            held = other.kv_tensors in (model.kv_tensors, None) and not other.scaled
            if held and other.information(model.dtype, model.head_dim, model.kv_tensors) == want:
                out.append((a, b))
    return out


PAIRS = _pairs()
RUNS = [
    (src, dst, transfer, TP_PAIRS[(2 * i + j) % len(TP_PAIRS)])
    for i, (src, dst) in enumerate(PAIRS)
    for j, transfer in enumerate(("push", "pull"))
]


def test_the_pairs_are_the_record_presets_among_themselves() -> None:
    assert sorted(PAIRS) == sorted(
        [(a, b) for a in ("vllm_pth_hnd", "vllm_pth_nhd") for b in ("vllm_pth_hnd", "vllm_pth_nhd")]
        + [("flashmla_fp8", "flashmla_fp8")]
    )
    assert {(4, 2), (1, 2)} <= {tp for _, _, _, tp in RUNS}


def _config(src: str, dst: str, transfer: str, tp: tuple[int, int], **more) -> SimConfig:
    return SimConfig(
        stages=(StageLayout(tp[0]), StageLayout(tp[1])),
        model=_model(src),
        src_layout=get_layout(src),
        dst_layout=get_layout(dst),
        src_block_size=4,
        dst_block_size=3,  # neither divides the other: partial last blocks both sides
        transfer=transfer,
        requests=3,
        seq_len=(5, 20),
        ports="os",
        timeout=60.0,
        **more,
    )


def _all_verified(report: SimReport) -> None:
    assert report.ok, report.render()
    assert report.verified == report.config.requests
    assert report.edge_bytes == report.planned_bytes, "every field of every cell moved once"


@pytest.mark.parametrize(("src", "dst", "transfer", "tp"), RUNS, ids=str)
def test_record_pairs_move_and_verify(src: str, dst: str, transfer: str, tp) -> None:
    config = _config(src, dst, transfer, tp)
    report = run_simulation(config)
    _all_verified(report)
    # Each receiver got each of its cells once, every field (inline scales included).
    model, target = config.model, config.stages[1]
    cell = sum(f.nbytes(model.dtype, model.head_dim) for f in PRESETS[src].fields(model.kv_tensors))
    heads = sum(len(rank_ownership(target, model, r).heads) for r in target.ranks())
    tokens = sum(r.seq_len for r in Workload(config, 0).requests)
    assert report.bytes_moved == tokens * model.num_layers * heads * cell


def test_damaged_records_are_caught_by_the_oracle() -> None:
    """With the wire's checksums off, corrupted frames reach the cache; the receiver's check
    of every field (scales included) fails exactly the struck requests [ORACLE-6]."""
    report = run_simulation(
        _config(
            "vllm_pth_hnd",
            "vllm_pth_nhd",
            "push",
            (2, 2),
            checksum=False,
            seed=5,
            faults=parse_faults("corrupt=0.5"),
        )
    )
    failed = [o for o in report.outcomes if not o.ok]
    assert failed, "corrupt=0.5 over 3 requests and 2 edges struck something"
    reasons = [" ".join(o.reasons) for o in failed]
    assert any("[ORACLE-6]" in r for r in reasons), report.render()


@pytest.mark.parametrize(
    ("src", "dst", "model", "named"),
    [
        ("vllm_pth_hnd", "vllm_packed_hnd", PTH, ["vllm_pth_hnd, vllm_pth_nhd", "flash_attn"]),
        ("flash_attn", "vllm_pth_nhd", PTH, ["vllm_pth_hnd, vllm_pth_nhd", "vllm_packed_nhd"]),
        ("flashmla_fp8", "vllm_mla", FLASHMLA, ["flashmla_fp8 pairs with flashmla_fp8", "mla"]),
    ],
)
def test_pairs_of_other_information_are_refused_naming_the_pairable(
    src: str, dst: str, model: ModelShape, named: list[str]
) -> None:
    config = SimConfig(
        stages=(StageLayout(2), StageLayout(1)),
        model=model,
        src_layout=get_layout(src),
        dst_layout=get_layout(dst),
    )
    with pytest.raises(ValueError, match=r"do not hold the same information") as caught:
        validate(config)
    message = str(caught.value)
    assert f"{src} -> {dst}" in message and "[LAYOUT-6]" in message
    for name in named:
        assert name in message


def test_cli_moves_an_inline_scale_preset(capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(
        "run --quiet --ports os --source-tp 4 --target-tp 2 --kv-heads 4"
        " --head-dim 16 --dtype float8_e4m3fn --src-layout vllm_pth_hnd"
        " --dst-layout vllm_pth_nhd --requests 2"
    )
    assert sim_main(argv) == 0
    assert "ALL VERIFIED" in capsys.readouterr().out


@st.composite
def record_configs(draw: st.DrawFn) -> SimConfig:
    """Record runs over the domain: any TP pair, PP, token shards, chunks, slicing, push or
    pull, in process [PLAN-1, CP-1, LAYOUT-7, DESC-1]."""
    src, dst = draw(st.sampled_from(PAIRS))
    model = _model(src)
    case = draw(
        transfer_cases(
            sizes=(1, 2, 3, 4),
            max_pp=2,
            max_layers=3,
            non_dividing=True,
            cp_sizes=(1, 2),
            attention=(model.attention,),
            dtypes=(model.dtype,),
        )
    )
    # the record's width: FlashMLA's 576-wide latent, or 4-byte aligned inline scales
    width = 576 if model.attention == "mla" else 4 * draw(st.integers(1, 3))
    case = replace(case, model=replace(case.model, head_dim=width))
    sizes = []
    for stage in (case.source, case.target):  # a block size the stage's token rule fits [CP-2]
        fits = stage.rule.block_sizes() if stage.token_shards > 1 else None
        sizes.append(fits[0] if fits else draw(st.integers(1, 5)))
    shortest = shortest_request(case)
    transfer = draw(st.sampled_from(["push", "pull"]))
    return SimConfig(
        stages=(case.source, case.target),
        model=case.model,
        policy=case.policy,
        src_layout=get_layout(src),
        dst_layout=get_layout(dst),
        src_block_size=sizes[0],
        dst_block_size=sizes[1],
        transfer=transfer,
        slicing=draw(st.sampled_from(["sender", "receiver"])) if transfer == "push" else "sender",
        requests=2,
        seq_len=(shortest, shortest + 9),
        chunks=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 1000)),
        transport="inproc",
        timeout=60.0,
    )


@given(record_configs())
@settings(max_examples=12, deadline=None)
def test_in_process_record_runs_verify_every_field(config: SimConfig) -> None:
    _all_verified(run_simulation(config))
