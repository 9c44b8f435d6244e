"""The whole path: paged layout A, block size a, TP S -> reshard -> paged layout B, block b, TP T.

Every sender fills its own shard from the oracle and every receiver checks its own;
nothing but the shipments travels [ORACLE-4, RESHARD-2, PAGED-4, LAYOUT-2].
"""

from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from kvspec.memory.paged import PagedCache, empty_paged_cache, gather_request, scatter_request
from kvspec.tensors.oracle import oracle_kv, oracle_scales, verify
from kvspec.tensors.reshard import reshard
from kvspec.testing.strategies import PagedSide, paged_sides, transfer_cases
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.stage import StageLayout


@dataclass(frozen=True)
class PagedTransfer:
    """A transfer case, one request, and each stage's cache layout, block size and block ids."""

    case: TransferCase
    request_id: str
    seq_len: int
    sender: PagedSide
    receiver: PagedSide


@st.composite
def paged_transfers(draw: st.DrawFn) -> PagedTransfer:
    case = draw(transfer_cases(sizes=(1, 2, 3, 4, 6, 8), max_layers=4, max_head_dim=3))
    seq_len = draw(st.integers(1, 10))
    side = paged_sides(attention=case.model.attention, seq_len=seq_len)
    return PagedTransfer(case, draw(st.text(max_size=6)), seq_len, draw(side), draw(side))


def rank_cache(
    case: TransferCase, layout: StageLayout, rank: int, side: PagedSide, device: str
) -> PagedCache:
    """The paged cache of one rank: its layers and heads, its stage's layout and block size."""
    model = case.model
    owner = rank_ownership(layout, model, rank)
    return empty_paged_cache(
        side.layout,
        num_layers=len(owner.layers),
        num_blocks=side.num_blocks,
        block_size=side.block_size,
        heads=len(owner.heads),
        head_dim=model.head_dim,
        dtype=model.dtype,
        kv=model.kv_tensors,
        scales=oracle_scales(model, layers=owner.layers),
        device=device,
    )


GQA_TP8_TO_TP2 = PagedTransfer(
    TransferCase(StageLayout(8), StageLayout(2), ModelShape(2, 4, 2, dtype="float8_e4m3fn")),
    "req-0",
    40,
    PagedSide("flash_attn", 16, 5, (4, 0, 2)),
    PagedSide("flashinfer_hnd", 32, 2, (1, 0)),
)
"""Replicated heads at the sender, fp8 scales, and a 16 -> 32 block size change."""

MLA_PP_TO_TOKEN_MAJOR = PagedTransfer(
    TransferCase(StageLayout(2, 2), StageLayout(4), ModelShape.mla(3, 4, dtype="bfloat16")),
    "req_1_x",
    7,
    PagedSide("mla", 3, 4, (3, 1, 0)),
    PagedSide("token_major", 1, 8, (7, 6, 5, 4, 3, 2, 1)),
)
"""MLA's latent from PP2xTP2 into TP4, gathered from blocks of 3 into block size 1."""


@given(transfer=paged_transfers())
@example(transfer=GQA_TP8_TO_TP2)
@example(transfer=MLA_PP_TO_TOKEN_MAJOR)
def test_paged_to_paged_across_layouts_reproduces_the_oracle(
    device: str, transfer: PagedTransfer
) -> None:
    case, rid, seq_len = transfer.case, transfer.request_id, transfer.seq_len
    model, plan = case.model, case.plan()
    shards = []
    for rank in case.source.ranks():
        owner = rank_ownership(case.source, model, rank)
        cache = rank_cache(case, case.source, rank, transfer.sender, device)
        mine = oracle_kv(
            model, rid, tokens=seq_len, layers=owner.layers, heads=owner.heads, device=device
        )
        scatter_request(mine, cache, transfer.sender.block_ids)
        shards.append(gather_request(cache, transfer.sender.block_ids, seq_len))

    for slicing in ("sender", "receiver"):
        for rank, kv in enumerate(reshard(shards, plan, slicing=slicing)):
            owner = rank_ownership(case.target, model, rank)
            cache = rank_cache(case, case.target, rank, transfer.receiver, device)
            scatter_request(kv, cache, transfer.receiver.block_ids)
            received = gather_request(cache, transfer.receiver.block_ids, seq_len)
            verdict = verify(
                received, model, rid, tokens=seq_len, layers=owner.layers, heads=owner.heads
            )
            assert verdict.ok, f"{slicing}-side slicing, target rank {rank}: {verdict.message}"
