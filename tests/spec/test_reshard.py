"""RESHARD-1..3, SLICE-1..3, DTYPE-3: executing a plan on real tensors, on every device."""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.tensors.kv import RequestKV, kv_equal, random_request_kv
from kvspec.tensors.reshard import HEAD_AXIS, receive, reshard, send, shard
from kvspec.tensors.slicing import apply_head_slice
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout

NON_POWER_OF_TWO = TransferCase(StageLayout(6), StageLayout(3), ModelShape(3, 12, 2))
REPLICATED_BOTH_SIDES = TransferCase(
    StageLayout(4), StageLayout(8, 2), ModelShape(4, 2, 3, dtype="float8_e5m2"), "balanced"
)
MLA_WITH_PP = TransferCase(StageLayout(4, 2), StageLayout(8), ModelShape.mla(5, 4))


@given(case=transfer_cases(), seq_len=st.integers(1, 4), seed=st.integers(0, 2**16))
@example(case=NON_POWER_OF_TWO, seq_len=2, seed=0)
@example(case=REPLICATED_BOTH_SIDES, seq_len=3, seed=1)
@example(case=MLA_WITH_PP, seq_len=1, seed=2)
def test_round_trip_in_both_slicing_modes(
    device: str, case: TransferCase, seq_len: int, seed: int
) -> None:
    """RESHARD-2 and SLICE-2: reshard(shard(X, S)) == shard(X, T) bit for bit, both modes."""
    full = random_request_kv(case.model, seq_len, seed=seed, device=device)
    plan = case.plan()
    expected = shard(full, case.target, case.model)
    by_sender = reshard(shard(full, case.source, case.model), plan, slicing="sender")
    by_receiver = reshard(shard(full, case.source, case.model), plan, slicing="receiver")
    results = zip(expected, by_sender, by_receiver, strict=True)
    for rank, (want, got_s, got_r) in enumerate(results):
        assert got_s.device == full.device
        assert kv_equal(got_s, want), f"sender-side slicing, target rank {rank}"
        assert kv_equal(got_r, want), f"receiver-side slicing, target rank {rank}"


@given(case=transfer_cases(), data=st.data())
def test_receive_does_not_depend_on_arrival_order(case: TransferCase, data: st.DataObject) -> None:
    full = random_request_kv(case.model, 2)
    plan = case.plan()
    shards = shard(full, case.source, case.model)
    expected = shard(full, case.target, case.model)
    for dst in case.target.ranks():
        shipments = [s for src in plan.sources_of(dst) for s in send(plan, src, shards[src])]
        shipments = [s for s in shipments if s.edge.dst == dst]
        shuffled = data.draw(st.permutations(shipments))
        assert kv_equal(receive(plan, dst, shuffled), expected[dst])


def test_special_values_survive(device: str) -> None:
    """DTYPE-2: NaN payloads and -0.0 are moved, not normalised."""
    model = ModelShape(2, 4, 2, dtype="float32")
    data = torch.zeros((2, 2, 1, 4, 2), dtype=torch.float32, device=device)
    data.view(torch.int32)[0, 0, 0, 0, 0] = 0x7FC0_1234  # a NaN with a payload
    data[1, 1, 0, 3, 1] = -0.0
    plan = plan_transfer(StageLayout(2), StageLayout(4), model)
    out = reshard(shard(RequestKV(data), StageLayout(2), model), plan, slicing="receiver")
    assert out[0].data.view(torch.int32)[0, 0, 0, 0, 0].item() == 0x7FC0_1234
    assert torch.signbit(out[3].data[1, 1, 0, 0, 1]).item()


def _fan_out_shipments():
    model = ModelShape(2, 4, 2)
    plan = plan_transfer(StageLayout(2), StageLayout(4), model)
    shards = shard(random_request_kv(model, 2), StageLayout(2), model)
    return send(plan, 0, shards[0], slicing="receiver")


def test_a_slice_is_applied_once() -> None:
    """SLICE-3: applying an applied slice again changes nothing."""
    shipment = _fan_out_shipments()[1]
    data = shipment.kv.data
    once, marker = apply_head_slice(data, shipment.marker, my_rank=1, head_axis=HEAD_AXIS)
    twice, marker2 = apply_head_slice(once, marker, my_rank=1, head_axis=HEAD_AXIS)
    assert marker.applied and marker.side == "receiver" and marker2 == marker
    assert twice is once
    assert once.shape[HEAD_AXIS] == data.shape[HEAD_AXIS] // 2


def test_a_payload_for_another_rank_is_refused() -> None:
    """SLICE-3: target_rank 1's shipment offered to rank 0."""
    shipment = _fan_out_shipments()[1]
    with pytest.raises(ValueError, match=r"marked for target rank 1 but arrived at rank 0"):
        apply_head_slice(shipment.kv.data, shipment.marker, my_rank=0, head_axis=HEAD_AXIS)


def test_receive_refuses_what_the_plan_does_not_say() -> None:
    """RESHARD-3: missing, duplicated, foreign and misshapen shipments."""
    model = ModelShape(2, 4, 2)
    full = random_request_kv(model, 2)
    plan = plan_transfer(StageLayout(4), StageLayout(2), model)
    shards = shard(full, StageLayout(4), model)
    to_0 = [send(plan, src, shards[src])[0] for src in (0, 1)]
    with pytest.raises(ValueError, match=r"rank 0 is missing shipments from source ranks \[1\]"):
        receive(plan, 0, to_0[:1])
    with pytest.raises(ValueError, match=r"two shipments from source rank 0"):
        receive(plan, 0, [to_0[0], to_0[0], to_0[1]])
    foreign = send(plan, 2, shards[2])[0]
    with pytest.raises(ValueError, match=r"source rank 2, which is not one of its plan sources"):
        receive(plan, 0, [*to_0, foreign])
    short = replace(to_0[1], kv=RequestKV(to_0[1].kv.data[:1]))
    with pytest.raises(ValueError, match=r"shape \[2, 2, 'seq', 1, 2\].*got \[1, 2, 2, 1, 2\]"):
        receive(plan, 0, [to_0[0], short])
    assert kv_equal(receive(plan, 0, to_0), shard(full, StageLayout(2), model)[0])


def test_fp8_scales_travel_and_must_agree() -> None:
    """DTYPE-3: scales arrive with the data; senders disagreeing on a layer's scale are refused."""
    model = ModelShape(2, 4, 2, dtype="float8_e4m3fn")
    full = random_request_kv(model, 2)
    plan = plan_transfer(StageLayout(4), StageLayout(2), model)
    shards = shard(full, StageLayout(4), model)
    to_0 = [send(plan, src, shards[src])[0] for src in (0, 1)]
    assert kv_equal(receive(plan, 0, to_0), shard(full, StageLayout(2), model)[0])
    wrong = replace(to_0[1], kv=RequestKV(to_0[1].kv.data, to_0[1].kv.scales * 2))
    with pytest.raises(
        ValueError, match=r"source rank 1 sends target rank 0 scales .* \[DTYPE-3\]"
    ):
        receive(plan, 0, [to_0[0], wrong])
    missing = replace(to_0[1], kv=RequestKV(to_0[1].kv.data))
    with pytest.raises(ValueError, match=r"must carry its per-layer K/V scales"):
        receive(plan, 0, [to_0[0], missing])
