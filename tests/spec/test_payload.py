"""PAYLOAD-1..3 and SLICE-3 on payloads: the dict form, shipments, merging, receiver slicing."""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.tensors import reshard
from kvspec.tensors.kv import kv_equal, random_request_kv
from kvspec.tensors.reshard import send, shard
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens
from kvspec.transport.payload import (
    Chunk,
    Payload,
    merge_payloads,
    merge_to_request_kv,
    payload_equal,
    payload_from_shipment,
    shipment_from_payload,
    slice_payload,
)

FP8_REPLICATED = TransferCase(
    StageLayout(4), StageLayout(8, 2), ModelShape(4, 2, 3, dtype="float8_e5m2"), "balanced"
)
MLA_PP = TransferCase(StageLayout(4, 2), StageLayout(8), ModelShape.mla(5, 4))
PP_INTO_TP = TransferCase(StageLayout(2, 2), StageLayout(4), ModelShape(5, 4, 2))


def payloads_of(case: TransferCase, *, seq_len=3, slicing="sender", seed=0, device="cpu"):
    """``{dst: [(src, payload), ...]}`` for one request, and the expected target shards."""
    full = random_request_kv(case.model, seq_len, seed=seed, device=device)
    plan = case.plan()
    shards = shard(full, case.source, case.model)
    inbox = {dst: [] for dst in case.target.ranks()}
    for src, local in enumerate(shards):
        for shipment in send(plan, src, local, slicing=slicing):
            payload = payload_from_shipment(plan, shipment, "req_1", block_ids=(4, 2))
            inbox[shipment.edge.dst].append((src, payload))
    return plan, inbox, shard(full, case.target, case.model)


@given(transfer_cases(), st.sampled_from(["sender", "receiver"]))
@example(FP8_REPLICATED, "receiver")
@example(MLA_PP, "sender")
def test_dict_form_round_trips(case: TransferCase, slicing: str) -> None:
    """PAYLOAD-1: from_dict(to_dict(p)) == p; scales appear exactly for fp8."""
    _, inbox, _ = payloads_of(case, slicing=slicing)
    for pairs in inbox.values():
        for _, payload in pairs:
            data = payload.to_dict()
            assert set(data) == {"request_id", "layer_blocks", "block_ids", "metadata"}
            scaled = {"key_scale", "value_scale"} <= set(data["layer_blocks"])
            assert scaled == (case.model.dtype.startswith("float8"))
            assert data["metadata"]["tp_head_slice"] == payload.head_slice.to_dict()
            assert payload_equal(Payload.from_dict(data), payload)


@given(transfer_cases(), st.sampled_from(["sender", "receiver"]))
def test_a_payload_is_its_shipment(case: TransferCase, slicing: str) -> None:
    """PAYLOAD-2: shipment -> payload -> shipment is the identity; layers are the edge's."""
    plan = case.plan()
    full = random_request_kv(case.model, 2)
    for src, local in enumerate(shard(full, case.source, case.model)):
        for shipment in send(plan, src, local, slicing=slicing):
            payload = payload_from_shipment(plan, shipment, "r")
            assert payload.layers == tuple(shipment.edge.layers)
            back = shipment_from_payload(plan, src, shipment.edge.dst, payload)
            assert back.edge == shipment.edge and back.marker == shipment.marker
            assert kv_equal(back.kv, shipment.kv)


@given(
    case=transfer_cases(),
    slicing=st.sampled_from(["sender", "receiver"]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
@example(case=FP8_REPLICATED, slicing="receiver", seed=1, data=None)
@example(case=MLA_PP, slicing="sender", seed=2, data=None)
@example(case=PP_INTO_TP, slicing="receiver", seed=3, data=None)
def test_merge_gives_the_target_shard_in_any_order(
    device: str, case: TransferCase, slicing: str, seed: int, data
) -> None:
    """PAYLOAD-3: merged payloads equal shard(X, target), whatever the arrival order."""
    plan, inbox, expected = payloads_of(case, slicing=slicing, seed=seed, device=device)
    for dst, pairs in inbox.items():
        arrived = data.draw(st.permutations(pairs)) if data is not None else pairs[::-1]
        merged = merge_payloads(plan, dst, arrived)
        owner = rank_ownership(case.target, case.model, dst)
        assert merged.layers == tuple(owner.layers)
        assert merged.head_slice.applied and merged.head_slice.num_slices == 1
        assert merged.device.type == device
        assert kv_equal(merged.to_request_kv(), expected[dst])
        assert payload_equal(merged, merge_payloads(plan, dst, dict(arrived).items()))


TP8_TO_TP2 = TransferCase(StageLayout(8), StageLayout(2), ModelShape(2, 8, 4))


def _shard_bytes(kv) -> int:
    return kv.data.numel() * kv.data.element_size()


@given(
    case=transfer_cases(),
    slicing=st.sampled_from(["sender", "receiver"]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
@example(case=TP8_TO_TP2, slicing="sender", seed=4, data=None)
@example(case=TP8_TO_TP2, slicing="receiver", seed=5, data=None)
@example(case=FP8_REPLICATED, slicing="receiver", seed=1, data=None)
@example(case=MLA_PP, slicing="sender", seed=2, data=None)
@example(case=PP_INTO_TP, slicing="receiver", seed=3, data=None)
def test_merge_into_a_landing_buffer_gives_the_same_shard(
    case: TransferCase, slicing: str, seed: int, data
) -> None:
    """PAYLOAD-3: several senders' payloads merged into a reused landing buffer (holding
    an older shard's bytes) give bit for bit the shard of the fresh path, in any arrival
    order, in the buffer itself; a buffer too small is not used."""
    plan, inbox, expected = payloads_of(case, slicing=slicing, seed=seed)
    for dst, pairs in inbox.items():
        if not pairs:
            continue
        arrived = data.draw(st.permutations(pairs)) if data is not None else pairs[::-1]
        fresh = merge_to_request_kv(plan, dst, pairs)
        need = _shard_bytes(fresh)
        landing = torch.full((need + 64,), 0xA5, dtype=torch.uint8)  # a stale request's
        landed = merge_to_request_kv(plan, dst, arrived, landing=landing)
        assert kv_equal(landed, fresh) and kv_equal(landed, expected[dst])
        assert landed.data.data_ptr() == landing.data_ptr()
        again = merge_to_request_kv(plan, dst, pairs, landing=landing)  # reused as is
        assert kv_equal(again, expected[dst])
        small = torch.zeros(max(need - 1, 0), dtype=torch.uint8)
        assert kv_equal(merge_to_request_kv(plan, dst, arrived, landing=small), fresh)
        if need:
            assert not small.any()


def test_tp8_to_tp2_lands_every_payload_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """PAYLOAD-3: TP8 -> TP2, four payloads per receiver, each copied once into its heads
    of the landing buffer: receive finds them in place and copies none again (without
    the buffer it places all four)."""
    plan, inbox, expected = payloads_of(TP8_TO_TP2, seq_len=5)
    pairs = inbox[1]
    assert len(pairs) == 4
    placed = []
    copy_bits = reshard.copy_bits
    monkeypatch.setattr(reshard, "copy_bits", lambda t, s: placed.append(s) or copy_bits(t, s))
    assert kv_equal(merge_to_request_kv(plan, 1, pairs), expected[1])
    assert len(placed) == 4
    placed.clear()
    landing = torch.zeros(_shard_bytes(expected[1]), dtype=torch.uint8)
    kv = merge_to_request_kv(plan, 1, pairs, landing=landing)
    assert kv_equal(kv, expected[1]) and kv.data.data_ptr() == landing.data_ptr()
    assert placed == []


GQA = ModelShape(4, 4, 2)
SMALL = ModelShape(2, 2, 2)
SMALL_FP8 = ModelShape(2, 2, 2, dtype="float8_e4m3fn")


def _pair_to_rank_0(model: ModelShape = GQA):
    """TP4 -> TP2: target rank 0 merges the payloads of source ranks 0 and 1."""
    plan, inbox, _ = payloads_of(TransferCase(StageLayout(4), StageLayout(2), model))
    return plan, dict(inbox[0])


def _truncated(p: Payload, seq_len: int) -> Payload:
    cut = lambda values: tuple(None if t is None else t[:seq_len] for t in values)  # noqa: E731
    return replace(p, key_cache=cut(p.key_cache), value_cache=cut(p.value_cache), seq_len=seq_len)


def _without_layer(p: Payload, layer: int) -> Payload:
    drop = lambda values: tuple(None if i == layer else t for i, t in enumerate(values))  # noqa: E731
    return replace(p, key_cache=drop(p.key_cache), value_cache=drop(p.value_cache))


def _as_float16(p: Payload) -> Payload:
    cast = lambda values: tuple(None if t is None else t.to(torch.float16) for t in values)  # noqa: E731
    return replace(p, key_cache=cast(p.key_cache), value_cache=cast(p.value_cache), dtype="float16")


def _one_more_layer(p: Payload) -> Payload:
    return replace(p, key_cache=(*p.key_cache, None), value_cache=(*p.value_cache, None))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda p: replace(p, request_id="req_2"),
            r"disagree on request_id \(source rank 0: 'req_1', source rank 1: 'req_2'\)",
        ),
        (lambda p: _truncated(p, 2), r"disagree on seq_len \(source rank 0: 3, source rank 1: 2\)"),
        (_one_more_layer, r"disagree on num_layers \(source rank 0: 4, source rank 1: 5\)"),
        (_as_float16, r"disagree on dtype \(source rank 0: 'bfloat16', source rank 1: 'float16'\)"),
        (lambda p: replace(p, block_size=32), r"disagree on block_size"),
        (lambda p: replace(p, chunk=Chunk(1, 3, True)), r"disagree on chunk"),
        (
            lambda p: _without_layer(p, 3),
            r"layer 3 is present on the shard of source rank 0 and missing on the shard of "
            r"source rank 1, whose edge to target rank 0 carries layers 0\.\.3 \[PAYLOAD-3\]",
        ),
        (
            lambda p: replace(p, head_slice=replace(p.head_slice, target_rank=1)),
            r"marked for target rank 1 but arrived at rank 0.*\[SLICE-3\]",
        ),
    ],
)
def test_merge_refuses_shards_that_disagree(change, match: str) -> None:
    """PAYLOAD-3: each disagreement is refused, naming both values."""
    plan, by_src = _pair_to_rank_0()
    with pytest.raises(ValueError, match=match):
        merge_payloads(plan, 0, [(0, by_src[0]), (1, change(by_src[1]))])


def _one_more_head(p: Payload) -> Payload:
    grow = lambda values: tuple(None if t is None else torch.cat([t, t[:, :1]], 1) for t in values)  # noqa: E731
    return replace(p, key_cache=grow(p.key_cache), value_cache=grow(p.value_cache))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda p: replace(p, request_id="req_2"),
            r"disagree on request_id \(source rank 0: 'req_1', source rank 1: 'req_2'\)",
        ),
        (_as_float16, r"disagree on dtype \(source rank 0: 'bfloat16', source rank 1: 'float16'\)"),
        (
            lambda p: _without_layer(p, 3),
            r"layer 3 is present on the shard of source rank 0 and missing on the shard of "
            r"source rank 1",
        ),
        (
            lambda p: replace(p, head_slice=replace(p.head_slice, target_rank=1)),
            r"marked for target rank 1 but arrived at rank 0.*\[SLICE-3\]",
        ),
        (
            lambda p: replace(p, head_slice=replace(p.head_slice, tokens=Tokens.span(0, 3))),
            r"source rank 1 to target rank 0 is marked as carrying tokens .*\[SLICE-4\]",
        ),
        (_one_more_head, r"shipment from source rank 1 to target rank 0"),
    ],
)
def test_merge_into_a_landing_buffer_refuses_as_the_fresh_path(change, match: str) -> None:
    """PAYLOAD-3, RESHARD-3: with a landing buffer, bad payloads are refused with the same
    reasons as without one, whichever arrives first."""
    plan, by_src = _pair_to_rank_0()
    landing = torch.zeros(1 << 12, dtype=torch.uint8)
    bad = [(0, by_src[0]), (1, change(by_src[1]))]
    for pairs in (bad, bad[::-1]):
        with pytest.raises(ValueError, match=match):
            merge_to_request_kv(plan, 0, pairs)
        with pytest.raises(ValueError, match=match):
            merge_to_request_kv(plan, 0, pairs, landing=landing)
    with pytest.raises(ValueError, match=r"landing must be a contiguous 1-d uint8 tensor"):
        merge_to_request_kv(plan, 0, by_src.items(), landing=landing.view(torch.int16))


def test_merge_refuses_what_the_plan_does_not_say() -> None:
    """RESHARD-3 through payloads: missing, repeated and foreign senders."""
    plan, by_src = _pair_to_rank_0()
    with pytest.raises(ValueError, match=r"missing shipments from source ranks \[1\]"):
        merge_payloads(plan, 0, [(0, by_src[0])])
    with pytest.raises(ValueError, match=r"two shipments from source rank 0"):
        merge_payloads(plan, 0, [(0, by_src[0]), (0, by_src[0]), (1, by_src[1])])
    with pytest.raises(ValueError, match=r"source rank 2, which is not one of its plan sources"):
        merge_payloads(plan, 0, [(0, by_src[0]), (1, by_src[1]), (2, by_src[1])])


def test_receiver_side_slice_is_applied_once() -> None:
    """SLICE-3: the cut equals the sender's; cutting again returns the same payload."""
    case = TransferCase(StageLayout(2), StageLayout(4), ModelShape(2, 4, 2))
    _, by_receiver, _ = payloads_of(case, slicing="receiver")
    _, by_sender, _ = payloads_of(case, slicing="sender")
    (_, whole), (_, cut_by_sender) = by_receiver[1][0], by_sender[1][0]
    assert whole.heads == 2 and not whole.head_slice.applied
    once = slice_payload(whole, 1)
    assert once.heads == 1 and once.head_slice.side == "receiver"
    assert slice_payload(once, 1) is once
    assert slice_payload(cut_by_sender, 1) is cut_by_sender
    assert kv_equal(once.to_request_kv(), cut_by_sender.to_request_kv())
    for payload in (whole, once):
        with pytest.raises(ValueError, match=r"marked for target rank 1 but arrived at rank 0"):
            slice_payload(payload, 0)


def _dict(model: ModelShape = SMALL, **changes):
    _, by_src = _pair_to_rank_0(model)
    data = by_src[0].to_dict()
    for path, value in changes.items():
        node = data
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is KeyError:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            lambda: {**_dict(), "extra": 1},
            r"payload has missing keys \[\] and unknown keys \['extra'\]",
        ),
        (lambda: _dict(metadata__seq_len=KeyError), r"metadata has missing keys \['seq_len'\]"),
        (
            lambda: _dict(metadata__num_layers=3),
            r"key_cache must be a list of num_layers=3 entries, got 2",
        ),
        (
            lambda: _dict(metadata__seq_len=4),
            r"key_cache\[0\] has shape \[3, 1, 2\]; expected \[seq_len=4",
        ),
        (
            lambda: _dict(metadata__dtype="float16"),
            r"key_cache\[0\] has dtype torch.bfloat16, metadata says float16",
        ),
        (
            lambda: _dict(layer_blocks__key_cache__1=None),
            r"layer 1 has a value_cache but no key_cache",
        ),
        (
            lambda: _dict(layer_blocks__value_cache__1=None),
            r"some present layers carry K and V and others only K",
        ),
        (
            lambda: _dict(
                layer_blocks__key_cache=[None, None], layer_blocks__value_cache=[None, None]
            ),
            r"carries no layer",
        ),
        (
            lambda: _dict(layer_blocks__key_cache__0="zeros"),
            r"key_cache\[0\] must be a tensor or None, got 'zeros'",
        ),
        (lambda: _dict(block_ids=[1, -2]), r"block_ids\[1\] must be >= 0, got -2"),
        (lambda: _dict(request_id=""), r"request_id must be a non-empty string"),
        (
            lambda: _dict(metadata__tp_head_slice__applied=False),
            r"an unapplied slice has side=None",
        ),
        (lambda: _dict(metadata__chunk__final=1), r"chunk final must be a bool, got 1"),
        (
            lambda: _dict(layer_blocks__key_scale=[None, None]),
            r"layer_blocks has missing keys \[\] and unknown keys \['key_scale'\]",
        ),
        (
            lambda: _dict(SMALL_FP8, layer_blocks__value_scale=KeyError),
            r"layer_blocks has missing keys \['value_scale'\]",
        ),
        (
            lambda: _dict(SMALL_FP8, layer_blocks__key_scale__0=None),
            r"key_scale\[0\] must be present exactly where the cache is.*\[DTYPE-3\]",
        ),
        (
            lambda: _dict(SMALL_FP8, layer_blocks__key_scale__0=torch.ones(1)),
            r"key_scale\[0\] must be a 0-d float32 tensor, got torch.float32 \[1\]",
        ),
    ],
)
def test_from_dict_refuses_invalid_payloads(data, match: str) -> None:
    """PAYLOAD-1 and DTYPE-3: each broken rule is named with its values."""
    with pytest.raises(ValueError, match=match):
        Payload.from_dict(data())


def test_with_layers_edits_k_v_and_the_scales_alike() -> None:
    """``Payload.with_layers`` edits the four per-layer tuples the same way, and leaves
    the scales of a model without them absent."""
    for model in (SMALL, SMALL_FP8):
        _, inbox = _pair_to_rank_0(model)
        payload = next(iter(inbox.values()))
        drop = lambda values: tuple(None if i == 1 else t for i, t in enumerate(values))  # noqa: E731
        edited = payload.with_layers(drop)
        assert edited.layers == (0,)
        tuples = ("key_cache", "value_cache", "key_scale", "value_scale")
        for name in tuples:
            before, after = getattr(payload, name), getattr(edited, name)
            if before is None:
                assert after is None, name
            else:
                assert after[1] is None and after[0] is before[0], name
        assert (payload.key_scale is None) == (model is SMALL)
