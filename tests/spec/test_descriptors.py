"""DESC-1..3: byte-range plans carried out on real caches, judged by effect, and minimal."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.memory.cache_layout import PRESETS, layouts_for
from kvspec.memory.descriptors import (
    Descriptor,
    RegisteredCache,
    execute_descriptors,
    judge_descriptors,
    plan_descriptors,
    region_buffers,
    share_positions,
)
from kvspec.memory.paged import blocks_needed, empty_model_cache, gather_request, scatter_request
from kvspec.tensors.dtypes import FP8_DTYPES
from kvspec.tensors.oracle import oracle_kv, oracle_scales
from kvspec.testing.strategies import transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import plan_transfer
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens


def _caches(case, edge, layouts, block_sizes, seq_len, seed):
    model = case.model
    owners = (
        rank_ownership(case.source, model, edge.src),
        rank_ownership(case.target, model, edge.dst),
    )
    out = []
    for layout, block_size, owner, extra in zip(layouts, block_sizes, owners, (1, 2), strict=True):
        needed = blocks_needed(seq_len, block_size)
        cache = empty_model_cache(
            layout,
            model,
            num_blocks=needed + extra,
            block_size=block_size,
            layers=len(owner.layers),
            heads=len(owner.heads),
            scales=oracle_scales(model, layers=owner.layers) if model.dtype in FP8_DTYPES else None,
        )
        ids = torch.randperm(needed + extra, generator=torch.Generator().manual_seed(seed))
        out.append((cache, ids[:needed].tolist(), owner))
    return out


def _bytes(cache) -> list[torch.Tensor]:
    return [b.clone() for b in region_buffers(cache).values()]


@settings(max_examples=40, deadline=None)
@given(
    case=transfer_cases(max_layers=3, max_head_dim=3, max_pp=2),
    data=st.data(),
)
def test_a_plan_moves_the_share_and_nothing_else(case, data) -> None:
    """DESC-1: carried out on caches, the plan writes exactly the edge's heads x layers x
    tokens into the receiver's blocks, bit for bit, whatever the layouts and block sizes."""
    model = case.model
    plan = case.plan()
    edge = data.draw(st.sampled_from(plan.edges))
    layouts = [data.draw(st.sampled_from(layouts_for(model.attention, cross_layer=True)))] * 2
    layouts[1] = data.draw(st.sampled_from(layouts_for(model.attention, cross_layer=True)))
    block_sizes = [1 if lay == "token_major" else data.draw(st.integers(1, 5)) for lay in layouts]
    seq_len = data.draw(st.integers(1, 11))
    start = data.draw(st.integers(0, seq_len - 1))
    _moves_the_share_and_nothing_else(case, edge, layouts, block_sizes, seq_len, start)


NEW_LAYOUTS = (  # issue 33's layouts from the field, each a layout file
    "vllm_packed_lhbnc",
    "vllm_packed_bhlnc",
    "sglang_host_page_head",
    "sglang_host_layer_first",
    "sglang_host_page_first",
    "sglang_host_pf_direct",
    "sglang_host_unified",
    "sglang_page_major",
)
MHA_LAYOUTS = [n for n in layouts_for("mha", cross_layer=True) if n != "token_major"]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (a, b)
        for a, b in itertools.product(MHA_LAYOUTS, MHA_LAYOUTS)
        if a in NEW_LAYOUTS or b in NEW_LAYOUTS
    ],
)
def test_every_pair_with_a_new_layout_moves_the_share_and_nothing_else(
    source: str, target: str
) -> None:
    """DESC-1..3 over the layouts issue 33 added, as sender or receiver of a TP4 -> TP2
    edge that carries one of the receiver's two heads, block sizes 2 and 3, a partial
    last block on both sides."""
    case = TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 4, 2))
    edge = case.plan().edge(3, 1)
    _moves_the_share_and_nothing_else(case, edge, [source, target], [2, 3], 7, 1)


def _moves_the_share_and_nothing_else(case, edge, layouts, block_sizes, seq_len, start) -> None:
    model, plan = case.model, case.plan()
    (src, src_ids, so), (dst, dst_ids, do) = _caches(case, edge, layouts, block_sizes, seq_len, 7)
    scatter_request(
        oracle_kv(model, "r", tokens=seq_len, layers=so.layers, heads=so.heads), src, src_ids
    )
    noise = oracle_kv(model, "noise", tokens=dst.shape.slots, layers=do.layers, heads=do.heads)
    scatter_request(noise, dst, list(range(dst.shape.num_blocks)))
    before = _bytes(dst)
    made = plan_descriptors(
        plan,
        edge,
        RegisteredCache.of(src),
        src_ids,
        RegisteredCache.of(dst),
        dst_ids,
        range(start, seq_len),
    )
    moved = execute_descriptors(made.descriptors, region_buffers(src), region_buffers(dst))
    assert moved == made.share_bytes == edge.bytes_per_token * (seq_len - start)
    got = gather_request(dst, dst_ids, seq_len).data
    want = oracle_kv(model, "r", tokens=seq_len, layers=do.layers, heads=do.heads).data
    h = slice(edge.heads.start - do.heads.start, edge.heads.stop - do.heads.start)
    l_ = slice(edge.layers.start - do.layers.start, edge.layers.stop - do.layers.start)
    assert torch.equal(
        got[l_, :, start:seq_len, h].contiguous().view(torch.uint8),
        want[l_, :, start:seq_len, h].contiguous().view(torch.uint8),
    )
    # Every other byte of the receiver is as it was.
    written = torch.zeros(sum(b.numel() for b in before), dtype=torch.bool)
    offsets, base = {}, 0
    for name, b in zip(region_buffers(dst), before, strict=True):
        offsets[name], base = base, base + b.numel()
    for d in made.descriptors:
        written[
            offsets[d.dst_region] + d.dst_offset : offsets[d.dst_region] + d.dst_offset + d.length
        ] = True
    after = torch.cat(_bytes(dst))
    assert torch.equal(after[~written], torch.cat(before)[~written])
    assert judge_descriptors(list(made.descriptors), made).ok


def _pairs(made) -> list[tuple[str, int, str, int]]:
    """Every byte the list moves, as (src region, src byte, dst region, dst byte)."""
    return sorted(
        (d.src_region, d.src_offset + i, d.dst_region, d.dst_offset + i)
        for d in made.descriptors
        for i in range(d.length)
    )


def test_the_count_is_the_number_of_maximal_runs() -> None:
    """DESC-3: counted byte by byte, the plan has exactly as many ranges as breaks."""
    model = ModelShape(2, 4, 3, dtype="float16")
    plan = plan_transfer(StageLayout(8), StageLayout(2), model)
    for layouts in (
        ("vllm_packed_hnd", "sglang_mha"),
        ("flash_attn", "vllm_packed_nhd"),
        ("vllm_packed_hnd_layers", "trtllm_pool"),
        ("kv_tuple", "kv_tuple"),
    ):
        edge = plan.edges[1]
        (src, sids, _), (dst, dids, _) = _caches(plan_case(plan), edge, layouts, (4, 2), 9, 3)
        made = plan_descriptors(
            plan, edge, RegisteredCache.of(src), sids, RegisteredCache.of(dst), dids, range(9)
        )
        pairs = _pairs(made)
        breaks = 1 + sum(
            not (a[0] == b[0] and a[2] == b[2] and b[1] == a[1] + 1 and b[3] == a[3] + 1)
            for a, b in itertools.pairwise(pairs)
        )
        assert made.count == breaks, layouts


def plan_case(plan):
    return TransferCase(plan.source, plan.target, plan.model, plan.policy)


@pytest.fixture
def packed_to_pool():
    model = ModelShape(2, 4, 2)
    plan = plan_transfer(StageLayout(8), StageLayout(2), model)
    edge = plan.edges[0]
    source = RegisteredCache(PRESETS["vllm_packed_hnd"], 2, 4, 4, 1, 2, "bfloat16")
    target = RegisteredCache(PRESETS["sglang_mha"], 2, 6, 2, 2, 2, "bfloat16")
    made = plan_descriptors(plan, edge, source, [3, 1], target, [5, 0, 2, 4], range(7))
    return plan, edge, source, target, made


def test_the_judge_names_each_wrong_list(packed_to_pool) -> None:
    """DESC-1, DESC-2: a list that overruns, overlaps, misses, writes outside the share or
    from the wrong byte is refused with the values and the obligation."""
    _, _, _, _, made = packed_to_pool
    good = list(made.descriptors)
    first = good[0]
    assert judge_descriptors(good[::-1], made).ok  # order is free
    halves = [
        Descriptor(d.src_region, d.src_offset + a, d.dst_region, d.dst_offset + a, n)
        for d in good
        for a, n in ((0, d.length // 2), (d.length // 2, d.length - d.length // 2))
        if n
    ]
    verdict = judge_descriptors(halves, made)
    assert verdict.ok and verdict.count > verdict.minimum == made.count
    cases = {
        "DESC-1.2": [*good, first],
        "DESC-1.1": good[1:],
        "DESC-2.1": [*good[1:], Descriptor(first.src_region, 10**6, first.dst_region, 0, 4)],
        "DESC-1.3": [*good, Descriptor(first.src_region, 0, "L1.V", 10**3, 2)],
    }
    shifted = Descriptor(
        first.src_region, first.src_offset + 2, first.dst_region, first.dst_offset, first.length
    )
    cases["DESC-1.1 "] = [shifted, *good[1:]]
    for rule, wrong in cases.items():
        verdict = judge_descriptors(wrong, made)
        assert not verdict.ok, rule
        assert any(f"[{rule.strip()}]" in p for p in verdict.problems), (rule, verdict.problems)
    with_bad = judge_descriptors([("L0", 0, "L0.K", 0)], made)
    assert "src region, src offset" in with_bad.problems[0]


def test_a_region_too_small_for_the_block_ids_is_refused(packed_to_pool) -> None:
    """DESC-2.2: refused before any descriptor, naming the ids, the bytes and the region."""
    plan, edge, source, target, _ = packed_to_pool
    # Rows of 2 heads x 2 bfloat16 are 8 bytes; the edge carries head 0, so the last byte
    # it writes is head 0 of row 11 (page 5, slot 1): bytes 88..91.
    short = RegisteredCache.from_dict({**target.to_dict(), "region_bytes": {"L0.K": 90}})
    need = r"block ids \[5, 0, 2, 4\] need bytes up to 92 of region 'L0.K', which is "
    with pytest.raises(ValueError, match=need + r"registered with 90 bytes.*\[DESC-2\]"):
        plan_descriptors(plan, edge, source, [3, 1], short, [5, 0, 2, 4], range(7))
    with pytest.raises(ValueError, match=r"not regions of a sglang_mha cache"):
        RegisteredCache(PRESETS["sglang_mha"], 2, 6, 2, 2, 2, "bfloat16", region_bytes={"L9": 1})
    with pytest.raises(ValueError, match=r"PAGED-3"):
        plan_descriptors(plan, edge, source, [3], target, [5, 0, 2, 4], range(7))


@settings(max_examples=30, deadline=None)
@given(
    case=transfer_cases(
        sizes=(1, 2, 3, 4, 6, 8),
        max_layers=3,
        max_head_dim=3,
        max_pp=2,
        non_dividing=True,
        dp_sizes=(1, 2),
        cp_sizes=(1, 2),
        dcp_sizes=(1, 2),
    ),
    data=st.data(),
)
def test_with_token_shards_each_token_moves_between_its_slots_on_both_ranks(case, data) -> None:
    """DESC-1 with token shards [CP-1, PLAN-6]: each rank's cache holds its own tokens in
    ascending order; the list writes the edge's tokens of the range, each from its slot
    on the sender to its slot on the receiver, bit for bit, and the receiver's other
    tokens keep what they held."""
    model, plan = case.model, case.plan()
    seq_len = case.seq_len if case.sharded else data.draw(st.integers(1, 11))
    edge = data.draw(st.sampled_from(plan.edges))
    start = data.draw(st.integers(0, seq_len - 1))
    so, do = plan.owner("source", edge.src), plan.owner("target", edge.dst)
    held = [Tokens.span(0, seq_len) if o.tokens is None else o.tokens for o in (so, do)]
    layouts = [data.draw(st.sampled_from(layouts_for(model.attention))) for _ in range(2)]
    caches, ids = [], []
    for layout, owner, tokens in zip(layouts, (so, do), held, strict=True):
        block_size = 1 if layout == "token_major" else data.draw(st.integers(1, 4))
        needed = blocks_needed(len(tokens), block_size)
        cache = empty_model_cache(
            layout,
            model,
            num_blocks=needed + 1,
            block_size=block_size,
            layers=len(owner.layers),
            heads=len(owner.heads),
            scales=oracle_scales(model, layers=owner.layers) if model.dtype in FP8_DTYPES else None,
        )
        table = data.draw(st.permutations(range(needed + 1)))[:needed]
        fill = oracle_kv(
            model, f"rank{len(caches)}", tokens=tokens, layers=owner.layers, heads=owner.heads
        )
        scatter_request(fill, cache, table)
        caches.append(cache)
        ids.append(table)
    share = share_positions(plan, edge, range(start, seq_len))
    want_share = held[0].intersect(held[1]).intersect(Tokens.span(start, seq_len))
    assert share.tokens == (
        want_share if edge.tokens is None else want_share.intersect(edge.tokens)
    )
    src_ids = ids[0][: blocks_needed(share.source_slots, caches[0].shape.block_size)]
    dst_ids = ids[1][: blocks_needed(share.target_slots, caches[1].shape.block_size)]
    made = plan_descriptors(
        plan,
        edge,
        RegisteredCache.of(caches[0]),
        src_ids,
        RegisteredCache.of(caches[1]),
        dst_ids,
        range(start, seq_len),
    )
    execute_descriptors(made.descriptors, region_buffers(caches[0]), region_buffers(caches[1]))
    assert made.share_bytes == edge.bytes_per_token * len(share.tokens)
    got = gather_request(caches[1], ids[1], len(held[1])).data
    h = slice(edge.heads.start - do.heads.start, edge.heads.stop - do.heads.start)
    l_ = slice(edge.layers.start - do.layers.start, edge.layers.stop - do.layers.start)
    moved = set(share.tokens.tokens())
    for slot, token in enumerate(held[1].tokens()):
        name = "rank0" if token in moved else "rank1"  # moved from the sender, or kept
        where = Tokens.span(token, token + 1)
        want = oracle_kv(model, name, tokens=where, layers=do.layers, heads=do.heads).data
        assert torch.equal(
            got[l_, :, slot : slot + 1, h].contiguous().view(torch.uint8),
            want[l_, :, :, h].contiguous().view(torch.uint8),
        ), (token, slot)
